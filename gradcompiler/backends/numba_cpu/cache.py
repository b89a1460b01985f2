"""The on-disk cache of generated modules, and its counters.

Generated source is written to real files in `GRADCOMPILER_CACHE_DIR`
(default `~/.cache/gradcompiler`), because Numba's `cache=True` keys its
compiled code on a function's source file: with a real, unchanging file
beside it, a second process loads the machine code from `__pycache__` and
never runs the Numba compiler. Rules that make that hold:

* the file name is a hash of the source, the Numba version, the CPU the
  code is compiled for, and the source of the modules the kernels inline
  (`mathfuncs`, `rowreduce`; Numba's cache does not track callees), so a
  name never means two different things;
* a file is written once, atomically (temporary file + `os.replace`), and
  never rewritten, so its timestamp (part of Numba's cache key) is stable
  and a concurrent writer cannot leave a torn file;
* the module is registered in `sys.modules` before it executes, which
  Numba's cache locator needs to find it again.

`CacheStats` counts module hits (in this process, or on disk) and misses,
and, per compiled kernel signature, whether Numba loaded it from its cache
or compiled it. `cache_info()` and `clear_cache()` are public as
`gc.cache_info` and `gc.clear_cache`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

CACHE_ENV = "GRADCOMPILER_CACHE_DIR"
_INLINED = ("mathfuncs.py", "mathfuncs_core.py", "rowreduce.py")


@dataclass
class CacheStats:
    modules_in_memory: int = 0  # module already imported by this process
    module_file_hits: int = 0  # module file found on disk
    module_file_misses: int = 0  # module file written by this process
    kernels_loaded: int = 0  # compiled kernels Numba loaded from its on-disk cache
    kernels_compiled: int = 0  # kernels Numba compiled (cache miss)


STATS = CacheStats()


def cache_dir() -> Path:
    """The cache directory (created if missing)."""
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gradcompiler")
    path.mkdir(parents=True, exist_ok=True)
    return path


@lru_cache(maxsize=1)
def _target_tag() -> str:
    """What compiled code depends on besides its own source."""
    import llvmlite.binding as llvm
    import numba

    here = Path(__file__).parent
    inlined = "".join((here / name).read_text() for name in _INLINED if (here / name).exists())
    return "|".join([numba.__version__, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                     hashlib.sha256(inlined.encode()).hexdigest()])


def module_name(source: str) -> str:
    digest = hashlib.sha256(f"{_target_tag()}\n{source}".encode()).hexdigest()
    return f"gck_{digest[:32]}"


def _write_once(path: Path, source: str) -> bool:
    """Write `source` to `path` atomically unless it exists; True if this call wrote it."""
    if path.exists():
        return False
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        if path.exists():
            return False
        os.replace(temp, path)
        return True
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def load_module(source: str) -> ModuleType:
    """The module of generated `source`, from this process, the disk cache, or freshly written."""
    name = module_name(source)
    if name in sys.modules:
        STATS.modules_in_memory += 1
        return sys.modules[name]
    path = cache_dir() / f"{name}.py"
    if _write_once(path, source):
        STATS.module_file_misses += 1
    else:
        STATS.module_file_hits += 1
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def record_compile(dispatcher, signature) -> None:
    """Count whether Numba loaded `signature` of `dispatcher` from its cache or compiled it."""
    if dispatcher.stats.cache_hits.get(signature):
        STATS.kernels_loaded += 1
    else:
        STATS.kernels_compiled += 1


def cache_info() -> dict:
    """The counters of this process and what the cache directory holds."""
    directory = cache_dir()
    return {**asdict(STATS), "directory": str(directory),
            "module_files": sum(1 for _ in directory.glob("gck_*.py"))}


def clear_cache() -> None:
    """Delete every cached module and compiled kernel on disk, and reset the counters.

    Modules already imported by this process stay usable.
    """
    directory = cache_dir()
    for path in directory.glob("gck_*.py"):
        path.unlink(missing_ok=True)
    shutil.rmtree(directory / "__pycache__", ignore_errors=True)
    for field in asdict(STATS):
        setattr(STATS, field, 0)
