"""Random well-typed graphs for the fuzz tests: a hypothesis strategy, `fuzz_cases()`.

A case is built step by step: a pool of float values starts with a few
params, and each step draws one *recipe* (an op family), picks its operands
from the pool, fits their shapes (reshape, sum to a scalar, broadcast) and
adds the result to the pool. Every op of the IR is reachable: every Elemwise
mode, Where, Cast, StopGradient, every Reduce mode, ReduceTo, the shape ops,
Concat, FastpathCopy, pixel shuffle, basic, advanced and one-hot indexing in
their gather, set and add forms, both matrix products and both warps (the
backward ops come from differentiating them). Shapes are small and drawn from
a small vocabulary, so the compiled tests hit the structural kernel cache.

The graphs must be comparable with float64 finite differences, so the
recipes stay away from the points where a derivative does not exist or the
documented rule is not the derivative:

* domains: LOG, SQRT, RSQRT, POW and TRUE_DIV read `x·x + ½` (never ≤ 0);
  EXP and EXPM1 read `2·tanh(x)`, so chains cannot overflow;
* ties: MAX/MIN (binary and reduced) get a distinct ramp added to their
  first operand, since a structural tie (a max over a broadcast, say) gets
  the whole gradient in every tied slot by definition (op-reference §3.3);
* IndexingSetMultiAxisVec writes distinct positions (with repeats its
  gradient is approximate by definition, §7.4);
* StopGradient only appears inside softmax, where the stopped value does
  not change the function;
* warp matrices are near a random similarity transform, so no coordinate
  sits on an integer (where bilinear sampling has a kink).

Integer values (index feeds, one-hot labels, comparisons, int casts) flow
through the graph too; they carry no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import gradcompiler as gc
from gradcompiler.frontend import Tensor
from gradcompiler.ops.elemwise import MODES, Elemwise, StopGradient
from gradcompiler.ops.shape import FastpathCopy

SHAPES = [(), (3,), (2, 3), (3, 1), (2, 1, 3), (2, 2, 2, 2)]
"""The shapes of the params a case starts from; everything else derives from them."""

UNARY = ["EXP", "LOG", "LOG1P", "EXPM1", "SQRT", "RSQRT", "SIN", "COS", "TANH", "SIGMOID", "ERF",
         "GELU", "SOFTPLUS", "RELU", "NEGATE", "ABS", "FLOOR", "CEIL", "TRUNC", "ROUND", "SIGN"]
"""The piecewise-constant modes (FLOOR ... SIGN) have zero gradients; random values sit on
one of their steps with probability ~0, so finite differences see the same zero."""
BINARY = ["ADD", "SUB", "MUL", "TRUE_DIV", "POW", "MAX", "MIN", "ABS_GRAD", "SIGMOID_GRAD",
          "TANH_GRAD", "GELU_GRAD", "SOFTPLUS_GRAD", "SWITCH_GT0", "FLOOR_DIV"]
TERNARY = ["FUSE_MUL_ADD3", "COND_LEQ_MOV", "COND_LT_MOV"]
POSITIVE_DOMAIN = {"LOG", "SQRT", "RSQRT"}
BOUNDED_DOMAIN = {"EXP", "EXPM1"}
REDUCE_MODES = ["SUM", "MEAN", "MAX", "MIN", "PRODUCT", "SUM_SQR"]
BORDERS = ["replicate", "reflect", "reflect_101", "wrap", "constant"]


@dataclass(repr=False)
class FuzzCase:
    """A random graph: the float outputs to differentiate, the params to differentiate
    them with respect to, and feeds for every placeholder."""

    graph: gc.Graph
    outputs: list[Tensor]
    wrt: list[Tensor]
    feeds: dict[str, np.ndarray]
    recipes: list[str]

    def __repr__(self) -> str:
        shapes = {k: (v.shape, v.dtype.name) for k, v in self.feeds.items()}
        return (f"FuzzCase(recipes={self.recipes}, outputs={[o.id for o in self.outputs]}, "
                f"wrt={[w.name for w in self.wrt]}, feeds={shapes})\n{self.graph}")

    def _repr_pretty_(self, printer, cycle) -> None:  # how hypothesis prints a failing case
        printer.text(repr(self))


@dataclass
class _Builder:
    """The state of one case being drawn: the pool of values recipes pick from, the feeds
    made so far, and which values a later step consumed (the rest become outputs)."""

    draw: Callable
    dtype: np.dtype
    rng: np.random.Generator
    pool: list[Tensor] = field(default_factory=list)
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    recipes: list[str] = field(default_factory=list)
    consumed: set[int] = field(default_factory=set)

    # -- drawing helpers -------------------------------------------------------------
    def pick(self) -> Tensor:
        value = self.pool[self.draw(st.integers(0, len(self.pool) - 1))]
        self.consumed.add(value.id)
        return value

    def choice(self, options):
        return self.draw(st.sampled_from(options))

    def flag(self) -> bool:
        return self.draw(st.booleans())

    def add(self, tensor: Tensor) -> None:
        self.pool.append(tensor)

    # -- sources ---------------------------------------------------------------------
    def new_param(self, shape: tuple[int, ...], scale: float = 1.0, offset=0.0) -> Tensor:
        name = f"p{len(self.feeds)}"
        self.feeds[name] = np.asarray(self.rng.standard_normal(shape) * scale + offset, self.dtype)
        return gc.param(name, shape, self.dtype)

    def index_feed(self, shape: tuple[int, ...], low: int, high: int, dtype: str) -> Tensor:
        """An integer input with values in [low, high): indices known only at run time."""
        name = f"i{len(self.feeds)}"
        self.feeds[name] = np.asarray(self.rng.integers(low, high, size=shape), dtype)
        return gc.input(name, shape, dtype)

    def constant_like(self, shape: tuple[int, ...]) -> Tensor:
        return gc.constant(self.rng.standard_normal(shape), self.dtype)

    # -- fitting shapes -----------------------------------------------------------------
    def partner(self, *others: Tensor) -> Tensor:
        """An operand that broadcasts with `others`: a pool value, reshaped or summed if not."""
        b = self.pick()
        shapes = [o.shape for o in others]
        try:
            np.broadcast_shapes(b.shape, *shapes)
            return b
        except ValueError:
            pass
        if b.size == others[0].size and others[0].ndim and len(set(shapes)) == 1:
            return b.reshape(others[0].shape)
        return b.sum()

    def fitted(self, value: Tensor, shape: tuple[int, ...]) -> Tensor:
        """`value` brought to exactly `shape` (reshape, or reduce to a scalar and broadcast)."""
        t = value
        if t.shape == shape:
            return t
        if t.size == int(np.prod(shape, dtype=np.int64)):
            return t.reshape(shape)
        return gc.broadcast_to(t.mean(), shape)

    def positive(self, t: Tensor) -> Tensor:
        return t * t + 0.5

    def bounded(self, t: Tensor) -> Tensor:
        return gc.tanh(t) * 2.0

    def untied(self, t: Tensor) -> Tensor:
        """`t` plus distinct offsets, so no two elements (or a partner's) tie structurally."""
        ramp = (np.arange(max(t.size, 1)) + 1.0) * 0.37 / max(t.size, 1)
        return t + gc.constant(ramp.reshape(t.shape) if t.shape else ramp[0], self.dtype)

    def axes(self, ndim: int) -> tuple[int, ...]:
        chosen = self.draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))
        return tuple(sorted(chosen))


