"""The benchmark of docs/benchmarks.md: workloads, their peers, the suite, its reports.

    workloads.py  the seven workloads as graph builders (full and tiny sizes)
    manual.py     each step written by hand in numpy: a peer and the oracle
    peers.py      numpy_manual, torch_eager, torch_compile, jax_jit (where installed)
    machine.py    memory bandwidth and SGEMM limits of this machine
    suite.py      run_suite(...) and the command-line entry points
    first_call.py cold/warm first-call latency, one fresh process per measurement
    report.py     the result document's fields; JSON, Markdown and PNG writers
"""

from .suite import run_suite  # noqa: F401
