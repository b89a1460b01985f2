"""Source ops: graph inputs and parameters (`Placeholder`), constants, and `Fill`.

Source ops have no inputs. A `Placeholder` carries its feed name in the op,
so two inputs of the same type never compare equal (CSE must not merge
them). Constant values are held as `ConstValue` (hashed by content) and are
handed to generated code as arrays, never pasted into source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import ConstValue, Op, TensorType
from .common import check_shape_tuple, checked_dtype


@dataclass(frozen=True)
class Placeholder(Op):
    """A value fed at run time (role `input` or `param`)."""

    feed_name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    kind = "source"
    arity = 0

    def infer(self) -> TensorType:
        return TensorType(check_shape_tuple(self, self.shape), checked_dtype(self, self.dtype))

    def reference(self) -> np.ndarray:
        raise RuntimeError(f"placeholder '{self.feed_name}' must be fed")


@dataclass(frozen=True)
class Constant(Op):
    """A value known when the graph is built."""

    value: ConstValue

    kind = "source"
    arity = 0

    def infer(self) -> TensorType:
        return TensorType(self.value.array.shape, checked_dtype(self, self.value.array.dtype))

    def reference(self) -> np.ndarray:
        return self.value.array.copy()


@dataclass(frozen=True)
class Fill(Op):
    """A tensor of one repeated value (`zeros(shape)` is `Fill(shape, dtype, 0)`).

    The seed's `make_empty_tensor`; a fusing backend keeps it as a scalar.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    value: float = 0.0

    kind = "source"
    arity = 0

    def infer(self) -> TensorType:
        return TensorType(check_shape_tuple(self, self.shape), checked_dtype(self, self.dtype))

    def reference(self) -> np.ndarray:
        return np.full(self.shape, self.value, dtype=self.dtype)
