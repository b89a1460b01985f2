"""The rule table: every op class has a gradient rule or an explicit
non-differentiable mark, registration is checked, and an op without a rule
fails with a clear error at the user's line.
"""

from __future__ import annotations

import inspect
import os

import pytest

import gradcompiler as gc
from gradcompiler.errors import NotDifferentiableError
from gradcompiler.ops import all_op_classes
from gradcompiler.ops.elemwise import Elemwise, StopGradient
from gradcompiler.ops.source import Constant, Fill, Placeholder
from gradcompiler.rules import registry
from gradcompiler.rules.registry import grad_rule, has_rule, is_non_differentiable, rule_of

from helpers import break_elemwise_rule

OP_CLASSES = [c for c in all_op_classes() if not c.__name__.startswith("_")]


@pytest.mark.parametrize("op_class", OP_CLASSES, ids=lambda c: c.__name__)
def test_every_op_has_a_rule_or_is_marked_non_differentiable(op_class):
    assert has_rule(op_class) or is_non_differentiable(op_class), (
        f"{op_class.__name__} has neither a gradient rule nor a non_differentiable mark")


@pytest.mark.parametrize("op_class", OP_CLASSES, ids=lambda c: c.__name__)
def test_no_op_is_both_differentiable_and_marked(op_class):
    assert not (has_rule(op_class) and is_non_differentiable(op_class))


def test_sources_and_stop_gradient_are_marked():
    for op_class in (Placeholder, Constant, Fill, StopGradient):
        assert is_non_differentiable(op_class) and not has_rule(op_class)


def test_elemwise_has_a_seed_rule_and_a_generic_rule():
    assert rule_of(Elemwise) is not None and rule_of(Elemwise, generic=True) is not None
    assert rule_of(Elemwise) is not rule_of(Elemwise, generic=True)


def test_registering_a_second_rule_is_an_error():
    with pytest.raises(ValueError, match="Elemwise already has a rule"):
        grad_rule(Elemwise)(lambda node, g, needs_grad: None)
    with pytest.raises(ValueError, match="already has a generic rule"):
        grad_rule(Elemwise, generic=True)(lambda node, g, needs_grad: None)


def test_op_without_a_rule_fails_at_the_user_line(monkeypatch):
    monkeypatch.delitem(registry._RULES, Elemwise)
    monkeypatch.delitem(registry._GENERIC, Elemwise)
    assert not has_rule(Elemwise)
    with gc.Graph("no_rule") as g:
        x = gc.input("x", (3,))
        line = inspect.currentframe().f_lineno + 1
        y = gc.exp(x).sum()
        with pytest.raises(NotDifferentiableError, match="no gradient rule for Elemwise") as info:
            gc.grad(y, x)
    assert f"{os.path.abspath(__file__)}:{line}" in str(info.value)
    gc.verify(g)


def test_a_rule_that_returns_the_wrong_number_of_gradients_is_caught(monkeypatch):
    monkeypatch.setitem(registry._RULES, Elemwise, lambda node, g, needs_grad: [g, g])
    with gc.Graph("bad_rule") as g:
        x = gc.input("x", (3,))
        with pytest.raises(NotDifferentiableError, match="returned 2 gradients for 1 inputs"):
            gc.grad(gc.exp(x).sum(), x)
    gc.verify(g)


def test_a_rule_that_builds_a_wrongly_shaped_gradient_is_caught(monkeypatch):
    monkeypatch.setitem(registry._RULES, Elemwise, lambda node, g, needs_grad: [g.sum()])
    with gc.Graph("bad_shape") as g:
        x = gc.input("x", (3,))
        with pytest.raises(gc.ShapeError, match=r"gradient of shape \(\) for an input of shape \(3,\)"):
            gc.grad(gc.exp(x).sum(), x)
    gc.verify(g)


def test_check_grads_catches_a_wrong_rule(monkeypatch, rng):
    # the oracle every gradient test relies on must be able to fail: EXP's gradient off by 1%
    break_elemwise_rule(monkeypatch, "EXP", 1.01)
    with gc.Graph("wrong_rule") as g:
        x = gc.input("x", (2, 3), "float64")
        y = gc.exp(x)
        with pytest.raises(AssertionError, match="MISMATCH"):
            gc.check_grads(y, [x], {"x": rng.standard_normal((2, 3))})
    gc.verify(g)


def test_check_grads_order_2_catches_a_wrong_second_derivative(monkeypatch, rng):
    """TANH's rule builds TANH_GRAD(y, g) = g·(1 − y²), a right first derivative; with the rule
    of TANH_GRAD itself 1% off, only the derivative of that backward op is wrong, which
    order 1 cannot see and order 2 must."""
    break_elemwise_rule(monkeypatch, "TANH_GRAD", 1.01)
    with gc.Graph("wrong_second_derivative"):
        x = gc.input("x", (2, 3), "float64")
        y = gc.tanh(x)
        feeds = {"x": rng.standard_normal((2, 3))}
        assert gc.check_grads(y, [x], feeds).ok
        with pytest.raises(AssertionError, match="(?s)order 2.*MISMATCH"):
            gc.check_grads(y, [x], feeds, order=2)
