"""Cache robustness (issue 8, part 5): the kernel cache is never loaded when corrupt, never
lost, and never in the way.

Every scenario runs in child processes, as a user's next program would: a
populated cache directory is copied, damaged one way, and compiled against.
A child runs one or more *sessions*, each with a chosen cache directory and
none of the previous session's modules or kernels in memory (as a new
process), so one child can try many directories. Each session compiles the
same small graph, checks its values against numpy, and reports the
`CacheWarning`s it saw and `gc.cache_info()`.

Checked: a truncated, garbled or edited module file, a truncated or garbled
Numba index or data file, one flipped bit, a garbled digest record: each is
discarded with a warning and rebuilt (a missing record: rebuilt quietly),
and the rebuilt entry loads cleanly next time; a read-only or uncreatable cache directory;
processes compiling the same graph at the same moment; a Numba upgrade.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys, time, warnings
import numpy as np
import numba
import gradcompiler as gc
from gradcompiler.backends import numba_cpu
from gradcompiler.backends.numba_cpu import cache

def session(directory, numba_version=None):
    '''Compile and run the probe graph with `directory` as the cache, as a new process would.'''
    os.environ[cache.CACHE_ENV] = directory
    numba_cpu._COMPILED.clear()
    for name in [n for n in sys.modules if n.startswith("gck_")]:
        del sys.modules[name]
    for field in vars(cache.STATS):
        setattr(cache.STATS, field, 0)
    if numba_version is not None:
        numba.__version__ = numba_version
        cache._target_tag.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gc.Graph("cache_probe"):
            x = gc.param("x", (4, 3))
            loss = (gc.tanh(x) * 2.0 + 1.0).sum()
            dx = gc.grad(loss, x)
        got_loss, got_dx = gc.compile([loss, dx])(x=X)
    t = np.tanh(X.astype(np.float64))
    ok = bool(np.allclose(got_loss, (2 * t + 1).sum(), rtol=1e-5)
              and np.allclose(got_dx, 2 * (1 - t * t), rtol=1e-5, atol=1e-6))
    return {"ok": ok, "info": gc.cache_info(),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, cache.CacheWarning)]}

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
plan = json.loads(sys.argv[1])
if "go_file" in plan:  # start together with the other children
    open(plan["ready_file"], "w").close()
    while not os.path.exists(plan["go_file"]):
        time.sleep(0.005)
print(json.dumps([session(*s) for s in plan["sessions"]]))
"""


def run_child(*sessions, timeout: float = 300, **plan) -> list[dict]:
    """Run CHILD with `sessions` ((directory, numba_version or None) pairs); their reports."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"sessions": sessions, **plan})],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env["XDG_CACHE_HOME"] = str(_NUMBA_FALLBACK)  # where Numba caches beside a read-only directory
    return env


_NUMBA_FALLBACK = Path("/nonexistent")


@pytest.fixture(scope="module", autouse=True)
def numba_fallback_dir(tmp_path_factory):
    global _NUMBA_FALLBACK
    _NUMBA_FALLBACK = tmp_path_factory.mktemp("numba_user_cache")


# -- what a cache directory holds --------------------------------------------------------------

def module_files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("gck_*.py"))}


def numba_files(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "__pycache__").glob("gck_*") if p.suffix in (".nbi", ".nbc"))


def kernel_module(directory: Path) -> Path:
    """The module file that has compiled kernels beside it (the other one is the driver)."""
    stems = {p.name.split(".")[0] for p in numba_files(directory)}
    (stem,) = stems
    return directory / f"{stem}.py"


def assert_whole(directory: Path, pristine: Path) -> None:
    """Every module file is exactly the pristine one, every digest record matches its files,
    and no temporary file is left behind."""
    assert module_files(directory) == module_files(pristine)
    records = sorted((directory / "__pycache__").glob("gck_*.sha256"))
    assert records
    for record in records:
        stem = record.name.removesuffix(".sha256")
        files = [p for p in numba_files(directory) if p.name.startswith(stem + ".")]
        digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
        assert json.loads(record.read_text()) == digests and digests
    assert not list(directory.rglob(".tmp_*")) and not list(directory.rglob("*.tmp.*"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict]:
    """A cache directory populated by one compile, and that compile's report."""
    directory = tmp_path_factory.mktemp("pristine")
    (report,) = run_child((str(directory), None))
    assert report["ok"] and not report["warnings"]
    assert report["info"]["kernels_compiled"] >= 1 and report["info"]["module_file_misses"] >= 2
    assert len(numba_files(directory)) >= 2
    return directory, report


