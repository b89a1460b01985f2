"""gradcompiler: a symbolic gradient compiler.

Build a static graph with a numpy-like API, differentiate it through a
gradient rule table, optimise and fuse it, and run it through Numba on CPU
or CUDA. See README.md for the tour.
"""

import os
from importlib import metadata as _metadata

# Numba's OpenMP threads spin for 10,000 turns of their wait loop (100-200 µs here) after a
# parallel loop, then sleep (why: see gradcompiler/backends/numba_cpu/__init__.py). OpenMP reads
# these once, when the first parallel loop of the process starts its pool, so they are set on
# import, before any Numba code (ours, or a user's) can start that pool; GNU OpenMP's spin count
# overrides the passive policy, which other OpenMP runtimes keep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
# OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) after each threaded product,
# sharing a core with the parallel loop that follows it; 2^20 (about 0.3 ms) still keeps
# them awake between back-to-back products. OpenBLAS reads this when it is loaded, so it
# takes effect only where numpy is imported after gradcompiler (numba_cpu module docstring).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from . import (
    errors,  # noqa: E402,F401
    optim,  # noqa: E402,F401
)
from .api import grad, hessian, hvp, jacobian, jvp, vjp  # noqa: E402,F401
from .compile import cache_info, clear_cache, compile  # noqa: E402,F401,A004
from .custom import custom_gradient  # noqa: E402,F401
from .dot import to_dot  # noqa: E402,F401
from .errors import (  # noqa: F401
    BackendUnavailableError,
    DTypeError,
    FeedError,
    GraphError,
    IndexOutOfRangeError,
    MemoryBudgetError,
    NonFiniteError,
    NotDifferentiableError,
    OutOfBoundsWriteError,
    ShapeError,
)
from .frontend import *  # noqa: F401,F403
from .frontend import Tensor, apply, constant  # noqa: F401
from .gradcheck import check_grads  # noqa: E402,F401
from .ir import Graph, TensorType, verify  # noqa: F401
from .onnx import from_onnx, to_onnx  # noqa: E402,F401
from .reference import evaluate  # noqa: F401
from .training import TrainStep, train_step  # noqa: E402,F401

try:  # the installed distribution's version: pyproject.toml is the one place it is written
    __version__ = _metadata.version("gradcompiler")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"
