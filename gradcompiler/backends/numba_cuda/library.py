"""Library kernels of the CUDA backend: one launcher per op that the Kernel IR
names as a library call (matmul, gathers, scatters, warps, concat) and per
reduction.

`cuda_library_kernel(op, input_types, config)` dispatches on the op's class
(`functools.singledispatch`; one module per op family registers its ops,
as PyTensor's Numba dispatch does) and returns a `Launcher`: a callable
`launch(*inputs, out=out, stream=0)` bound to the static input types, with
every piece of index metadata (shapes, strides, batch tables) already on
the device, so an executable uploads it once. Inputs may be numpy arrays
(copied once) or device arrays (used in place); `out` is a device array of
the op's output type. Index values are checked before any kernel reads them.

`run_library_op` is the one-shot form: it allocates the output and returns
it on the host or the device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numba import cuda

from ...ir import Op, TensorType
from ...kernel import SiblingCalls
from .device import LaunchConfig, default_config, host_copy

Launcher = Callable[..., None]


@functools.singledispatch
def cuda_library_kernel(op: Op, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    """The launcher of `op` for inputs of `input_types`."""
    raise NotImplementedError(f"the CUDA backend has no library kernel for {op.describe()}")


@cuda_library_kernel.register
def _sibling_calls(op: SiblingCalls, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    """Each op's own launcher in turn: this backend has no joint kernel (`kernel.SiblingCalls`)."""
    launches = [cuda_library_kernel(o, op.part(k, tuple(input_types)), config) for k, o in enumerate(op.ops)]

    def sibling_calls(*inputs, out, stream=0):
        for k, launch in enumerate(launches):
            launch(*op.part(k, inputs), out=out[k], stream=stream)

    sibling_calls.capturable = all(getattr(launch, "capturable", False) for launch in launches)
    return sibling_calls


def run_library_op(op: Op, *inputs: Any, config: LaunchConfig | None = None, to_host: bool = True,
                   stream: Any = 0) -> Any:
    """Run `op` once on `inputs` (numpy or device arrays); the result on the host or the device."""
    config = config or default_config()
    types = [TensorType(tuple(x.shape), np.dtype(x.dtype)) for x in inputs]
    out_type = op.infer(*types)
    launch = cuda_library_kernel(op, types, config)
    out = cuda.device_array(out_type.shape, out_type.dtype, stream=stream)
    launch(*inputs, out=out, stream=stream)
    return host_copy(out) if to_host else out


from . import (  # noqa: E402,F401  (registrations)
    library_conv,
    library_indexing,
    library_linalg,
    library_reduce,
    library_vision,
)
