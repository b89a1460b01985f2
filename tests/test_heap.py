"""The collector is paused while compiling and differentiating, and only then."""

import gc

import gradcompiler as gc_
from gradcompiler.bench import workloads
from gradcompiler.heap import collector_paused


def test_the_pause_nests_and_restores_the_collector():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_pause_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_grad_and_compile_resume_the_collector():
    w = workloads.build("bcast_reduce", "tiny")  # builds with gc.grad
    assert gc.isenabled()
    step = gc_.compile(w.outputs)
    assert gc.isenabled()
    assert len(step.kernels) == 1
