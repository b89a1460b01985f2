"""ONNX element types and the numpy dtypes this project computes in, both ways.

The project runs bool, integers, float32 and float64 on every target; float16 has no
CPU arithmetic here, and strings, complex, bfloat16, the float8 and 4-bit types have no
support at all, so each of those is refused naming the value that has it.
"""

from __future__ import annotations

import numpy as np

from ..errors import OnnxError

_NAMES = ("FLOAT", "DOUBLE", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
          "UINT64", "BOOL")


def _table() -> dict[int, np.dtype]:
    from onnx import TensorProto, helper

    return {getattr(TensorProto, n): np.dtype(helper.tensor_dtype_to_np_dtype(
        getattr(TensorProto, n))) for n in _NAMES}


def numpy_dtype(elem_type: int, about: str) -> np.dtype:
    """The numpy dtype of ONNX `elem_type`, or an error naming `about` and the type."""
    from onnx import TensorProto

    table = _table()
    if elem_type not in table:
        try:
            name = TensorProto.DataType.Name(elem_type)
        except ValueError:
            name = str(elem_type)
        raise OnnxError(f"{about} has element type {name}, which gradcompiler lacks "
                        f"(supported: {', '.join(_NAMES)})")
    return table[elem_type]


def onnx_elem_type(dtype: np.dtype) -> int:
    """The ONNX element type of a numpy dtype this project computes in."""
    for elem_type, candidate in _table().items():
        if candidate == np.dtype(dtype):
            return elem_type
    raise OnnxError(f"dtype {np.dtype(dtype).name} has no ONNX element type here")
