"""Bad input at run time (issue 8, part 1): feeds, index values and warp matrices.

Every check runs on the reference interpreter and on the compiled CPU and
CUDA (simulator) targets, in this very process: an index the compiled code
did not check before its kernel ran would read or write outside a buffer,
which is a segfault or silent memory corruption, not an exception. So each
out-of-range test also runs the same executable again with good feeds and
compares against numpy, to show that nothing was corrupted.

Feeds that are merely unusual (non-contiguous, read-only, other byte order,
0-d) are not errors: they give the right answer, and are never written.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import BackendUnavailableError, FeedError, IndexOutOfRangeError

from oracle import assert_close

TARGETS = ["reference", "cpu", "cuda"]


class Program:
    """One graph, runnable by the reference interpreter or compiled (once) for a target."""

    def __init__(self, outputs, target: str):
        self.outputs = outputs
        self.target = target
        if target == "reference":
            self.step = lambda **feeds: gc.evaluate(outputs, feeds)
        else:
            try:
                self.step = gc.compile(outputs, target=target)
            except BackendUnavailableError as err:
                # only outside `make test` (which sets NUMBA_ENABLE_CUDASIM=1) on a machine
                # without a GPU: the CUDA rows have nothing to run on there
                pytest.skip(f"{target}: {err}")

    def __call__(self, **feeds):
        return self.step(**feeds, to_host=True) if self.target == "cuda" else self.step(**feeds)


_PROGRAMS: dict[tuple[str, str], Program] = {}


def program(name: str, target: str) -> Program:
    """The program `name` (a builder below) for `target`, compiled once per session."""
    key = (name, target)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = Program(BUILDERS[name](), target)
    return _PROGRAMS[key]


# -- the graphs --------------------------------------------------------------------------------

def build_gather():
    """y = x[idx] (a run-time index) and its gradient, a scatter-add of 2·y."""
    with gc.Graph("gather"):
        x = gc.param("x", (4, 3))
        idx = gc.input("idx", (2,), "int32")
        y = x[idx]
        dx = gc.grad((y * y).sum(), x)
    return [y, dx]


def build_scatter():
    """index_add and index_update at run-time positions along axis 1."""
    with gc.Graph("scatter"):
        x = gc.param("x", (2, 4))
        pos = gc.input("pos", (3,), "int64")
        v = gc.param("v", (2, 3))
        added = gc.index_add(x, (slice(None), pos), v)
        updated = gc.index_update(x, (slice(None), pos), v * 2.0)
    return [added, updated]


def build_one_hot():
    with gc.Graph("one_hot"):
        x = gc.param("x", (3, 4))
        labels = gc.input("labels", (3,), "int32")
        picked = gc.indexing_one_hot(x, labels, axis=1)
        placed = gc.indexing_set_one_hot(x, labels, picked * 10.0, axis=1)
        dx = gc.grad(picked.sum(), x)
    return [picked, placed, dx]


def build_warp_with_mat_idx():
    with gc.Graph("warp_mat_idx"):
        src = gc.param("src", (2, 1, 3, 3))
        mat = gc.param("mat", (3, 3, 3))
        mat_idx = gc.input("mat_idx", (3,), "int32")
        out = gc.warp_perspective(src, mat, (2, 2), mat_idx)
    return [out]


def build_warp_affine():
    """A warp and both its gradients: NaN/Inf/huge matrices must not index outside `src`."""
    with gc.Graph("warp_affine"):
        src = gc.param("src", (1, 3, 3, 1))
        mat = gc.param("mat", (1, 2, 3))
        out = gc.warp_affine(src, mat, (2, 2), "reflect")
        dsrc, dmat = gc.grad((out * out).sum(), [src, mat])
    return [out, dsrc, dmat]


def build_warp_constant():
    with gc.Graph("warp_constant"):
        src = gc.param("src", (1, 1, 3, 3))
        mat = gc.param("mat", (1, 3, 3))
        out = gc.warp_perspective(src, mat, (2, 2), border_mode="constant", border_val=0.5)
        dsrc = gc.grad(out.sum(), src)
    return [out, dsrc]


CROSS_ENTROPY_LINE = None


def build_cross_entropy():
    """A weighted, label-smoothed cross-entropy and its gradient: labels meet two gathers."""
    global CROSS_ENTROPY_LINE
    with gc.Graph("cross_entropy"):
        z = gc.param("z", (3, 4))
        labels = gc.input("labels", (3,), "int32")
        weight = np.arange(1, 5, dtype=np.float32)
        CROSS_ENTROPY_LINE = f"{__file__}:{sys._getframe().f_lineno + 1}"
        loss = gc.cross_entropy(z, labels, weight=weight, label_smoothing=0.1)
        dz = gc.grad(loss, z)
    return [loss, dz]


BUILDERS = {f.__name__.removeprefix("build_"): f for f in (
    build_gather, build_scatter, build_one_hot, build_warp_with_mat_idx, build_warp_affine,
    build_warp_constant, build_cross_entropy)}

X43 = np.arange(12, dtype=np.float32).reshape(4, 3)


def gather_oracle(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = x[idx]
    dx = np.zeros_like(x)
    np.add.at(dx, idx, 2 * y)
    return y, dx


def assert_gather_works(step, idx) -> None:
    idx = np.asarray(idx, np.int32)
    y, dx = step(x=X43, idx=idx)
    want_y, want_dx = gather_oracle(X43, idx)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, want_dx)


# -- feeds ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_missing_and_extra_feeds(target):
    step = program("gather", target)
    with pytest.raises(FeedError, match=r"missing feed\(s\) \['idx'\].*needs \['idx', 'x'\]"):
        step(x=X43)
    with pytest.raises(FeedError, match=r"unexpected feed\(s\) \['idz'\].*takes \['idx', 'x'\]"):
        step(x=X43, idx=np.array([0, 1], np.int32), idz=np.array([0, 1], np.int32))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("feeds, message", [
    (dict(x=X43.T), r"feed 'x' has shape \(3, 4\), expected \(4, 3\)"),
    (dict(x=X43[None]), r"feed 'x' has shape \(1, 4, 3\), expected \(4, 3\)"),
    (dict(idx=np.array([0, 1, 2], np.int32)), r"feed 'idx' has shape \(3,\), expected \(2,\)"),
    (dict(x=X43.astype(np.float64)), r"feed 'x' has dtype float64, expected float32"),
    (dict(idx=np.array([0, 1], np.int64)), r"feed 'idx' has dtype int64, expected int32"),
    (dict(idx=np.array([0.0, np.nan])), r"feed 'idx' has dtype float64, expected int32"),
    (dict(idx=np.array([0.0, 1.0], np.float32)), r"feed 'idx' has dtype float32, expected int32"),
    (dict(idx=[0, 1]), r"feed 'idx' has dtype int64, expected int32"),
    (dict(idx=None), r"feed 'idx' is None; it needs an array of shape \(2,\) and dtype int32"),
    (dict(x="weights"), r"feed 'x' has dtype str\d*, expected float32"),
], ids=["transposed", "extra-axis", "index-shape", "float64", "int64-index", "nan-index",
        "float-index", "list", "none", "string"])
def test_wrong_shape_or_dtype_is_refused_before_anything_runs(target, feeds, message):
    step = program("gather", target)
    with pytest.raises(FeedError, match=message):
        step(**{"x": X43, "idx": np.array([0, 1], np.int32), **feeds})
    assert_gather_works(step, [3, 1])


def unusual_layouts():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    read_only = X43.copy()
    read_only.setflags(write=False)
    return {
        "fortran": np.asfortranarray(X43),
        "transposed-view": np.ascontiguousarray(X43.T).T,
        "strided": base[:, ::2],
        "negative-stride": X43[::-1][::-1],
        "read-only": read_only,
        "big-endian": X43.astype(">f4"),
    }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layout", list(unusual_layouts()))
def test_unusual_but_valid_feeds_give_the_right_answer_and_stay_untouched(target, layout):
    x = unusual_layouts()[layout]
    idx = np.array([2, 0], np.int32)
    idx.setflags(write=False)
    before = x.copy()
    step = program("gather", target)
    y, dx = step(x=x, idx=idx)
    want_y, want_dx = gather_oracle(np.asarray(x, np.float32), idx)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(idx, [2, 0])


@pytest.mark.parametrize("target", TARGETS)
def test_feeds_are_never_written(target):
    """Outputs that could reuse a feed's memory (x + 1 in place) must not: the caller owns it."""
    with gc.Graph("no_write"):
        x = gc.param("x", (3,))
        y = gc.exp(x) + 1.0
    step = Program([y, x * 2.0], target)
    x_value = np.array([0.0, 1.0, -1.0], np.float32)
    got_y, got_double = step(x=x_value)
    np.testing.assert_allclose(got_y, np.exp(np.array([0.0, 1.0, -1.0])) + 1, rtol=1e-6)
    np.testing.assert_array_equal(got_double, [0.0, 2.0, -2.0])
    np.testing.assert_array_equal(x_value, [0.0, 1.0, -1.0])


