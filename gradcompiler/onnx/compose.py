"""ONNX ops that take more than one frontend call: each is written here from gc functions
(slices, concatenations, advanced indexing, reductions), so that it needs no op, rule or
kernel of its own and its gradient follows from those of its pieces.

Each function takes the importer's `NodeContext` (inputs, attributes, errors that name
the node) and returns the node's outputs.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

import gradcompiler as gc

from ..frontend.normalisation import normalise
from ..frontend.tensor import Tensor

_INT_MAX = 2 ** 63 - 1


# -- slicing, padding, splitting ------------------------------------------------------
def _onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice's bounds on an axis of `dim` as a Python slice: negatives count from the
    end, then starts clamp to [0, dim] ([0, dim - 1] going backwards) and ends to [0, dim]
    ([-1, dim - 1] going backwards, -1 meaning before the first element)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def slice_(c):
    x = c.x(0)
    starts, ends = c.const(1, "starts"), c.const(2, "ends")
    axes = c.const(3, "axes")
    steps = c.const(4, "steps")
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    key = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise c.error("a step is 0")
        axis = int(axis) % x.ndim
        key[axis] = _onnx_slice(int(start), int(end), int(step), x.shape[axis])
    return [x[tuple(key)]]


def _along(x: Tensor, axis: int, part: slice) -> Tensor:
    key = [slice(None)] * x.ndim
    key[axis] = part
    return x[tuple(key)]


def pad_axis(c, x: Tensor, axis: int, before: int, after: int, mode: str, value) -> Tensor:
    """x padded (or, for negative amounts, cropped) along one axis."""
    n = x.shape[axis]
    x = _along(x, axis, slice(max(-before, 0), n - max(-after, 0)))
    before, after, n = max(before, 0), max(after, 0), x.shape[axis]
    if not before and not after:
        return x
    if mode == "constant":
        def side(k):
            shape = list(x.shape)
            shape[axis] = k
            return gc.broadcast_to(value, tuple(shape))
    elif mode == "edge":
        def side(k, first=True):
            edge = _along(x, axis, slice(0, 1) if first else slice(n - 1, n))
            shape = list(x.shape)
            shape[axis] = k
            return gc.broadcast_to(edge, tuple(shape))
    elif mode == "reflect":
        if max(before, after) >= n:
            raise c.error(f"reflect padding of {max(before, after)} needs more than {n} elements")

        def side(k, first=True):
            return _along(x, axis, slice(k, 0, -1) if first else slice(n - 2, n - 2 - k, -1))
    else:  # wrap
        def side(k, first=True):
            return _along(x, axis, slice(n - k, n) if first else slice(0, k))
    parts = []
    if before:
        parts.append(side(before) if mode == "constant" else side(before, True))
    parts.append(x)
    if after:
        parts.append(side(after) if mode == "constant" else side(after, False))
    return gc.concat(parts, axis)


def pad(c):
    x = c.x(0)
    mode = c.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise c.refuse("mode", mode, "constant, edge, reflect, wrap")
    pads = [int(p) for p in c.const(1, "pads")]
    axes = c.const(3, "axes")
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
    value = c.opt(2) if mode == "constant" else None
    if mode == "constant" and value is None:
        value = gc.zeros((), x.dtype) if x.dtype.kind == "f" else gc.constant(np.zeros((), x.dtype))
    for k, axis in enumerate(axes):
        x = pad_axis(c, x, axis, pads[k], pads[k + len(axes)], mode, value)
    return [x]


def split(c):
    x = c.x(0)
    axis = int(c.attr("axis", 0)) % x.ndim
    n = x.shape[axis]
    sizes = c.const(1, "split")
    if sizes is None:
        count = c.attr("num_outputs", len(c.node.output))
        chunk = -(-n // count)
        sizes = [min(chunk, n - k * chunk) for k in range(count)]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != n:
        raise c.error(f"split sizes {sizes} do not add up to the axis size {n}")
    offsets = np.cumsum([0, *sizes])
    return [_along(x, axis, slice(int(a), int(b))) for a, b in itertools.pairwise(offsets)]


def tile(c):
    x = c.x(0)
    repeats = [int(r) for r in c.const(1, "repeats")]
    interleaved = [d for pair in zip([1] * x.ndim, x.shape) for d in pair]
    target = [d for pair in zip(repeats, x.shape) for d in pair]
    y = gc.broadcast_to(gc.reshape(x, tuple(interleaved)), tuple(target))
    return [gc.reshape(y, tuple(r * d for r, d in zip(repeats, x.shape)))]


# -- indexing ------------------------------------------------------------------------
def wrapped_index(index: Tensor, size: int) -> Tensor:
    """ONNX indices may be negative (counted from the end): wrapped once."""
    return gc.where(gc.less(index, 0), index + size, index)


def gather(c):
    x, axis = c.x(0), int(c.attr("axis", 0))
    axis %= x.ndim
    index = wrapped_index(c.x(1), x.shape[axis])
    return [x[(slice(None),) * axis + (index,)]]


def _element_key(index: Tensor, axis: int) -> tuple:
    """The advanced-indexing key of GatherElements / ScatterElements: `index` along `axis`
    and, along every other axis d, the position itself (an arange shaped to broadcast)."""
    key = []
    for d, size in enumerate(index.shape):
        if d == axis:
            key.append(index)
        else:
            shape = [1] * index.ndim
            shape[d] = size
            key.append(np.arange(size).reshape(shape))
    return tuple(key)


def gather_elements(c):
    x = c.x(0)
    axis = int(c.attr("axis", 0)) % x.ndim
    index = wrapped_index(c.x(1), x.shape[axis])
    return [x[_element_key(index, axis)]]


def scatter_elements(c):
    x, updates = c.x(0), c.x(2)
    axis = int(c.attr("axis", 0)) % x.ndim
    reduction = c.attr("reduction", "none")
    index = wrapped_index(c.x(1), x.shape[axis])
    key = _element_key(index, axis)
    if reduction == "none":
        return [gc.index_update(x, key, updates)]
    if reduction == "add":
        return [gc.index_add(x, key, updates)]
    raise c.refuse("reduction", reduction, "none, add")


def one_hot(c):
    indices, values = c.x(0), c.x(2)
    depth = int(np.asarray(c.const(1, "depth")).reshape(()))
    axis = int(c.attr("axis", -1))
    axis = axis % (indices.ndim + 1)
    if indices.dtype.kind == "f":
        indices = gc.cast(gc.trunc(indices), np.int64)
    indices = wrapped_index(indices, depth)
    classes = np.arange(depth, dtype=indices.dtype).reshape(
        [depth if d == axis else 1 for d in range(indices.ndim + 1)])
    hit = gc.equal(gc.expand_dims(indices, axis), classes)
    return [gc.where(hit, values[1], values[0])]


def depth_to_space(c):
    x = c.x(0)
    b = int(c.attr("blocksize"))
    mode = c.attr("mode", "DCR")
    n, ch, h, w = x.shape
    if mode == "DCR":
        y = gc.transpose(gc.reshape(x, (n, b, b, ch // b ** 2, h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = gc.transpose(gc.reshape(x, (n, ch // b ** 2, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise c.refuse("mode", mode, "DCR, CRD")
    return [gc.reshape(y, (n, ch // b ** 2, h * b, w * b))]


def space_to_depth(c):
    x = c.x(0)
    b = int(c.attr("blocksize"))
    mode = c.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise c.refuse("mode", mode, "DCR, CRD")
    n, ch, h, w = x.shape
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = gc.transpose(gc.reshape(x, (n, ch, h // b, b, w // b, b)), perm)
    return [gc.reshape(y, (n, ch * b * b, h // b, w // b))]


def trilu(c):
    x = c.x(0)
    k = c.const(1, "k")
    k = 0 if k is None else int(np.asarray(k).reshape(()))
    rows, cols = x.shape[-2:]
    ones = np.ones((rows, cols), dtype=bool)
    mask = np.triu(ones, k) if c.attr("upper", 1) else np.tril(ones, k)
    return [gc.where(gc.constant(mask), x, gc.constant(np.zeros((), x.dtype)))]


# -- reductions ------------------------------------------------------------------------
def reduce_axes(c, x: Tensor) -> tuple[int, ...] | None:
    """The axes of an ONNX Reduce*: an input from opset 18 (ReduceSum: 13), before it an
    attribute; empty means all axes, or none with noop_with_empty_axes. None: no-op."""
    axes = c.const(1, "axes") if c.n_inputs > 1 else c.attr("axes")
    if axes is None or len(axes) == 0:
        return None if c.attr("noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(sorted(int(a) % x.ndim for a in axes))


def ZERO(dtype):
    return 0


def ONE(dtype):
    return 1


def NAN(dtype):
    return np.nan


def LOWEST(dtype):
    """The identity of a maximum: -inf, or the type's least value (False for bools)."""
    return -np.inf if dtype.kind == "f" else False if dtype.kind == "b" else np.iinfo(dtype).min