# -- recipes: each adds one value to the pool (or none when it does not apply) --------------

def r_unary(b: _Builder) -> None:
    a = b.pick()
    mode = b.choice(UNARY)
    x = a
    if mode in POSITIVE_DOMAIN:
        x = b.positive(x)
    elif mode in BOUNDED_DOMAIN:
        x = b.bounded(x)
    elif mode == "LOG1P":
        x = x * x
    b.add(gc.elemwise(mode, x))


def r_binary(b: _Builder) -> None:
    a = b.pick()
    c = b.partner(a)
    mode = b.choice(BINARY)
    x, y = a, c
    if mode in ("TRUE_DIV", "FLOOR_DIV"):
        y = b.positive(y)
    elif mode == "POW":
        x, y = b.positive(x), gc.tanh(y) * 1.5
    elif mode in ("MAX", "MIN"):
        x = b.untied(x)
    elif mode in ("ABS_GRAD", "SWITCH_GT0"):
        x = b.untied(x)  # the condition input must not sit on its switching point
    if b.flag() and mode in ("ADD", "SUB", "MUL", "MAX", "MIN"):
        y = float(np.round(b.rng.standard_normal(), 3))  # a weak Python scalar
    b.add(gc.elemwise(mode, x, y) if not isinstance(y, float) else _scalar_op(mode, x, y))


