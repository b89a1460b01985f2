"""Let LLVM vectorise one function's loops with the widest registers the CPU has.

    prefer_wide_vectors()   # first statement of a compiled function

Why it exists. On a CPU with AVX-512, LLVM's X86 backend still vectorises
with 256-bit registers (the tuning of every AVX-512 core since Skylake
server carries `prefer-256-bit`), because a core that runs 512-bit
instructions may lower its clock for a while. That is the right default for
memory-bound loops: they wait on memory either way, and bcast_reduce's fused
kernel ran slower with 512-bit vectors (4.3-4.5 ms against 3.7-3.8, four
alternated processes). It is the wrong one for loops whose work is
arithmetic: layernorm_gelu's kernel evaluates a tanh polynomial and some
thirty other operations per element, and took 9.1 ms on one thread and
5.9 ms on two with 256-bit vectors, 7.7 and 4.8 ms with 512-bit ones.

A compiled function that calls this gets LLVM's `"prefer-vector-width"="512"`
attribute (the one `clang -mprefer-vector-width=512` sets), which the X86
backend reads per function: its loops are vectorised 16 float32 lanes wide
where the CPU has AVX-512, and as before where it does not (the attribute
asks for a preference, not for instructions the CPU lacks). The generated
kernels call it where an element-level loop evaluates a transcendental
(`codegen`), and nowhere else.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic

_ATTRIBUTE = '"prefer-vector-width"="512"'


@intrinsic
def prefer_wide_vectors(typingctx):
    """Mark the function being compiled `"prefer-vector-width"="512"`; emits no code."""

    def codegen(context, builder, signature, args):
        # llvmlite's FunctionAttributes.add accepts LLVM's enum attributes only; a string
        # attribute is rendered as written, so it goes into the underlying set directly.
        set.add(builder.function.attributes, _ATTRIBUTE)
        return context.get_dummy_value()

    return types.none(), codegen