def HIGHEST(dtype):
    return np.inf if dtype.kind == "f" else True if dtype.kind == "b" else np.iinfo(dtype).max


def reduction(fn, empty):
    """An ONNX Reduce* node from `fn(x, axes, keepdims)`; integer results keep the input's
    dtype (gc sums integers in int64, as numpy does; ONNX keeps the type). A reduction
    over an empty axis does not depend on the data: it is the constant `empty(dtype)`
    (the reduction's identity), as ONNX defines it."""
    def build(c):
        x = c.x(0)
        axes = reduce_axes(c, x)
        if axes is None:
            return [x]
        keepdims = bool(c.attr("keepdims", 1))
        if any(x.shape[a] == 0 for a in axes):
            shape = [1 if a in axes else d for a, d in enumerate(x.shape)
                     if keepdims or a not in axes]
            return [np.full(shape, empty(x.dtype), dtype=x.dtype)]
        return [gc.cast(fn(x, axes, keepdims), x.dtype)]
    return build


def bool_safe(mode: str):
    """MAX / MIN of bools computed on uint8 (the project's MAX and MIN refuse bools)."""
    def fn(x, axes, keepdims):
        if x.dtype == np.bool_:
            return gc.cast(gc.reduce(mode, gc.cast(x, np.uint8), axes, keepdims), np.bool_)
        return gc.reduce(mode, x, axes, keepdims)
    return fn