# -- index values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("idx, bad", [
    ([4, 0], 4), ([0, -5], -5), ([2**31 - 1, 0], 2**31 - 1), ([-2**31, 1], -2**31),
])
def test_gather_index_out_of_range(target, idx, bad):
    step = program("gather", target)
    message = rf"IndexingMultiAxisVec: index value {bad} .*size 4"
    with pytest.raises(IndexOutOfRangeError, match=message):
        step(x=X43, idx=np.array(idx, np.int32))
    assert_gather_works(step, [-1, -4])  # negative indices wrap once, as in numpy


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pos", [[0, 4, 1], [0, -5, 1], [2**40, 0, 0], [0, 0, -2**40]])
def test_scatter_index_out_of_range(target, pos):
    step = program("scatter", target)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    v = np.arange(6, dtype=np.float32).reshape(2, 3) + 10
    with pytest.raises(IndexOutOfRangeError, match=r"index value -?\d+ .*axis 1 of size 4"):
        step(x=x, pos=np.array(pos, np.int64), v=v)
    good = np.array([3, -1, 0], np.int64)  # -1 wraps to 3: a repeated position
    added, updated = step(x=x, pos=good, v=v)
    want_added = x.copy()
    np.add.at(want_added, (slice(None), good), v)
    want_updated = x.copy()
    want_updated[:, [3, 0]] = 2 * v[:, [1, 2]]  # the last write to position 3 wins
    np.testing.assert_array_equal(added, want_added)
    np.testing.assert_array_equal(updated, want_updated)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("labels, bad", [
    ([0, 4, 1], 4), ([0, -1, 1], -1), ([2**31 - 1, 0, 0], 2**31 - 1)])
