"""The CPU the compiled code is generated for, decided once: `PROFILE`.

    from .cpu_profile import PROFILE
    PROFILE.vector_bytes, PROFILE.mr, PROFILE.lanes(np.float32), PROFILE.tag

Every choice in Python that depends on the CPU (the width of the vectors an
intrinsic writes its IR in, the rows of the matrix products' register tile,
the routing bounds derived from them, the kernel cache's key) reads this
profile, never the host's feature list: Numba may be asked to generate code
for another CPU than the one it runs on (`NUMBA_CPU_NAME`, `NUMBA_CPU_FEATURES`,
`NUMBA_ENABLE_AVX`), and a tile shape chosen for AVX-512 while LLVM emits
AVX2 (or the reverse) would size scratch buffers for one and write them as
the other.

The profile is what Numba's JIT codegen uses: its CPU name (`NUMBA_CPU_NAME`,
else the host's) and feature string (`NUMBA_CPU_FEATURES`, else the host's
features). What those give is asked of LLVM itself: a probe function of one
64-byte vector fused multiply-add is compiled to assembly for that target, and
the widest registers it names (zmm, ymm or xmm on x86; 128-bit NEON elsewhere)
give the vector width, its instructions whether there is a fused multiply-add.
So `NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=` (an AVX2 machine, run on any
x86-64 host) and `NUMBA_CPU_NAME=x86-64 NUMBA_CPU_FEATURES=` (SSE2 only) give
their own profiles. Note that `NUMBA_CPU_NAME=haswell` alone keeps the host's
features, AVX-512 included, as Numba does.

Only portable LLVM is emitted from the profile's figures: plain vector loads,
stores and shuffles, `llvm.fma` (a library call where the CPU has none) and
`llvm.prefetch`; LLVM lowers each for whatever target it is given.
"""

from __future__ import annotations

import hashlib
import platform
import re
from dataclasses import dataclass
from functools import cached_property

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba.core import config
from numba.core.codegen import get_host_cpu_features, initialize_llvm

PROFILE_NAMES = {
    "avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""},
    "x86-64": {"NUMBA_CPU_NAME": "x86-64", "NUMBA_CPU_FEATURES": ""},
}
"""The environments of the profiles the kernel tests also run under on an x86-64 host, besides
the host's own: an AVX2 machine's (Haswell and later, Zen 1-3) and the baseline x86-64 (SSE2)."""


@dataclass(frozen=True)
class CpuProfile:
    """What the compiled code may use: `cpu` and `features` as Numba passes them to LLVM, and
    what LLVM emits for them (`vector_bytes`, `fma`), with the tile shapes derived from it."""

    cpu: str
    features: str
    arch: str
    vector_bytes: int
    fma: bool

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 or on AArch64, 16 on other x86."""
        return 32 if self.vector_bytes == 64 or not self.arch.startswith(("x86", "i686", "amd64")) else 16

    def lanes(self, dtype) -> int:
        """Values of `dtype` in one vector."""
        return self.vector_bytes // np.dtype(dtype).itemsize

    @property
    def mr(self) -> int:
        """Rows of the products' register tile (`gemm`): its MR × 2 accumulators, two vectors of B
        and a broadcast within the registers: 8 rows of 32 registers, 6 of 16."""
        return 8 if self.vector_registers >= 32 else 6

    @property
    def wide_vectors(self) -> int:
        """Vectors across the wide summed tile (`gemm.micro_tile_sum_wide`): MR × 3 accumulators
        fit 32 registers (8 × 3 + 3 + 1 = 28), not 16 (then it is the plain tile's 2)."""
        return 3 if self.vector_registers >= 32 else 2

    @cached_property
    def tag(self) -> str:
        """A short key of the profile for cache names: code built for one profile is never
        loaded for another."""
        text = "|".join([self.arch, self.cpu, self.features, str(self.vector_bytes), str(self.fma)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for reports: the CPU, the vectors and the fused multiply-add."""
        fma = "FMA" if self.fma else "no FMA"
        return f"{self.cpu} ({self.arch}), {8 * self.vector_bytes}-bit vectors, {fma}"


def _probe_assembly(cpu: str, features: str) -> str:
    """The assembly LLVM emits for this target from one fused multiply-add of 64-byte vectors."""
    initialize_llvm()
    module = ir.Module(name="gradcompiler_cpu_probe")
    module.triple = llvm.get_process_triple()
    vector = ir.VectorType(ir.FloatType(), 16)
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [vector.as_pointer()] * 2), name="probe")
    fma = ir.Function(module, ir.FunctionType(vector, [vector] * 3), name="llvm.fma.v16f32")
    builder = ir.IRBuilder(function.append_basic_block())
    a, b = (builder.load(p, align=4) for p in function.args)
    builder.store(builder.call(fma, [a, b, b]), function.args[0], align=4)
    builder.ret_void()
    parsed = llvm.parse_assembly(str(module))
    target = llvm.Target.from_triple(module.triple)
    machine = target.create_target_machine(cpu=cpu, features=features, opt=2)
    return machine.emit_assembly(parsed)


def detect() -> CpuProfile:
    """The profile of Numba's JIT target in this process (module docstring)."""
    cpu = config.CPU_NAME or llvm.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    arch = platform.machine().lower()
    asm = _probe_assembly(cpu, features)
    if re.search(r"%zmm|\bzmm", asm):
        width = 64
    elif re.search(r"%ymm|\bymm", asm):
        width = 32
    else:
        width = 16
    fma = bool(re.search(r"vfmadd|vfmsub|\bfmla\b|\bfmadd\b|xvmadd", asm))
    return CpuProfile(cpu=cpu, features=features, arch=arch, vector_bytes=width, fma=fma)


PROFILE = detect()
