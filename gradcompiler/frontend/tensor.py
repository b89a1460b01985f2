"""The symbolic `Tensor` handle and `apply`, the one door into the graph.

A `Tensor` is a (graph, node id) pair with numpy-like operator overloads;
it holds no data. `apply(op, *operands)` turns Python scalars and numpy
arrays into constants (scalars are weakly typed: they take the dtype of the
tensor they meet), checks that every operand lives in the same graph, and
adds the node, whose `infer` raises the build-time errors.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BuildError, DTypeError, GraphError
from ..ir import ConstValue, Graph, Node, TensorType, call_site, current_graph
from ..ops.common import checked_dtype
from ..ops.source import Constant

Scalar = int | float | bool


class Tensor:
    """A symbolic value: one node of a `Graph`."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # numpy defers `array + tensor` to us

    def __init__(self, graph: Graph, node_id: int) -> None:
        self.graph = graph
        self.id = node_id

    # -- what it is -------------------------------------------------------------
    @property
    def node(self) -> Node:
        return self.graph.nodes[self.id]

    @property
    def type(self) -> TensorType:
        return self.node.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self.node.type.size

    @property
    def name(self) -> str | None:
        return self.node.name

    def __repr__(self) -> str:
        name = f" '{self.name}'" if self.name else ""
        return f"<Tensor %{self.id}{name} {self.node.op.label} {self.type}>"

    def __hash__(self) -> int:
        return hash((id(self.graph), self.id))

    def __bool__(self) -> bool:
        raise TypeError("a symbolic Tensor has no truth value; use gc.where for selections")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        raise TypeError("a symbolic Tensor cannot be iterated; index it instead")

    # -- operators ----------------------------------------------------------------
    def __add__(self, other): return _math().add(self, other)
    def __radd__(self, other): return _math().add(other, self)
    def __sub__(self, other): return _math().subtract(self, other)
    def __rsub__(self, other): return _math().subtract(other, self)
    def __mul__(self, other): return _math().multiply(self, other)
    def __rmul__(self, other): return _math().multiply(other, self)
    def __truediv__(self, other): return _math().divide(self, other)
    def __rtruediv__(self, other): return _math().divide(other, self)
    def __floordiv__(self, other): return _math().floor_divide(self, other)
    def __rfloordiv__(self, other): return _math().floor_divide(other, self)
    def __pow__(self, other): return _math().power(self, other)
    def __rpow__(self, other): return _math().power(other, self)
    def __matmul__(self, other): return _math().matmul(self, other)
    def __rmatmul__(self, other): return _math().matmul(other, self)
    def __neg__(self): return _math().negative(self)
    def __pos__(self): return self
    def __abs__(self): return _math().abs(self)
    def __lt__(self, other): return _math().less(self, other)
    def __le__(self, other): return _math().less_equal(self, other)
    def __gt__(self, other): return _math().less(other, self)
    def __ge__(self, other): return _math().less_equal(other, self)
    def __eq__(self, other): return _math().equal(self, other)  # type: ignore[override]
    def __ne__(self, other): raise TypeError("!= is not an op here; use gc.equal and gc.where")  # type: ignore[override]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy's ufuncs on a Tensor build the matching node (np.exp(t) is gc.exp(t), and
        `array + t` is gc.add); the others, and out=/where=, are refused by name."""
        name = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or kwargs or name is None:
            extra = f" with {', '.join(kwargs)}" if kwargs else ""
            raise DTypeError(f"numpy's {ufunc.__name__}.{method}{extra} cannot run on a symbolic "
                             f"Tensor; build it from gc functions (gc.{name or 'elemwise'}, ...)",
                             site=call_site())
        if ufunc.__name__ in ("greater", "greater_equal"):
            inputs = inputs[::-1]
        return getattr(_math(), name)(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        """numpy's functions on a Tensor (np.sum(t, axis=0), np.concatenate([t, u])) build the
        gc function of `_FUNCTIONS`; the others, and arguments it does not take (out=,
        dtype=, np.dot of N-d operands), are refused naming the gc function to use."""
        import gradcompiler

        name = func.__name__
        target, by_position = _FUNCTIONS.get(name, (None, 0))
        fn = getattr(gradcompiler, target) if target else None
        renamed = {_KEYWORDS.get(name, {}).get(k, k): v for k, v in kwargs.items()}
        if fn is None:
            problem = _INSTEAD.get(name, "build it from gc functions (gc.sum, gc.reshape, ...)")
        elif name == "dot" and any(getattr(a, "ndim", 0) > 2 for a in args[:2]):
            problem = ("np.dot of operands above 2-d contracts the last axis of a with the "
                       "second-to-last of b; use gc.matmul (numpy's matmul semantics)")
        else:
            problem = _unbound(f"gc.{target}", fn, by_position, args, renamed)
        if problem is not None:
            raise DTypeError(f"numpy's {name} cannot run on a symbolic Tensor; {problem}",
                             site=call_site())
        return fn(*args, **renamed)

    def __getitem__(self, key):
        from . import indexing

        return indexing.getitem(self, key)

    # -- methods --------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False): return _math().sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return _math().mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return _math().max(self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return _math().min(self, axis, keepdims)
    def prod(self, axis=None, keepdims=False): return _math().prod(self, axis, keepdims)

    def reshape(self, *shape):
        return _shapes().reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def transpose(self, *perm):
        return _shapes().transpose(self, perm[0] if len(perm) == 1 and not isinstance(perm[0], int) else (perm or None))

    @property
    def T(self):
        return _shapes().transpose(self)

    def expand_dims(self, axis): return _shapes().expand_dims(self, axis)
    def squeeze(self, axis=None): return _shapes().squeeze(self, axis)
    def broadcast_to(self, shape): return _shapes().broadcast_to(self, shape)
    def astype(self, dtype): return _math().cast(self, dtype)
    def flatten(self): return _shapes().reshape(self, (-1,))


_UFUNCS = {  # numpy ufunc name -> gc function
    **{n: n for n in ("exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tanh", "negative",
                      "add", "subtract", "multiply", "divide", "maximum", "minimum", "less",
                      "less_equal", "equal", "power", "matmul", "floor", "ceil", "trunc", "sign",
                      "floor_divide")},
    "true_divide": "divide", "absolute": "abs", "rint": "round", "greater": "less",
    "greater_equal": "less_equal",
}


_FUNCTIONS = {  # numpy function -> (gc function taking its arguments, how many by position)
    **{n: (n, 2) for n in ("sum", "mean", "max", "min", "prod", "reshape", "transpose",
                           "squeeze", "expand_dims", "broadcast_to")},
    **{n: (n, 3) for n in ("swapaxes", "where", "clip")},
    "amax": ("max", 2), "amin": ("min", 2), "concatenate": ("concat", 2),
    "concat": ("concat", 2), "dot": ("matmul", 2),
}
_INSTEAD = {  # numpy functions with no gc twin -> what builds the same
    "stack": "use gc.concat of gc.expand_dims(t, axis)", "ravel": "use gc.reshape(t, -1)",
    "tensordot": "use gc.matmul", "einsum": "use gc.matmul", "outer": "use gc.matmul",
}
_KEYWORDS = {  # numpy keyword -> the gc function's, where they differ
    "transpose": {"axes": "perm"},
    "clip": {"a_min": "lo", "a_max": "hi", "min": "lo", "max": "hi"},
    "where": {"condition": "mask"},
}


def _unbound(label: str, fn: Callable, by_position: int, args: tuple, kwargs: dict) -> str | None:
    """Why `fn` cannot take numpy's `args` and `kwargs` (None if it can); past the first
    `by_position` arguments numpy's and gc's positional orders differ (np.sum's third is dtype)."""
    signature = inspect.signature(fn)
    if len(args) > by_position:
        return (f"{label}{signature} takes numpy's first {by_position} arguments by position, "
                f"not {len(args)}")
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        return f"{label}{signature} does not take these arguments ({err})"
    return None


def _math():
    from . import math

    return math


def _shapes():
    from . import shapes

    return shapes


def graph_of(operands: Sequence[Any]) -> Graph:
    """The one graph all Tensor operands live in (or the open graph if none is a Tensor)."""
    graphs = {id(t.graph): t.graph for t in operands if isinstance(t, Tensor)}
    if len(graphs) > 1:
        raise GraphError("operands come from different graphs", site=call_site())
    return next(iter(graphs.values())) if graphs else current_graph()


def constant(value: Any, dtype: Any = None, graph: Graph | None = None, name: str | None = None) -> Tensor:
    """A constant node holding `value` (copied)."""
    graph = graph or current_graph()
    try:
        dtype = None if dtype is None else checked_dtype("Constant", dtype)
    except BuildError as err:
        raise err.at(call_site()) from None
    array = np.array(value, dtype=dtype)
    node = graph.add(Constant(ConstValue(array)), role="const", name=name)
    return Tensor(graph, node.id)


def to_operands(operands: Sequence[Any]) -> list[Tensor]:
    """Tensors as they are; scalars in the dtype of the first Tensor; arrays as constants."""
    graph = graph_of(operands)
    like = next((t.dtype for t in operands if isinstance(t, Tensor)), None)
    result = []
    for value in operands:
        if isinstance(value, Tensor):
            result.append(value)
        elif isinstance(value, (bool, int, float, np.number, np.bool_)) and like is not None:
            if like.kind in "iub" and isinstance(value, (float, np.floating)) and float(value) != int(value):
                raise DTypeError(f"the float {value!r} meets an {like.name} tensor; cast the tensor first",
                                 site=call_site())
            if like.kind in "iu" and not isinstance(value, (bool, np.bool_)):
                info = np.iinfo(like)
                if not info.min <= int(value) <= info.max:
                    raise DTypeError(f"the scalar {int(value)} does not fit {like.name} (range "
                                     f"[{info.min}, {info.max}]); cast the tensor first",
                                     site=call_site())
            result.append(constant(value, like, graph))
        elif isinstance(value, (np.ndarray, list, tuple, bool, int, float, np.number)):
            result.append(constant(value, None, graph))
        else:
            raise DTypeError(f"cannot use a {type(value).__name__} ({value!r:.40}) as a tensor operand",
                             site=call_site())
    return result


def reports_user_line(fn: Callable) -> Callable:
    """Give the build errors `fn` raises itself (argument checks made before `apply`,
    such as a second -1 or an axis out of range) the caller's line, as `Graph.add`
    does for errors raised by `infer`."""

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BuildError as err:
            if err.site:
                raise
            raise err.at(call_site()) from None

    return checked


def apply(op, *operands: Any, name: str | None = None, role: str | None = None) -> Tensor:
    """Add `op` applied to `operands` to their graph and return its Tensor."""
    try:
        tensors = to_operands(operands)
    except BuildError as err:  # an operand that cannot meet the others: name the op it was for
        raise type(err)(err.message, op=err.op or op.label, site=err.site) from None
    graph = graph_of(tensors)
    node = graph.add(op, [t.id for t in tensors], name=name, role=role)
    return Tensor(graph, node.id)