def test_one_hot_index_out_of_range_and_negative(target, labels, bad):
    """One-hot indexing does not wrap negatives (op-reference §8.1): -1 is an error."""
    step = program("one_hot", target)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(IndexOutOfRangeError, match=rf"IndexingOneHot: index value {bad} "):
        step(x=x, labels=np.array(labels, np.int32))
    good = np.array([3, 0, 2], np.int32)
    picked, placed, dx = step(x=x, labels=good)
    rows = np.arange(3)
    np.testing.assert_array_equal(picked, x[rows, good])
    want_placed = x.copy()
    want_placed[rows, good] = 10 * x[rows, good]
    np.testing.assert_array_equal(placed, want_placed)
    want_dx = np.zeros_like(x)
    want_dx[rows, good] = 1
    np.testing.assert_array_equal(dx, want_dx)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [4, -1])
def test_cross_entropy_label_out_of_range_names_the_labels_feed_and_the_line(target, bad):
    """Every target words it the same: the loss, the labels feed, the user's line, the bad
    value and the valid range (not the internal gather)."""
    step = program("cross_entropy", target)
    z = np.zeros((3, 4), np.float32)
    want = (f"cross_entropy (labels from feed 'labels', at {CROSS_ENTROPY_LINE}): "
            f"label {bad} is outside the valid range [0, 4)")
    with pytest.raises(IndexOutOfRangeError) as caught:
        step(z=z, labels=np.array([0, bad, 1], np.int32))
    assert str(caught.value) == want
    loss, _ = step(z=z, labels=np.array([0, 3, 1], np.int32))
    # uniform logits: every log p is -log C; the smoothing term weighs all 4 classes (Σw = 10)
    # over the picked weights 1 + 4 + 2
    np.testing.assert_allclose(loss, np.log(4.0) * (0.9 + 0.1 * 10 / 4 * 3 / 7), rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mat_idx, bad", [([0, 2, 1], 2), ([0, -1, 1], -1)])
def test_warp_mat_idx_out_of_range(target, mat_idx, bad):
    step = program("warp_with_mat_idx", target)
    src = np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3)
    shift = np.array([[1, 0, 1], [0, 1, 0], [0, 0, 1]], np.float32)  # out[h, w] = src[h, w + 1]
    mat = np.stack([shift] * 3)
    message = rf"WarpPerspective: mat_idx value {bad} is (outside \[0, 2\)|out of range .*size 2)"
    with pytest.raises(IndexOutOfRangeError, match=message):
        step(src=src, mat=mat, mat_idx=np.array(mat_idx, np.int32))
    (out,) = step(src=src, mat=mat, mat_idx=np.array([1, 0, 1], np.int32))
    np.testing.assert_allclose(out, src[[1, 0, 1]][:, :, :2, 1:3], rtol=1e-6)