def _scalar_op(mode: str, x: Tensor, y: float) -> Tensor:
    return {"ADD": lambda: x + y, "SUB": lambda: y - x, "MUL": lambda: x * y,
            "MAX": lambda: gc.maximum(x, y), "MIN": lambda: gc.minimum(y, x)}[mode]()


def r_ternary(b: _Builder) -> None:
    a = b.pick()
    c = b.partner(a)
    d = b.partner(a, c)
    mode = b.choice(TERNARY)
    x = a if mode == "FUSE_MUL_ADD3" else b.untied(a)
    b.add(gc.elemwise(mode, x, c, d))


def r_where(b: _Builder) -> None:
    a = b.pick()
    c = b.partner(a)
    d = b.partner(a, c)
    compare = b.choice([gc.less, gc.less_equal, gc.equal])
    mask = compare(b.untied(a), c)
    if b.flag():
        b.add(gc.where(mask, d, a))
    else:
        b.add(gc.where(mask, d, 0.25))


def r_cast(b: _Builder) -> None:
    """A round trip through the other float width, or an integer value turned into a float."""
    a = b.pick()
    other = np.float64 if b.dtype == np.float32 else np.float32
    if b.flag():
        b.add(a.astype(other).astype(b.dtype))
    else:
        idx = b.index_feed(a.shape, -3, 4, b.choice(["int32", "int64"]))
        b.add(a * idx.astype(b.dtype))


def r_reduce(b: _Builder) -> None:
    a = b.pick()
    mode = b.choice(REDUCE_MODES)
    x = a
    if mode in ("MAX", "MIN"):
        x = b.untied(x)
    elif mode == "PRODUCT":
        x = b.positive(x) * 0.8
    axis = None if x.ndim == 0 or b.flag() else b.axes(x.ndim)
    b.add(gc.reduce(mode, x, axis, keepdims=b.flag()))


def r_reduce_to(b: _Builder) -> None:
    a = b.pick()
    shape = a.shape
    if not shape:
        return
    keep = b.draw(st.integers(0, len(shape)))
    target = tuple(d if b.flag() else 1 for d in shape[len(shape) - keep:])
    b.add(gc.reduce_to(a, target))


