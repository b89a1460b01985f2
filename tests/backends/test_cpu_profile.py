"""The CPU profile (backends/numba_cpu/cpu_profile.py) follows Numba's target, not the host.

Each profile is read in a child process, since Numba reads its target settings once: the
vector width LLVM emits for it, the register tile the matrix products take from it, and the
kernel cache's names, which differ between profiles. The AVX2 and x86-64 profiles run on any
x86-64 host (LLVM generates their code whatever the host has).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE, PROFILE_NAMES

X86 = platform.machine().lower() in ("x86_64", "amd64")
NOT_X86 = (f"LLVM generates the AVX2 and x86-64 profiles' code only on an x86-64 host; this one is "
           f"{platform.machine()}, whose own profile the rest of the suite runs")

CHILD = """
import json
import numpy as np
from gradcompiler.backends.numba_cpu import cache, codegen, gemm
from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE
print(json.dumps(dict(cpu=PROFILE.cpu, vector_bytes=PROFILE.vector_bytes, fma=PROFILE.fma, mr=gemm.MR,
                      wide=gemm.WIDE_VECTORS, nr32=gemm.panel_width(np.float32), row_lanes=codegen._VECTOR_LANES,
                      module=cache.module_name("x = 1"), tag=PROFILE.tag)))
"""


def profile_of(environment: dict[str, str]) -> dict:
    """What a child process with `environment` added (and every NUMBA_CPU_* of ours removed) reports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                          env={**env, **environment})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not X86, reason=NOT_X86)
def test_each_profile_sizes_the_tiles_for_the_vectors_llvm_emits():
    """AVX2 (Haswell, with the features its name implies): 32-byte vectors with FMA, the tile of
    16 registers (6 rows, 16 float32 columns); x86-64: 16-byte vectors, no FMA, 6 rows of 8.
    Every one of them names its kernels apart from the others."""
    avx2, baseline = profile_of(PROFILE_NAMES["avx2"]), profile_of(PROFILE_NAMES["x86-64"])
    assert (avx2["cpu"], avx2["vector_bytes"], avx2["fma"]) == ("haswell", 32, True)
    assert (avx2["mr"], avx2["wide"], avx2["nr32"], avx2["row_lanes"]) == (6, 2, 16, 8)
    assert (baseline["cpu"], baseline["vector_bytes"], baseline["fma"]) == ("x86-64", 16, False)
    assert (baseline["mr"], baseline["wide"], baseline["nr32"], baseline["row_lanes"]) == (6, 2, 8, 4)
    native = profile_of({})
    assert len({native["module"], avx2["module"], baseline["module"]}) == 3
    assert len({native["tag"], avx2["tag"], baseline["tag"]}) == 3


@pytest.mark.skipif(not X86, reason=NOT_X86)
def test_a_cpu_name_alone_keeps_the_hosts_features():
    """`NUMBA_CPU_NAME=haswell` without `NUMBA_CPU_FEATURES`: Numba passes the host's features,
    AVX-512 included where the host has it, and the profile says what LLVM then emits."""
    named = profile_of({"NUMBA_CPU_NAME": "haswell"})
    assert named["cpu"] == "haswell"
    assert named["vector_bytes"] == profile_of({})["vector_bytes"]


def test_this_process_profile_is_consistent():
    """The profile of the running process: a vector of 16, 32 or 64 bytes, MR rows that leave
    room in the registers for B's vectors and a broadcast, and a description for reports."""
    assert PROFILE.vector_bytes in (16, 32, 64)
    assert PROFILE.mr * 2 + 3 <= PROFILE.vector_registers
    assert PROFILE.mr * PROFILE.wide_vectors + PROFILE.wide_vectors + 1 <= PROFILE.vector_registers
    assert f"{8 * PROFILE.vector_bytes}-bit" in PROFILE.describe()


CACHE_CHILD = """
import json
import numpy as np
import gradcompiler as gc
with gc.Graph():
    x = gc.input("x", (64, 48))
    y = gc.sum(gc.tanh(x) * x, axis=1)
x_value = np.linspace(-2.0, 2.0, 64 * 48, dtype=np.float32).reshape(64, 48)
got = gc.compile(y)(x=x_value)
want = (np.tanh(x_value.astype(np.float64)) * x_value).sum(axis=1)
info = gc.cache_info()
print(json.dumps(dict(error=float(np.max(np.abs(got - want))), compiled=info["kernels_compiled"],
                      loaded=info["kernels_loaded"], hits=info["module_file_hits"])))
"""


@pytest.mark.skipif(not X86, reason=NOT_X86)
def test_a_cache_written_for_another_profile_is_not_used(tmp_path):
    """One cache directory, shared as a copied cache would be: a kernel compiled for the AVX2
    profile is loaded by the next AVX2 process and compiled anew, never loaded, by a process
    of the host's profile; every process's value equals float64 numpy."""
    def run(environment):
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
        env.update(environment, GRADCOMPILER_CACHE_DIR=str(tmp_path))
        done = subprocess.run([sys.executable, "-c", CACHE_CHILD], capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.splitlines()[-1])
        assert report["error"] < 1e-4
        return report

    first = run(PROFILE_NAMES["avx2"])
    assert first["compiled"] >= 1 and first["hits"] == 0
    again = run(PROFILE_NAMES["avx2"])
    assert again["compiled"] == 0 and again["loaded"] >= 1
    native = run({})
    assert native["compiled"] >= 1 and native["hits"] == 0