# -- non-finite and huge warp matrices ------------------------------------------------------------

NON_FINITE = {
    "nan-scale": [[np.nan, 0, 0], [0, 1, 0]],
    "inf-shift": [[1, 0, np.inf], [0, 1, 0]],
    "minus-inf": [[1, 0, 0], [0, -np.inf, 0]],
    "huge": [[1e30, 0, 0], [0, 1e30, 0]],
    "far-away": [[1, 0, -1e10], [0, 1, 3e9]],
    "beyond-int32": [[1, 0, 2.5e9], [0, 1, -2.5e9]],
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(NON_FINITE))
def test_warp_matrix_with_non_finite_or_huge_values(target, name):
    """Coordinates that are not finite, or too large for an integer, must not turn into a
    memory address: the result is the documented one (NaN outside CONSTANT mode; far
    coordinates reflect), computed here by an independent per-pixel loop."""
    mat = np.array([NON_FINITE[name]], np.float32)
    src = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    out, dsrc, dmat = program("warp_affine", target)(src=src, mat=mat)
    affine = np.concatenate([mat[0], [[0, 0, 1]]]).astype(np.float32)
    want = warp_oracle(src[0, :, :, 0], affine, (2, 2), "reflect")
    for label, value, oracle_value in (("out", out[0, :, :, 0], want[0]),
                                       ("dsrc", dsrc[0, :, :, 0], want[1]),
                                       ("dmat", dmat[0], want[2][:2])):
        assert_close(value, oracle_value.astype(np.float32), rtol=1e-5, atol=1e-5, label=label)


BAD_PERSPECTIVE = {
    "nan-shift": [[1, 0, np.nan], [0, 1, 0], [0, 0, 1]],
    "zero-denominator": [[1, 0, 0], [0, 1, 0], [0, 0, 0]],
    "inf-denominator": [[1, 0, 0], [0, 1, 0], [0, 0, np.inf]],
    "huge-shift": [[1, 0, 1e30], [0, 1, -1e30], [0, 0, 1]],
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(BAD_PERSPECTIVE))
def test_constant_border_turns_bad_coordinates_into_border_val(target, name):
    """CONSTANT mode: a non-finite pixel is border_val, and no gradient flows from it (§9.2)."""
    mat = np.array([BAD_PERSPECTIVE[name]], np.float32)
    src = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    out, dsrc = program("warp_constant", target)(src=src, mat=mat)
    want_out, want_dsrc, _ = warp_oracle(src[0, 0], mat[0], (2, 2), "constant", border_val=0.5,
                                         cotangent=lambda value: 1.0)
    assert_close(out[0, 0], want_out.astype(np.float32), rtol=1e-6, label="out")
    assert_close(dsrc[0, 0], want_dsrc.astype(np.float32), rtol=1e-6, label="dsrc")


