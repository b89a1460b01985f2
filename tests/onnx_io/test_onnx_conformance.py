"""ONNX's backend node tests (onnx.backend.test.BackendTest) through gradcompiler's Backend,
on the reference interpreter and on the compiled CPU target.

Every node test whose ops are all in the op table runs on the reference interpreter; the
compiled target runs a representative subset, one or two cases per op (`CPU_SUBSET`),
unless GRADCOMPILER_ONNX_CONFORMANCE=full (`make onnx-test`), which runs them all there
too (Numba compiles each distinct kernel once, and the full set takes minutes). Excluded
cases are skipped with their reason (tests/onnx_io/conformance_cases.py); the conftest prints the
counts per op. The outputs are checked by onnx's runner against the expected outputs the
onnx wheel ships, with each case's own tolerances.
"""

from __future__ import annotations

import os
import unittest

import onnx.backend.test

from gradcompiler.onnx.backend import backend_for

from conformance_cases import exclusion, op_of, supported_cases

FULL = os.environ.get("GRADCOMPILER_ONNX_CONFORMANCE") == "full"


def cpu_subset() -> set[str]:
    """Per op, its first two cases that are not excluded: every op of the table compiled."""
    chosen: dict[str, list[str]] = {}
    for name in supported_cases():
        if exclusion(name) is None and len(chosen.setdefault(op_of(name), [])) < 2:
            chosen[op_of(name)].append(name)
    return {name for names in chosen.values() for name in names}


def _node_tests(target: str, selected: set[str]) -> type[unittest.TestCase]:
    """BackendTest's node-test class for `target`, holding only the selected cases, the
    excluded ones skipped with their reason."""
    backend_test = onnx.backend.test.BackendTest(backend_for(target), __name__)
    cls = backend_test.test_cases["OnnxBackendNodeModelTest"]
    for attribute in [a for a in vars(cls) if a.startswith("test_")]:
        case = attribute.removesuffix("_cpu")
        if not attribute.endswith("_cpu") or case not in selected:
            delattr(cls, attribute)
        elif (reason := exclusion(case)) is not None:
            setattr(cls, attribute, unittest.skip(reason)(getattr(cls, attribute)))
    return type(f"TestOnnxNodes_{target}", (cls,), {})


TestOnnxNodes_reference = _node_tests("reference", set(supported_cases()))
TestOnnxNodes_cpu = _node_tests("cpu", set(supported_cases()) if FULL else cpu_subset())