def log_sum_exp(x, axes, keepdims):
    shift = gc.stop_gradient(gc.max(x, axes, keepdims=True))
    y = gc.log(gc.sum(gc.exp(x - shift), axes, keepdims=True)) + shift
    return y if keepdims else gc.squeeze(y, axes)


def argmax(c):
    x = c.x(0)
    y = gc.argmax(x, int(c.attr("axis", 0)), keepdims=bool(c.attr("keepdims", 1)),
                  last=bool(c.attr("select_last_index", 0)))
    return [y]


# -- normalisation and losses ----------------------------------------------------------
def layer_normalization(c):
    x, scale, bias = c.x(0), c.x(1), c.opt(2)
    if c.attr("stash_type", 1) != 1:
        raise c.refuse("stash_type", c.attr("stash_type"), "1")
    axis = int(c.attr("axis", -1)) % x.ndim
    normalised = normalise(x, tuple(range(axis, x.ndim)), c.attr("epsilon", 1e-5), "LayerNormalization")
    y = normalised.value * scale
    return [y if bias is None else y + bias, normalised.mean, normalised.inv_std]


def _loss_options(c):
    reduction = c.attr("reduction", "mean")
    if reduction not in ("mean", "sum", "none"):
        raise c.refuse("reduction", reduction, "mean, sum, none")
    return {"weight": c.opt(2), "ignore_index": c.attr("ignore_index"), "reduction": reduction}