def warp_oracle(image: np.ndarray, mat: np.ndarray, out_hw, mode: str, border_val: float = 0.0,
                cotangent=lambda value: 2 * value):
    """Per-pixel bilinear warp of one single-channel image by a 3×3 float32 matrix (op-reference
    §9.2, in float32 arithmetic), and the gradients of a loss whose derivative at an output
    pixel is `cotangent(value)`: wrt the image (§9.4) and wrt the matrix (§9.5, skipping
    non-finite terms). `mode` is "reflect" or "constant". A non-finite coordinate gives NaN
    (border_val in CONSTANT) and no gradient; taps far outside are folded with Python
    integers, which cannot overflow. As in every backend, the second tap is floor(xs) + 1 in
    float32, so beyond 2**24 it is the first tap again and ∂out/∂xs is 0 there (§9.2's integer
    x0 + 1 would differ). Returns (out, d image, d mat) in float64."""
    h, w = image.shape
    m = [np.float32(v) for v in mat.reshape(9)]

    def tap(p: int, n: int) -> tuple[int, bool]:
        if mode == "constant":
            return min(max(p, 0), n - 1), 0 <= p < n
        p %= 2 * n
        return (p if p < n else 2 * n - 1 - p), True

    out, dimage, dmat = np.empty(out_hw), np.zeros(image.shape), np.zeros(9)
    for oh in range(out_hw[0]):
        for ow in range(out_hw[1]):
            x, y = np.float32(ow), np.float32(oh)
            with np.errstate(all="ignore"):
                den = m[6] * x + m[7] * y + m[8]
                xs, ys = (m[0] * x + m[1] * y + m[2]) / den, (m[3] * x + m[4] * y + m[5]) / den
            out[oh, ow] = border_val if mode == "constant" else np.nan
            if not (np.isfinite(xs) and np.isfinite(ys)):
                continue
            x0, y0 = np.floor(xs), np.floor(ys)
            ax, ay = float(xs - x0), float(ys - y0)
            taps, values = [], []  # order (y0, x0), (y0, x0+1), (y0+1, x0), (y0+1, x0+1)
            for y_tap, wy in ((y0, 1 - ay), (y0 + np.float32(1), ay)):
                for x_tap, wx in ((x0, 1 - ax), (x0 + np.float32(1), ax)):
                    (r, row_ok), (c, col_ok) = tap(int(y_tap), h), tap(int(x_tap), w)
                    valid = row_ok and col_ok
                    taps.append((r, c, wy * wx, valid))
                    values.append(float(image[r, c]) if valid else border_val)
            value = sum(t[2] * v for t, v in zip(taps, values))
            if not np.isfinite(value):
                continue
            out[oh, ow] = value
            g = cotangent(value)
            for r, c, weight, valid in taps:
                if valid:
                    dimage[r, c] += weight * g
            v00, v01, v10, v11 = values
            d_xs = (1 - ay) * (v01 - v00) + ay * (v11 - v10)
            d_ys = (1 - ax) * (v10 - v00) + ax * (v11 - v01)
            xs, ys, den = float(xs), float(ys), float(den)
            with np.errstate(all="ignore"):
                terms = g * np.array([d_xs * ow, d_xs * oh, d_xs, d_ys * ow, d_ys * oh, d_ys,
                                      -(d_xs * xs + d_ys * ys) * ow, -(d_xs * xs + d_ys * ys) * oh,
                                      -(d_xs * xs + d_ys * ys)]) / den
            dmat += np.where(np.isfinite(terms), terms, 0.0)
    return out, dimage, dmat.reshape(3, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_empty_feeds_slices_and_reductions(target):
    """Size-0 values are valid: an empty slice written back, reductions over an empty axis
    (SUM 0, PRODUCT 1, MEAN NaN, as numpy), and empty feeds. Found by the random-graph fuzz:
    the CUDA code generator divided by the size of an empty axis."""
    with gc.Graph("empty"):
        x = gc.param("x", (3,))
        rows = gc.input("rows", (2, 0))
        columns = gc.input("columns", (0, 3))
        unchanged = gc.index_update(x, slice(0, 0), x[0:0] + x.mean())
        outputs = [unchanged, rows.sum(axis=1) + x[:2], columns.sum(axis=0), rows.mean(axis=1),
                   rows.prod(axis=1)]
    step = Program(outputs, target)
    x_value = np.array([1, 2, 3], np.float32)
    got = step(x=x_value, rows=np.zeros((2, 0), np.float32), columns=np.zeros((0, 3), np.float32))
    want = [x_value, x_value[:2], np.zeros(3), np.full(2, np.nan), np.ones(2)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w.astype(np.float32))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_results_the_caller_holds_are_never_rewritten(target):
    """A later call of a compiled step must not write into arrays an earlier call returned while
    the caller still holds them (or a view of them), and no two outputs share memory with each
    other or with a feed. (The reference interpreter hands back its values as they are.)"""
    with gc.Graph("results"):
        x = gc.param("x", (3,))
        y = gc.exp(x) * 2.0
        dx = gc.grad((y * y).sum(), x)
    step = Program([y, y, x, dx], target)
    first_x = np.array([0.0, 1.0, 2.0], np.float32)
    first = step(x=first_x)
    tail_view = first[0][1:]
    step(x=np.array([3.0, 4.0, 5.0], np.float32))
    want_y = 2 * np.exp(first_x.astype(np.float64))
    np.testing.assert_allclose(first[0], want_y, rtol=1e-6)
    np.testing.assert_allclose(tail_view, want_y[1:], rtol=1e-6)
    np.testing.assert_allclose(first[3], 2 * want_y * want_y, rtol=1e-5)
    first[0][0] = -1.0  # the caller owns what it got: writing it changes nothing else
    assert first[1][0] == pytest.approx(2.0) and first[2][0] == 0.0 and first_x[0] == 0.0


def single_index_ops():
    """Programs that hold one indexing op each, so no other op's check can stand in for its own;
    each with a good feed and the numpy value it must give, and a bad feed."""
    with gc.Graph("gather_gradient_only"):
        x = gc.param("x", (4, 3))
        idx = gc.input("idx", (3,), "int32")
        (dx,) = gc.grad(x[idx].sum(), [x])  # a scatter-add of ones: the gather itself is pruned
    good = np.array([1, -1, 1], np.int32)
    counts = np.zeros((4, 3), np.float32)
    np.add.at(counts, good, 1.0)
    yield "gather-gradient", [dx], {"idx": good}, [counts], {"idx": np.array([1, 4, 0], np.int32)}
    with gc.Graph("scatter_add_only"):
        x = gc.param("x", (5,))
        pos = gc.input("pos", (2,), "int64")
        added = gc.index_add(x, pos, 1.0)
    x_value = np.arange(5, dtype=np.float32)
    want = x_value.copy()
    np.add.at(want, [-5, 0], 1.0)
    yield ("scatter-add", [added], {"x": x_value, "pos": np.array([-5, 0], np.int64)}, [want],
           {"x": x_value, "pos": np.array([0, -6], np.int64)})
    with gc.Graph("scatter_set_only"):
        x = gc.param("x", (5,))
        pos = gc.input("pos", (2,), "int32")
        updated = gc.index_update(x, pos, -1.0)
    want = x_value.copy()
    want[[4, 2]] = -1.0
    yield ("scatter-set", [updated], {"x": x_value, "pos": np.array([4, 2], np.int32)}, [want],
           {"x": x_value, "pos": np.array([5, 2], np.int32)})
    with gc.Graph("set_one_hot_only"):
        x = gc.param("x", (2, 3))
        labels = gc.input("labels", (2,), "int32")
        placed = gc.indexing_set_one_hot(x, labels, gc.full((2,), 7.0), axis=1)
    x_value = np.zeros((2, 3), np.float32)
    want = np.array([[0, 0, 7], [7, 0, 0]], np.float32)
    yield ("set-one-hot", [placed], {"x": x_value, "labels": np.array([2, 0], np.int32)}, [want],
           {"x": x_value, "labels": np.array([2, 3], np.int32)})


SINGLE_INDEX_OPS = {name: rest for name, *rest in single_index_ops()}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(SINGLE_INDEX_OPS))
def test_every_indexing_op_checks_its_own_indices(target, name):
    outputs, good, want, bad = SINGLE_INDEX_OPS[name]
    step = Program(outputs, target)
    x_feed = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)} if name == "gather-gradient" else {}
    with pytest.raises(IndexOutOfRangeError, match=r"index value -?\d+ is out"):
        step(**x_feed, **bad)
    for got, expected in zip(step(**x_feed, **good), want):
        np.testing.assert_array_equal(got, expected)
