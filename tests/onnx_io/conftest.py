"""Counts per op of the ONNX conformance run (passed, failed, excluded), per target,
printed at the end of the session; GRADCOMPILER_ONNX_COUNTS=path also writes them as JSON."""

from __future__ import annotations

import json
import os
from collections import defaultdict

_COUNTS: dict[str, dict[str, dict[str, int]]] = defaultdict(
    lambda: defaultdict(lambda: {"passed": 0, "failed": 0, "excluded": 0}))


def pytest_runtest_logreport(report):
    if "TestOnnxNodes_" not in report.nodeid:
        return
    from conformance_cases import op_of

    target = report.nodeid.split("TestOnnxNodes_")[1].split("::")[0]
    case = report.nodeid.rsplit("::", 1)[1].removesuffix("_cpu")
    counts = _COUNTS[target][op_of(case)]
    if report.skipped:
        counts["excluded"] += 1
    elif report.when == "call":
        counts["passed" if report.passed else "failed"] += 1
    elif report.failed:
        counts["failed"] += 1


def pytest_terminal_summary(terminalreporter):
    if not _COUNTS:
        return
    write = terminalreporter.write_line
    targets = sorted(_COUNTS)
    write("ONNX node tests per op (passed/failed/excluded): " + ", ".join(targets))
    for op in sorted({op for t in targets for op in _COUNTS[t]}):
        cells = ["{passed}/{failed}/{excluded}".format(**_COUNTS[t][op]) if op in _COUNTS[t]
                 else "-" for t in targets]
        write(f"  {op:28s} " + "  ".join(f"{c:>10s}" for c in cells))
    for t in targets:
        total = {k: sum(c[k] for c in _COUNTS[t].values()) for k in ("passed", "failed",
                                                                      "excluded")}
        write(f"  total {t}: {total}")
    path = os.environ.get("GRADCOMPILER_ONNX_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump(_COUNTS, f, indent=1, sort_keys=True)