def copy_of(pristine_dir: Path, where: Path) -> Path:
    shutil.copytree(pristine_dir, where, copy_function=shutil.copy2)  # keep mtimes: Numba keys on them
    return where


# -- corrupt entries ------------------------------------------------------------------------------

def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garble(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 2)


def flip_one_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x10
    path.write_bytes(bytes(data))


def edit_module(path: Path) -> None:
    """Still valid Python, still a kernel, but not the one its name stands for."""
    text = path.read_text()
    edited = text.replace(" + ", " - ", 1)
    assert edited != text
    path.write_text(edited)


def keep_mtime(damage):
    def damaged(path: Path) -> None:
        stamp = path.stat().st_mtime_ns
        damage(path)
        os.utime(path, ns=(stamp, stamp))  # Numba would not notice the change by its timestamp

    damaged.__name__ = damage.__name__
    return damaged


def index_file(directory: Path) -> Path:
    return next(p for p in numba_files(directory) if p.suffix == ".nbi")


def data_file(directory: Path) -> Path:
    return next(p for p in numba_files(directory) if p.suffix == ".nbc")


def digest_record(directory: Path) -> Path:
    return next((directory / "__pycache__").glob("gck_*.sha256"))


CORRUPTIONS = {
    "module-truncated": (kernel_module, keep_mtime(truncate)),
    "module-garbled": (kernel_module, garble),
    "module-edited": (kernel_module, keep_mtime(edit_module)),
    "index-truncated": (index_file, truncate),
    "index-garbled": (index_file, garble),
    "data-truncated": (data_file, truncate),
    "data-one-bit-flipped": (data_file, keep_mtime(flip_one_bit)),
    "digests-garbled": (digest_record, garble),
    "digests-missing": (digest_record, Path.unlink),
}
UNRECORDED = {"digests-missing"}
"""Entries with no digest record (written before records existed, or by a process that died
mid-compile) cannot be verified: they are rebuilt too, but quietly, as nothing is known wrong."""


@pytest.fixture(scope="module")
def corruption_reports(pristine, tmp_path_factory) -> dict[str, tuple[Path, dict, dict]]:
    """For each corruption: its directory, the report of the compile that met it, and the
    report of the next compile (two children in all, one session per directory each)."""
    base = tmp_path_factory.mktemp("corrupt")
    directories = {}
    for name, (pick, damage) in CORRUPTIONS.items():
        directory = copy_of(pristine[0], base / name)
        damage(pick(directory))
        directories[name] = directory
    sessions = [(str(d), None) for d in directories.values()]
    first = run_child(*sessions)
    snapshots = {name: module_files(d) for name, d in directories.items()}
    second = run_child(*sessions)
    return {name: (d, f, s, snapshots[name])
            for (name, d), f, s in zip(directories.items(), first, second)}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_entry_is_discarded_with_a_warning_and_rebuilt(corruption, corruption_reports, pristine):
    directory, met, after, files_after_rebuild = corruption_reports[corruption]
    assert met["ok"], "the damaged entry was used: wrong values"
    if corruption in UNRECORDED:
        assert met["warnings"] == []
    else:
        assert len(met["warnings"]) == 1 and "discarding" in met["warnings"][0], met["warnings"]
    assert met["info"]["kernels_compiled"] == pristine[1]["info"]["kernels_compiled"]  # rebuilt, not loaded
    assert files_after_rebuild == module_files(pristine[0])
    # the rebuilt entry is whole, and the next process loads it without compiling or warning
    assert after["ok"] and after["warnings"] == []
    assert after["info"]["kernels_compiled"] == 0 and after["info"]["kernels_loaded"] >= 1
    assert_whole(directory, pristine[0])


