"""The on-disk kernel cache: a second process compiles nothing; files are hashed, atomic, clearable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import cache

REPO = Path(__file__).resolve().parents[2]

# Compiles the mlp and layernorm_gelu steps and reports every Numba compilation in the
# process (Numba's "numba:compile" event fires only when the compiler runs, not when
# machine code is loaded from its cache), the kernel dispatchers' own cache counters,
# the cache counters of gradcompiler, and the values.
SCRIPT = """
import json
from numba.core import event
import gradcompiler as gc
from gradcompiler.bench import workloads

result = {"values": []}
with event.install_recorder("numba:compile") as recorder:
    for name in ("mlp", "layernorm_gelu"):
        work = workloads.build(name, "tiny", "float32")
        step = gc.compile(work.outputs)
        result["values"] += [v.tolist() for v in step(**workloads.feeds_for(work))]
        kernels = step._build.distinct
        result.setdefault("dispatcher_hits", 0)
        result.setdefault("dispatcher_misses", 0)
        result["dispatcher_hits"] += sum(sum(k.function.stats.cache_hits.values()) for k in kernels)
        result["dispatcher_misses"] += sum(sum(k.function.stats.cache_misses.values()) for k in kernels)
result["numba_compiles"] = len(recorder.buffer) // 2
result["info"] = gc.cache_info()
print(json.dumps(result))
"""


def _run_process(cache_dir: Path) -> dict:
    env = {**os.environ, cache.CACHE_ENV: str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
    first = _run_process(tmp_path)
    assert first["info"]["kernels_compiled"] > 0 and first["info"]["module_file_misses"] > 0
    assert first["dispatcher_misses"] > 0
    second = _run_process(tmp_path)
    assert second["numba_compiles"] == 0
    assert second["info"]["kernels_compiled"] == 0 and second["dispatcher_misses"] == 0
    assert second["info"]["kernels_loaded"] == first["info"]["kernels_compiled"]
    assert second["dispatcher_hits"] == first["dispatcher_misses"]
    assert second["info"]["module_file_misses"] == 0
    assert second["info"]["module_file_hits"] == first["info"]["module_file_misses"]
    assert second["values"] == first["values"]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    return tmp_path


def test_modules_are_hashed_files_written_once_and_registered(private_cache):
    source = "VALUE = 41 + 1\n"
    module = cache.load_module(source)
    name = cache.module_name(source)
    path = private_cache / f"{name}.py"
    assert module.VALUE == 42 and sys.modules[name] is module and module.__file__ == str(path)
    assert name.startswith("gck_") and all(c in "0123456789abcdef" for c in name[4:])
    assert path.read_text() == source
    assert not list(private_cache.glob(".tmp_*"))
    stamp = path.stat().st_mtime_ns
    del sys.modules[name]
    hits = cache.STATS.module_file_hits
    assert cache.load_module(source).VALUE == 42
    assert cache.STATS.module_file_hits == hits + 1 and path.stat().st_mtime_ns == stamp
    assert cache.module_name(source + " ") != name


def test_cache_info_and_clear_cache(private_cache, rng):
    with gc.Graph():
        x = gc.input("x", (3, 2), "float64")
        y = gc.sum(gc.exp(x) * 3.0, axis=0)
    value = rng.standard_normal((3, 2))
    np.testing.assert_allclose(gc.compile(y)(x=value), (np.exp(value) * 3).sum(0), rtol=1e-12)
    info = gc.cache_info()
    assert info["directory"] == str(private_cache) and info["module_files"] >= 2
    assert list(private_cache.glob("gck_*.py"))
    gc.clear_cache()
    assert not list(private_cache.glob("gck_*.py")) and not (private_cache / "__pycache__").exists()
    assert gc.cache_info()["module_files"] == 0 and gc.cache_info()["kernels_compiled"] == 0
    np.testing.assert_allclose(gc.compile(y)(x=value), (np.exp(value) * 3).sum(0), rtol=1e-12)