def softmax_cross_entropy(c):
    scores, labels = c.x(0), c.x(1)
    loss = gc.cross_entropy(scores, labels, 1, **_loss_options(c))
    return [loss, gc.log_softmax(scores, 1)]


def negative_log_likelihood(c):
    return [gc.nll_loss(c.x(0), c.x(1), 1, **_loss_options(c))]


# -- Einsum -----------------------------------------------------------------------------
def _einsum_terms(c, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The equation's operand and output terms, with `...` spelled out as letters."""
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise c.error(f"equation {equation!r} names {len(terms)} operands, got {len(ranks)}")
    spare = [ch for ch in string.ascii_letters if ch not in equation]
    widest = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t),
                 default=0)
    dots = "".join(spare[:widest])
    terms = [t.replace("...", dots[widest - (r - len(t.replace("...", ""))):])
             for t, r in zip(terms, ranks)]
    if not arrow:
        counts = "".join(terms)
        out = dots + "".join(sorted(ch for ch in set(counts) if counts.count(ch) == 1
                                    and ch not in dots))
    out = out.replace("...", dots)
    for term in terms:
        if len(set(term)) != len(term):
            raise c.error(f"equation {equation!r} repeats an index within an operand "
                          "(diagonals are not supported)")
    return terms, out


def _sum_unused(x: Tensor, term: str, keep: str) -> tuple[Tensor, str]:
    axes = tuple(i for i, ch in enumerate(term) if ch not in keep)
    if not axes:
        return x, term
    return gc.sum(x, axes), "".join(ch for ch in term if ch in keep)


def einsum(c):
    """Einsum of one or two operands, as transposes, sums and one (batched) matmul."""
    operands = c.inputs()
    if len(operands) > 2:
        raise c.error(f"{len(operands)} operands; Einsum of one or two is supported")
    terms, out = _einsum_terms(c, c.attr("equation"), [t.ndim for t in operands])
    if len(operands) == 1:
        x, term = _sum_unused(operands[0], terms[0], out)
        return [gc.transpose(x, tuple(term.index(ch) for ch in out))]
    (a, ta), (b, tb) = (_sum_unused(t, term, out + other) for t, term, other in
                        ((operands[0], terms[0], terms[1]), (operands[1], terms[1], terms[0])))
    batch = [ch for ch in out if ch in ta and ch in tb]
    contract = [ch for ch in ta if ch in tb and ch not in out]
    only_a = [ch for ch in ta if ch not in tb]
    only_b = [ch for ch in tb if ch not in ta]
    size = {ch: d for t, term in ((a, ta), (b, tb)) for ch, d in zip(term, t.shape)}
    for ch in batch:  # a size-1 batch axis broadcasts against the other operand's
        size[ch] = max(a.shape[ta.index(ch)], b.shape[tb.index(ch)])

    def arranged(x, term, first, second):
        x = gc.transpose(x, tuple(term.index(ch) for ch in batch + first + second))
        shape = [size[ch] for ch in batch] + [math.prod(size[ch] for ch in first),
                                               math.prod(size[ch] for ch in second)]
        dims = x.shape[:len(batch)]
        x = gc.broadcast_to(x, tuple(size[ch] for ch in batch) + x.shape[len(batch):]) \
            if tuple(dims) != tuple(shape[:len(batch)]) else x
        return gc.reshape(x, tuple(shape))

    product = gc.matmul(arranged(a, ta, only_a, contract), arranged(b, tb, contract, only_b))
    order = batch + only_a + only_b
    product = gc.reshape(product, tuple(size[ch] for ch in order))
    return [gc.transpose(product, tuple(order.index(ch) for ch in out))]
