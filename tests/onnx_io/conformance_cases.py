"""Which of ONNX's backend node tests the conformance run takes, which it excludes and
why, and which op each test is counted under.

A node test belongs to the run when every op of its model is in the op table. Of those,
each excluded case is listed in `EXCLUDED` with its reason beside its pattern (a dtype
this project lacks, a shape that depends on data, an attribute value not implemented);
everything else must pass on the reference interpreter and on the compiled CPU target.
"""

from __future__ import annotations

import re
from functools import cache

from gradcompiler.onnx.op_table import TABLE

_LACKING = "BFLOAT16|FLOAT16|FLOAT8E\\w+|FLOAT4E2M1|U?INT4|U?INT2|STRING"
EXCLUDED: list[tuple[str, str]] = [
    (rf"^test_cast(like)?_(no_saturate_|e8m0_)?({_LACKING})_to_",
     "a source type the project lacks (float16, bfloat16, float8, 4/2-bit, strings)"),
    (rf"^test_cast(like)?_(no_saturate_|e8m0_)?\w+_to_({_LACKING})(_expanded)?$",
     "a target type the project lacks (float16, bfloat16, float8, 4/2-bit, strings)"),
    (r"(bfloat16|float16|fp16)", "float16 / bfloat16 tensors: no float16 arithmetic on the CPU"),
    (r"_string", "string tensors"),
    (r"^test_(not_[234]d|dropout_default_old|dropout_random_old)$",
     "the model's opset is below 13"),
    (r"^test_identity_(opt|sequence)$", "optional and sequence values (tensors only)"),
    (r"^test_training_dropout", "Dropout in training mode draws random masks"),
    (r"^test_div_uint64$", "64-bit integer division (exact through float64 only up to 32 bits)"),
    (r"^test_center_crop_pad_\w+_expanded$",
     "64-bit integer division of data-dependent pad amounts"),
    (r"^test_pow_types_int", "Pow of integer bases (float bases only)"),
    (r"^test_scatter_elements_with_reduction_(max|min|mul)$",
     "ScatterElements reductions other than none and add"),
    (r"^test_einsum_batch_diagonal$", "Einsum diagonals (an index repeated in one operand)"),
    (r"^test_(blackman|hamming|hann)window(_symmetric)?_expanded$",
     "the window length is computed from an input value: a dynamic shape"),
    (r"^test_(averagepool|maxpool|convtranspose)_(1d|3d)",
     "1-d and 3-d convolution and pooling (2-d, NCHW, only)"),
    (r"^test_causal_conv_with_state_", "1-d convolution (2-d, NCHW, only)"),
    (r"^test_(averagepool|maxpool)_2d_dilations$", "pooling dilations (contiguous windows only)"),
    (r"^test_maxpool_with_argmax_", "MaxPool's Indices output"),
]


@cache
def node_cases() -> dict:
    """ONNX's node test cases (built in memory by the onnx wheel), by name."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in load_model_tests(kind="node")}


def model_ops(case) -> set[str]:
    return {node.op_type for node in case.model.graph.node}


@cache
def supported_cases() -> list[str]:
    """The names of the node tests whose ops are all in the table."""
    return sorted(name for name, case in node_cases().items() if model_ops(case) <= set(TABLE))


def exclusion(name: str) -> str | None:
    """Why test `name` is excluded, or None."""
    return next((reason for pattern, reason in EXCLUDED if re.search(pattern, name)), None)


_KEYS = sorted(((op.lower(), op) for op in TABLE), key=lambda k: -len(k[0]))


def op_of(name: str) -> str:
    """The op a test is about: the longest op type whose name starts the test's name
    (test_reduce_sum_square_... is ReduceSumSquare), else its model's first op."""
    bare = name.removeprefix("test_").replace("_", "")
    for key, op in _KEYS:
        if bare.startswith(key):
            return op
    return node_cases()[name].model.graph.node[0].op_type
