"""The on-disk cache of generated modules, and its counters.

Generated source is written to real files in `GRADCOMPILER_CACHE_DIR`
(default `~/.cache/gradcompiler`), because Numba's `cache=True` keys its
compiled code on a function's source file: with a real, unchanging file
beside it, a second process loads the machine code from `__pycache__` and
never runs the Numba compiler. Rules that make that hold:

* the file name is a hash of the source, the Numba version, the CPU
  profile the code is compiled for (`cpu_profile`: a cache copied to a
  machine of another instruction set is never used there), and the source of the modules the kernels import
  (`_INLINED`: Numba's cache does not track callees), so a
  name never means two different things;
* a file is written once, atomically (temporary file + `os.replace`), and
  never rewritten, so its timestamp (part of Numba's cache key) is stable
  and a concurrent writer cannot leave a torn file;
* the module is registered in `sys.modules` before it executes, which
  Numba's cache locator needs to find it again.

A cache entry is never trusted blindly. A module file is used only if its
text is exactly the source its name stands for; Numba's index and data
files of a module are used only if they match the SHA-256 digests recorded
(`<module>.sha256`, beside them) when this library had Numba write them,
under a per-module file lock, so two processes compiling the same kernel
take turns and the second one loads what the first wrote. An entry that
fails either check (truncated, corrupted, edited) is deleted and rebuilt
with a `CacheWarning`; one with no record at all (written before records
existed, or by a process that died mid-compile) is rebuilt quietly. A cache directory that cannot be
written is replaced, with a `CacheWarning`, by a private temporary one:
compilation works, only the caching is lost.

`CacheStats` counts module hits (in this process, or on disk) and misses,
and, per compiled kernel signature, whether Numba loaded it from its cache
or compiled it; `disk_usage()` what the directory holds, which `gradcompiler cache
info` shows (a fresh process has no counters). `cache_info()` and `clear_cache()` are public as
`gc.cache_info` and `gc.clear_cache`.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

try:
    import fcntl
except ImportError:  # not POSIX: no lock, concurrent compiles of one kernel may both compile it
    fcntl = None

CACHE_ENV = "GRADCOMPILER_CACHE_DIR"
_INLINED = ("mathfuncs.py", "mathfuncs_core.py", "rowreduce.py", "row_blocks.py", "prefetch.py", "vector_width.py",
            "alias_scopes.py")


@dataclass
class CacheStats:
    modules_in_memory: int = 0  # module already imported by this process
    module_file_hits: int = 0  # module file found on disk
    module_file_misses: int = 0  # module file written by this process
    kernels_loaded: int = 0  # compiled kernels Numba loaded from its on-disk cache
    kernels_compiled: int = 0  # kernels Numba compiled (cache miss)


STATS = CacheStats()


class CacheWarning(UserWarning):
    """The kernel cache could not be used as it was: a corrupt entry was discarded and rebuilt,
    or the directory cannot be written. Compilation goes on; only caching is affected."""


_PRIVATE_DIRS: dict[Path, Path] = {}


def cache_dir() -> Path:
    """The cache directory (created if missing), or its private stand-in if it cannot be written."""
    path = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gradcompiler")
    if path in _PRIVATE_DIRS:
        return _PRIVATE_DIRS[path]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return _private_dir(path, err)
    return path


def _private_dir(path: Path, err: OSError) -> Path:
    """A temporary directory of this process standing in for the unwritable `path` (deleted at exit)."""
    if path not in _PRIVATE_DIRS:
        warnings.warn(f"the kernel cache directory {path} cannot be written ({err.strerror or err}); "
                      "kernels are compiled into a private temporary directory and not kept",
                      CacheWarning, stacklevel=3)
        private = Path(tempfile.mkdtemp(prefix="gradcompiler-cache-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        _PRIVATE_DIRS[path] = private
    return _PRIVATE_DIRS[path]


@lru_cache(maxsize=1)
def _target_tag() -> str:
    """What compiled code depends on besides its own source."""
    import numba

    from .cpu_profile import PROFILE

    here = Path(__file__).parent
    inlined = "".join((here / name).read_text() for name in _INLINED if (here / name).exists())
    return "|".join([numba.__version__, PROFILE.cpu, PROFILE.features, PROFILE.tag,
                     hashlib.sha256(inlined.encode()).hexdigest()])


def module_name(source: str) -> str:
    digest = hashlib.sha256(f"{_target_tag()}\n{source}".encode()).hexdigest()
    return f"gck_{digest[:32]}"


def _write_once(path: Path, source: str) -> bool:
    """Write `source` to `path` atomically unless it exists; True if this call wrote it.

    The complete temporary file is hard-linked into place, which fails if another process
    got there first: a file, once there, is never replaced (its timestamp keys Numba's cache).
    """
    if path.exists():
        return False
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: replace, unless another writer won
            if path.exists():
                return False
            os.replace(temp, path)
        return True
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def _read(path: Path) -> str | None:
    """The text of `path` (undecodable bytes replaced), or None if it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _discard(directory: Path, name: str, why: str) -> None:
    """Delete module `name`'s file and its files in Numba's cache beside it, with a warning."""
    warnings.warn(f"discarding the kernel cache entry {name} in {directory}: {why}; rebuilding it",
                  CacheWarning, stacklevel=4)
    for path in [directory / f"{name}.py", *(directory / "__pycache__").glob(f"{name}.*")]:
        try:
            path.unlink(missing_ok=True)
        except OSError:  # a read-only directory: the caller writes elsewhere
            pass


def _module_file(name: str, source: str) -> Path:
    """A file that holds exactly `source`: the cached one if it is whole, else one written now."""
    directory = cache_dir()
    path = directory / f"{name}.py"
    found = _read(path)
    if found is not None and found != source:
        _discard(directory, name, "the file does not hold the source its name stands for")
    try:
        wrote = _write_once(path, source)
    except OSError as err:
        path = _private_dir(directory, err) / f"{name}.py"
        wrote = _write_once(path, source)
    if _read(path) != source:  # the bad file could not be removed
        path = _private_dir(directory, PermissionError(errno.EACCES, "a corrupt entry cannot be removed"))
        path = path / f"{name}.py"
        wrote = _write_once(path, source)
    if wrote:
        STATS.module_file_misses += 1
    else:
        STATS.module_file_hits += 1
    return path


def load_module(source: str) -> ModuleType:
    """The module of generated `source`, from this process, the disk cache, or freshly written."""
    name = module_name(source)
    if name in sys.modules:
        STATS.modules_in_memory += 1
        return sys.modules[name]
    path = _module_file(name, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _numba_files(directory: Path, name: str) -> list[Path]:
    """Numba's index and data files of module `name` (`<name>.<function>-<line>.pyXY.nbi/.nbc`)."""
    return sorted(p for p in directory.glob(f"{name}.*") if p.suffix in (".nbi", ".nbc"))


def _digests(files: list[Path]) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _recorded_digests(manifest: Path) -> dict | None:
    try:
        return json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def numba_entry(dispatcher, name: str):
    """Around `dispatcher.compile(...)` of module `name`: hold the module's lock, discard its
    entry in Numba's cache unless it matches the digests recorded when it was written (so a
    corrupt entry is never loaded), and record the digests of what is there afterwards."""
    location = getattr(getattr(dispatcher, "_cache", None), "_cache_path", None)
    if location is None:  # Numba does not cache this function
        yield
        return
    directory = Path(location)
    manifest = directory / f"{name}.sha256"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{name}.lock", "a")
    except OSError:  # Numba cannot write there either
        yield
        return
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        files = _numba_files(directory, name)
        recorded = _recorded_digests(manifest)
        if files and recorded != _digests(files):
            if recorded is not None or manifest.exists():  # no record at all: written before records were
                warnings.warn(f"discarding the compiled-kernel cache entry of {name} in {directory}: its "
                              "files do not match the digests recorded when they were written; recompiling",
                              CacheWarning, stacklevel=3)
            for path in files:
                path.unlink(missing_ok=True)
        yield
        written = _digests(_numba_files(directory, name))
        if written != recorded:
            fd, temp = tempfile.mkstemp(dir=directory, prefix=".tmp_")
            with os.fdopen(fd, "w") as f:
                json.dump(written, f)
            os.replace(temp, manifest)


def record_compile(dispatcher, signature) -> None:
    """Count whether Numba loaded `signature` of `dispatcher` from its cache or compiled it."""
    if dispatcher.stats.cache_hits.get(signature):
        STATS.kernels_loaded += 1
    else:
        STATS.kernels_compiled += 1


def cache_info() -> dict:
    """The counters of this process and what the cache directory holds (`disk_usage`)."""
    directory = cache_dir()
    return {**asdict(STATS), "directory": str(directory), **disk_usage(directory)}


def disk_usage(directory: Path) -> dict:
    """What `directory` holds on disk, the same in every process (unlike the counters):
    generated modules, Numba's compiled-kernel files, every file (records and locks too)
    and their total size in bytes."""
    modules = kernels = files = size = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile by another process
                continue
            files += 1
            modules += root == str(directory) and name.startswith("gck_") and name.endswith(".py")
            kernels += name.endswith((".nbi", ".nbc"))
    return {"module_files": modules, "kernel_files": kernels, "files": files, "bytes": size}


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