# -- a cache directory that cannot be written ---------------------------------------------------

def make_read_only(directory: Path) -> list[Path]:
    """Make `directory` and everything in it unwritable (also for root: the immutable flag);
    the paths to restore afterwards."""
    paths = [directory, *directory.rglob("*")]
    if os.geteuid() != 0:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        return paths
    done = subprocess.run(["chattr", "+i", *map(str, reversed(paths))], capture_output=True, text=True)
    if done.returncode != 0:  # root ignores mode bits; without chattr nothing is read-only to it
        pytest.skip(f"cannot make a directory read-only as root here: {done.stderr.strip()}")
    return paths


def restore(paths: list[Path]) -> None:
    if os.geteuid() != 0:
        for p in paths:
            p.chmod(0o755 if p.is_dir() else 0o644)
    else:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def test_read_only_and_uncreatable_cache_directories(pristine, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    populated = copy_of(pristine[0], tmp_path / "populated")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    before = {p: p.read_bytes() for p in populated.rglob("*") if p.is_file()}
    locked = make_read_only(empty) + make_read_only(populated)
    try:
        unwritable, loaded, uncreatable = run_child(
            (str(empty), None), (str(populated), None), (str(blocker / "cache"), None))
    finally:
        restore(locked)
    for report in (unwritable, loaded, uncreatable):
        assert report["ok"]
    for report, path in ((unwritable, empty), (uncreatable, blocker / "cache")):
        assert len(report["warnings"]) == 1 and f"{path} cannot be written" in report["warnings"][0]
        assert report["info"]["directory"] != str(path)  # a private stand-in, deleted at exit
        assert not Path(report["info"]["directory"]).exists()
    assert loaded["warnings"] == [] and loaded["info"]["module_file_hits"] >= 2
    assert {p: p.read_bytes() for p in populated.rglob("*") if p.is_file()} == before
    assert list(empty.iterdir()) == []


# -- processes compiling the same graph at the same moment ------------------------------------------

def test_processes_compiling_the_same_graph_at_once_all_succeed(pristine, tmp_path):
    directory = tmp_path / "shared"
    go = tmp_path / "go"
    children = []
    for k in range(3):
        plan = {"sessions": [(str(directory), None)], "ready_file": str(tmp_path / f"ready{k}"),
                "go_file": str(go)}
        children.append(subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(plan)], cwd=REPO,
                                         env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{k}").exists() for k in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    reports = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-4000:]
        reports.append(json.loads(out.strip().splitlines()[-1])[0])
    assert all(r["ok"] and r["warnings"] == [] for r in reports), reports
    # one process compiled each kernel under the lock; the others loaded what it wrote
    assert sum(r["info"]["kernels_compiled"] for r in reports) == pristine[1]["info"]["kernels_compiled"]
    assert_whole(directory, pristine[0])
    (next_one,) = run_child((str(directory), None))
    assert next_one["ok"] and next_one["warnings"] == [] and next_one["info"]["kernels_compiled"] == 0


# -- a Numba upgrade --------------------------------------------------------------------------------

def test_a_numba_upgrade_uses_new_entries_and_keeps_the_old_ones(pristine, tmp_path):
    directory = copy_of(pristine[0], tmp_path / "upgrade")
    old = {p.name: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    upgraded, downgraded = run_child((str(directory), "999.0.0"), (str(directory), None))
    assert upgraded["ok"] and upgraded["warnings"] == []
    assert upgraded["info"]["module_file_hits"] == 0 and upgraded["info"]["kernels_loaded"] == 0
    assert upgraded["info"]["kernels_compiled"] == pristine[1]["info"]["kernels_compiled"]
    now = {p.name: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert {name: now[name] for name in old} == old  # the old version's entries are untouched
    assert set(module_files(directory)) > set(module_files(pristine[0]))
    # going back to the installed Numba finds its own entries, whole
    assert downgraded["ok"] and downgraded["warnings"] == []
    assert downgraded["info"]["kernels_compiled"] == 0 and downgraded["info"]["kernels_loaded"] >= 1