def r_reshape(b: _Builder) -> None:
    a = b.pick()
    size = a.size
    factors = [d for d in range(1, size + 1) if size % d == 0]
    first = b.choice(factors)
    shape = b.choice([(size,), (first, size // first), (size // first, 1, first), (-1, first)])
    b.add(a.reshape(shape))


def r_broadcast(b: _Builder) -> None:
    a = b.pick()
    shape = tuple(b.choice([2, 3]) if d == 1 else d for d in a.shape)
    lead = (2,) if b.flag() or a.ndim == 0 else ()
    b.add(gc.broadcast_to(a, lead + shape))


def r_axes(b: _Builder) -> None:
    """expand_dims, squeeze or transpose/swapaxes."""
    a = b.pick()
    x = a
    kind = b.choice(["expand", "squeeze", "transpose"])
    if kind == "expand" or x.ndim == 0:
        b.add(gc.expand_dims(x, b.draw(st.integers(-x.ndim - 1, x.ndim))))
    elif kind == "squeeze":
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        if ones:
            b.add(gc.squeeze(x, tuple(ones) if b.flag() else None))
    else:
        perm = b.draw(st.permutations(list(range(x.ndim))))
        b.add(gc.transpose(x, perm) if b.flag() else gc.swapaxes(x, 0, -1))


def r_concat(b: _Builder) -> None:
    a, c = b.pick(), b.pick()
    x = a if a.ndim else gc.expand_dims(a, 0)
    axis = b.draw(st.integers(-x.ndim, x.ndim - 1))
    shape = list(x.shape)
    shape[axis] = b.choice([1, 2])
    b.add(gc.concat([x, b.fitted(c, tuple(shape))], axis))


def r_copy(b: _Builder) -> None:
    a = b.pick()
    b.add(gc.apply(FastpathCopy(), a))


def r_pixel_shuffle(b: _Builder) -> None:
    a = b.pick()
    x = a
    if x.ndim >= 3 and x.shape[-1] % 2 == 0 and x.shape[-2] % 2 == 0 and b.flag():
        b.add(gc.pixel_unshuffle(x, 2))
        return
    if x.ndim < 3 or x.shape[-3] % 4:
        flat = gc.concat([x.flatten()] * 4)
        x = flat.reshape(1, 4, x.size, 1) if b.flag() else flat.reshape(4, x.size, 1)
    b.add(gc.pixel_shuffle(x, 2))


def _slice_key(b: _Builder, size: int):
    start = b.draw(st.integers(-size - 1, size))
    stop = b.draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    step = b.choice([1, 2, -1])
    return slice(start, stop, step)


def r_subtensor(b: _Builder) -> None:
    """Basic indexing: slices (any step, clamped bounds) and integers."""
    a = b.pick()
    x = a
    if x.ndim == 0:
        return
    key = tuple(_slice_key(b, d) if b.flag() else b.draw(st.integers(-d, d - 1)) for d in x.shape)
    y = x[key]
    if y.size:
        b.add(y)


def r_set_subtensor(b: _Builder) -> None:
    a, c = b.pick(), b.pick()
    x = a
    if x.ndim == 0:
        return
    key = tuple(_slice_key(b, d) if b.flag() else b.draw(st.integers(-d, d - 1)) for d in x.shape)
    region = x[key].shape  # a dead node; compile prunes it
    value = b.fitted(c, region)
    update = gc.index_update if b.flag() else gc.index_add
    b.add(update(x, key, value))


def _index(b: _Builder, size: int, shape: tuple[int, ...], negative: bool) -> Tensor | np.ndarray:
    """An index into an axis of `size`: a run-time feed (negatives wrap) or a constant array."""
    low = -size if negative else 0
    if b.flag():
        return b.index_feed(shape, low, size, b.choice(["int32", "int64"]))
    return b.rng.integers(low, size, size=shape)


def r_gather(b: _Builder) -> None:
    """Advanced indexing on one axis, or on two (consecutive or not)."""
    a = b.pick()
    x = a
    if x.ndim == 0:
        return
    shape = b.choice([(2,), (3,), (2, 2), ()])
    axis = b.draw(st.integers(0, x.ndim - 1))
    key: list = [slice(None)] * x.ndim
    key[axis] = _index(b, x.shape[axis], shape, negative=True)
    if x.ndim >= 3 and b.flag():
        other = b.choice([i for i in range(x.ndim) if i != axis])
        key[other] = _index(b, x.shape[other], shape, negative=True)
    b.add(x[tuple(key)])


def r_scatter(b: _Builder) -> None:
    """index_add (repeats accumulate) or index_update at distinct positions."""
    a, c = b.pick(), b.pick()
    x = a
    if x.ndim == 0:
        return
    axis = b.draw(st.integers(0, x.ndim - 1))
    size = x.shape[axis]
    key: list = [slice(None)] * x.ndim
    if b.flag():
        count = b.draw(st.integers(1, size))
        positions = b.rng.permutation(size)[:count] - (size if b.flag() else 0)
        if b.flag():
            name = f"i{len(b.feeds)}"
            b.feeds[name] = positions.astype(np.int32)
            key[axis] = gc.input(name, (count,), "int32")
        else:
            key[axis] = positions
        update = gc.index_update
    else:
        key[axis] = _index(b, size, (b.choice([1, 3]),), negative=True)
        update = gc.index_add
    region = x[tuple(key)].shape  # a dead node; compile prunes it
    b.add(update(x, tuple(key), b.fitted(c, region)))


def r_one_hot(b: _Builder) -> None:
    a = b.pick()
    x = a
    if x.ndim < 2:
        x = x.reshape(1, -1) if x.ndim == 1 else x.reshape(1, 1)
    axis = b.draw(st.integers(-x.ndim, x.ndim - 1))
    index_shape = x.shape[: axis % x.ndim] + x.shape[axis % x.ndim + 1:]
    n = x.shape[axis]
    index = b.index_feed(index_shape, 0, n, "int32") if b.flag() else gc.constant(
        b.rng.integers(0, n, size=index_shape), "int64")
    if b.flag():
        b.add(gc.indexing_one_hot(x, index, axis, keepdims=b.flag()))
    else:
        c = b.pick()
        sub_shape = tuple(1 if i == axis % x.ndim else d for i, d in enumerate(x.shape))
        b.add(gc.indexing_set_one_hot(x, index, b.fitted(c, sub_shape), axis))


@gc.custom_gradient
def _silu(x):
    """x·sigmoid(x) whose backward is written by hand and equals the true gradient, so the
    finite-difference checks hold it to the same standard as a rule of the table."""
    s = gc.sigmoid(x)
    return x * s, lambda g, x, s: [g * (s + x * s * (1.0 - s))], (x, s)


def r_custom(b: _Builder) -> None:
    b.add(_silu(b.pick()))


def r_matmul(b: _Builder) -> None:
    a = b.pick()
    x = a if a.ndim else a.reshape(1)
    transpose_a = x.ndim == 2 and b.flag()
    k = x.shape[-2] if transpose_a else x.shape[-1]
    n = b.choice([1, 2, 3])
    transpose_b = b.flag()
    c = b.pick()
    w_shape = (n, k) if transpose_b else (k, n)
    if x.ndim >= 3 and b.flag():  # batched, B broadcast over A's batch
        w_shape = (1,) * (x.ndim - 3) + (1,) + w_shape if b.flag() else x.shape[:-2] + w_shape
    w = b.fitted(c, w_shape)
    b.add(gc.matmul(x, w, transpose_a, transpose_b))


def r_composite(b: _Builder) -> None:
    a = b.pick()
    x = a if a.ndim else a.reshape(1)
    kind = b.choice(["softmax", "log_softmax", "layer_norm", "gelu_tanh", "mse", "cross_entropy"])
    if kind in ("softmax", "log_softmax"):
        b.add(getattr(gc, kind)(x, b.draw(st.integers(-x.ndim, x.ndim - 1))))
    elif kind == "layer_norm":
        if x.shape[-1] < 2:
            x = gc.concat([x, x * 0.5 + 1.0], -1)
        b.add(gc.layer_norm(x))
    elif kind == "gelu_tanh":
        b.add(gc.gelu_tanh(x))
    elif kind == "mse":
        c = b.partner(a)
        b.add(gc.mse(x, c if c.shape == x.shape else b.fitted(c, x.shape)))
    else:
        logits = x if x.ndim >= 2 else x.reshape(1, -1)
        labels = b.index_feed(logits.shape[:-1], 0, logits.shape[-1], "int32")
        b.add(gc.cross_entropy(logits, labels))


def _image(b: _Builder, value: Tensor, fmt: str) -> Tensor:
    """A 4-D image (N=2, C, H, W in `fmt`) made from `value`'s elements."""
    flat = value.flatten() if value.ndim else value.reshape(1)
    hw = b.choice([(2, 3), (3, 3)])
    need = 2 * hw[0] * hw[1]
    if flat.size < need:
        flat = gc.broadcast_to(flat.reshape(-1, 1), (flat.size, need // flat.size + 1)).flatten()
    data = flat[:need]
    data = data + gc.constant(np.linspace(-1, 1, need), b.dtype)  # not constant along any axis
    return data.reshape((2, 1) + hw if fmt == "NCHW" else (2,) + hw + (1,))


def r_warp(b: _Builder) -> None:
    a = b.pick()
    fmt = b.choice(["NCHW", "NHWC"])
    src = _image(b, a, fmt)
    border = b.choice(BORDERS)
    out_shape = b.choice([(2, 2), (3, 2)])
    angle = b.rng.uniform(-0.5, 0.5)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    shift = b.rng.uniform(-1.3, 1.3, size=2) + 0.123
    affine = np.concatenate([rot * b.rng.uniform(0.7, 1.3), shift[:, None]], axis=1)
    if b.flag():
        mat = b.new_param((2, 2, 3), scale=0.02, offset=affine)
        out = gc.warp_affine(src, mat, out_shape, border, 0.5, fmt)
    else:
        persp = np.concatenate([affine, [[0.01, -0.02, 1.0]]], axis=0)
        mat = b.new_param((3, 3, 3), scale=0.02, offset=persp)
        mat_idx = b.index_feed((3,), 0, 2, "int32")
        out = gc.warp_perspective(src, mat, out_shape, mat_idx, border, 0.5, fmt)
    b.add(out)


def r_conv(b: _Builder) -> None:
    """A convolution, a transposed convolution or an average pooling of a small image (MAX
    pooling stays out: a step of the finite differences may switch a window's maximum)."""
    src = _image(b, b.pick(), "NCHW")
    kind = b.choice(["conv", "conv_transpose", "avg_pool"])
    if kind == "conv":
        w = b.new_param((2, 1, 2, b.choice([1, 2])), scale=0.5)
        b.add(gc.conv2d(src, w, stride=b.choice([1, 2]), padding=b.choice([0, 1])))
    elif kind == "conv_transpose":
        w = b.new_param((1, 2, 2, 2), scale=0.5)
        b.add(gc.conv_transpose2d(src, w, stride=b.choice([1, 2]), padding=b.choice([0, 1])))
    else:
        b.add(gc.avg_pool2d(src, 2, 1, b.choice([0, 1]), count_include_pad=b.flag()))


RECIPES: dict[str, Callable[[_Builder], None]] = {
    "unary": r_unary, "binary": r_binary, "ternary": r_ternary, "where": r_where, "cast": r_cast,
    "reduce": r_reduce, "reduce_to": r_reduce_to, "reshape": r_reshape, "broadcast": r_broadcast,
    "axes": r_axes, "concat": r_concat, "copy": r_copy, "pixel_shuffle": r_pixel_shuffle,
    "subtensor": r_subtensor, "set_subtensor": r_set_subtensor, "gather": r_gather,
    "scatter": r_scatter, "one_hot": r_one_hot, "matmul": r_matmul, "composite": r_composite,
    "custom": r_custom,
    "warp": r_warp, "conv": r_conv,
}
"""Every recipe a case can draw; `fuzz_cases(recipes=...)` restricts them."""


def _carries_gradient(graph: gc.Graph, node_id: int, slot: int) -> bool:
    """Whether input `slot` of a node gets a gradient from it: a float result of a
    differentiable op, and not a compared input of a select mode (SWITCH_GT0's a, say)
    nor ABS_GRAD's sign input (op-reference §2.4: no gradient)."""
    node = graph[node_id]
    if node.type.dtype.kind != "f" or isinstance(node.op, StopGradient):
        return False
    if isinstance(node.op, Elemwise):
        mode = node.op.mode
        return slot not in MODES[mode].conditions and (mode, slot) != ("ABS_GRAD", 0)
    return True


def _connected_params(graph: gc.Graph, outputs: list[Tensor]) -> list[str]:
    """Feed names of the float params a gradient of `outputs` flows back to."""
    reached = {o.id for o in outputs}
    for node_id in reversed(graph.topo_order(graph.ancestors(reached))):
        if node_id in reached:
            for slot, i in enumerate(graph[node_id].inputs):
                if graph[i].type.dtype.kind == "f" and _carries_gradient(graph, node_id, slot):
                    reached.add(i)
    return sorted(name for name, i in graph.feed_names.items()
                  if i in reached and graph[i].role == "param")


@st.composite
def fuzz_cases(draw, max_steps: int = 6, recipes: tuple[str, ...] = tuple(RECIPES),
               dtypes: tuple[str, ...] = ("float32", "float64")) -> FuzzCase:
    """A random FuzzCase of 1..max_steps recipes over 1-3 params.

    The outputs are up to three float values no later step read; the params
    are those their gradient reaches.
    """
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    with gc.Graph("fuzz") as graph:
        b = _Builder(draw, dtype, rng)
        for _ in range(draw(st.integers(1, 3))):
            b.pool.append(b.new_param(draw(st.sampled_from(SHAPES))))
        for _ in range(draw(st.integers(1, max_steps))):
            name = draw(st.sampled_from(recipes))
            before = len(b.pool)
            RECIPES[name](b)
            if len(b.pool) > before:
                b.recipes.append(name)
    leaves = [t for t in b.pool if t.id not in b.consumed and t.dtype.kind == "f"]
    outputs = (leaves or b.pool[-1:])[-3:]
    names = _connected_params(graph, outputs)
    if not names:
        outputs.append(b.pool[0])
        names = [b.pool[0].name]
    wrt = [Tensor(graph, graph.feed_names[name]) for name in names]
    return FuzzCase(graph, outputs, wrt, b.feeds, b.recipes)


DRAWN_MODES = set(UNARY) | set(BINARY) | set(TERNARY) | {"LT", "LEQ", "EQ"}
"""The Elemwise modes recipes draw directly (the other helper modes come from gradients)."""
