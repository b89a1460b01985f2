"""Every op of op-reference.md exists and has a forward test.

"Has a forward test" is checkable: each forward test module in tests/ops
declares `COVERS = {"OpName", ...}`, the op classes whose forward values it
checks against an independent oracle. The set is read from the module's
source (not by importing it), so one broken test module cannot hide the
others' coverage.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gradcompiler.ir import Op
from gradcompiler.ops import all_op_classes

OPS_TESTS = Path(__file__).resolve().parent

# The ops op-reference.md specifies ("Fill" is the seed's zeros / make_empty_tensor).
DOC_OPS = [
    "MatrixMul", "BatchedMatrixMul", "Elemwise", "Reshape", "Broadcast", "ReduceTo", "AddAxis",
    "RemoveAxis", "Transpose", "Subtensor", "SetSubtensor", "IndexingMultiAxisVec",
    "IndexingIncrMultiAxisVec", "IndexingSetMultiAxisVec", "IndexingOneHot", "IndexingSetOneHot",
    "FastpathCopy", "PixelShuffle", "PixelShuffleBackward", "WarpAffine", "WarpPerspective",
    "WarpPerspectiveBackwardData", "WarpPerspectiveBackwardMat", "Concat", "Cast", "Where", "Reduce",
    "Fill", "Constant",
]


def declared_covers(path: Path) -> set[str]:
    """The literal `COVERS = {...}` of a test module, or an empty set."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COVERS" for t in stmt.targets):
            return set(ast.literal_eval(stmt.value))
    return set()


def covered_ops() -> dict[str, list[str]]:
    """Op name -> the tests/ops modules that declare a forward test of it."""
    covered: dict[str, list[str]] = {}
    for path in sorted(OPS_TESTS.glob("test_*.py")):
        for name in declared_covers(path):
            covered.setdefault(name, []).append(path.name)
    return covered


def public_op_names() -> list[str]:
    return [c.__name__ for c in all_op_classes() if not c.__name__.startswith("_")]


def test_every_forward_module_declares_covers():
    modules = sorted(OPS_TESTS.glob("test_*_forward.py"))
    assert modules, "no forward test modules found"
    missing = [p.name for p in modules if not declared_covers(p)]
    assert not missing, f"forward test modules without COVERS: {missing}"


@pytest.mark.parametrize("name", DOC_OPS)
def test_doc_op_is_implemented(name):
    assert name in public_op_names(), f"op-reference.md op {name} is not in gradcompiler.ops.all_op_classes()"


@pytest.mark.parametrize("name", DOC_OPS)
def test_doc_op_has_forward_test(name):
    assert name in covered_ops(), f"no tests/ops/test_*_forward.py module lists {name} in COVERS"


@pytest.mark.parametrize("name", public_op_names())
def test_every_op_class_has_forward_test(name):
    assert name in covered_ops(), f"op class {name} has no forward test (add it to a module's COVERS)"


def test_covers_name_real_op_classes():
    unknown = {name: files for name, files in covered_ops().items() if name not in public_op_names()}
    assert not unknown, f"COVERS lists names that are not op classes: {unknown}"


def test_all_op_classes_lists_concrete_ops_once():
    classes = all_op_classes()
    names = [c.__name__ for c in classes]
    assert names == sorted(set(names))
    assert Op not in classes and all(issubclass(c, Op) for c in classes)
