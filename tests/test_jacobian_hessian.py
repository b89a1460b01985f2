"""Dense Jacobians and Hessians of small compositions (`gc.jacobian`, `gc.hessian`).

Oracles: central differences in float64, element by element, written here; the closed
forms of softmax's Jacobian (diag p − p pᵀ) and log-sum-exp's Hessian (the same, of the
softmax of its input); torch.func where torch is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

from oracle import assert_close

RNG = np.random.default_rng(17)
FEEDS = {"x": RNG.standard_normal((2, 3)), "w": RNG.standard_normal((3, 4)),
         "b": RNG.standard_normal(4), "g": RNG.standard_normal(4) + 1.0}


def _graph(build):
    with gc.Graph("small"):
        x = gc.param("x", (2, 3), "float64")
        w = gc.param("w", (3, 4), "float64")
        b = gc.param("b", (4,), "float64")
        g = gc.param("g", (4,), "float64")
        params = {"x": x, "w": w, "b": b, "g": g}
        return build(**params), params


COMPOSITIONS = {
    "mlp_layer": lambda x, w, b, g: gc.tanh(x @ w + b),
    "softmax": lambda x, w, b, g: gc.softmax(x @ w, -1),
    "layer_norm": lambda x, w, b, g: gc.layer_norm(x @ w) * g + b,
}


def numeric_jacobian(output, name: str, h: float = 1e-6) -> np.ndarray:
    """d output / d feed `name` by central differences, one input element at a time."""
    base = FEEDS[name]
    columns = []
    for j in range(base.size):
        step = np.zeros(base.size)
        step[j] = h
        step = step.reshape(base.shape)
        plus = gc.evaluate(output, {**FEEDS, name: base + step})
        minus = gc.evaluate(output, {**FEEDS, name: base - step})
        columns.append(((plus - minus) / (2 * h)).reshape(-1))
    return np.stack(columns, axis=1).reshape(output.shape + base.shape)


@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
def test_jacobians_match_finite_differences(composition, mode):
    output, params = _graph(COMPOSITIONS[composition])
    for name, param in params.items():
        jacobian = gc.jacobian(output, param, mode=mode)
        assert jacobian.shape == output.shape + param.shape
        assert_close(gc.evaluate(jacobian, FEEDS), numeric_jacobian(output, name),
                     rtol=1e-6, atol=1e-8, label=f"d {composition} / d {name} ({mode})")


def test_softmax_jacobian_is_its_closed_form():
    with gc.Graph("softmax"):
        z = gc.param("z", (2, 5), "float64")
        p = gc.softmax(z, -1)
    z_value = RNG.standard_normal((2, 5))
    p_value = gc.evaluate(p, {"z": z_value})
    expected = np.zeros((2, 5, 2, 5))
    for row in range(2):
        expected[row, :, row, :] = np.diag(p_value[row]) - np.outer(p_value[row], p_value[row])
    for mode in ("auto", "reverse", "forward"):
        assert_close(gc.evaluate(gc.jacobian(p, z, mode=mode), {"z": z_value}), expected,
                     rtol=1e-12, atol=1e-15)


def test_logsumexp_hessian_is_its_closed_form():
    with gc.Graph("lse"):
        z = gc.param("z", (6,), "float64")
        loss = gc.log(gc.exp(z * 2.0).sum())
    z_value = RNG.standard_normal(6)
    p = np.exp(2 * z_value) / np.exp(2 * z_value).sum()
    assert_close(gc.evaluate(gc.hessian(loss, z), {"z": z_value}), 4.0 * (np.diag(p) - np.outer(p, p)),
                 rtol=1e-12, atol=1e-15)


def _shifted(a: str, i: int, da: float, b: str, j: int, db: float) -> dict[str, np.ndarray]:
    """Copies of feeds `a` and `b` with element i of a moved by da and element j of b by db."""
    values = {k: FEEDS[k].copy() for k in (a, b)}
    values[a].reshape(-1)[i] += da
    values[b].reshape(-1)[j] += db
    return values


def test_hessian_blocks_of_an_mlp_loss_match_second_differences():
    output, params = _graph(lambda x, w, b, g: (gc.tanh(x @ w + b) * g).sum())
    wrt = [params["w"], params["b"]]
    blocks = gc.hessian(output, wrt)
    h = 1e-4

    def f(**changes):
        return float(gc.evaluate(output, {**FEEDS, **changes}))

    for a, row in zip(("w", "b"), blocks):
        for b, block in zip(("w", "b"), row):
            got = gc.evaluate(block, FEEDS).reshape(FEEDS[a].size, FEEDS[b].size)
            expected = np.zeros_like(got)
            for i in range(FEEDS[a].size):
                for j in range(FEEDS[b].size):
                    corners = [f(**_shifted(a, i, si * h, b, j, sj * h)) for si, sj in
                               ((1, 1), (1, -1), (-1, 1), (-1, -1))]
                    expected[i, j] = (corners[0] - corners[1] - corners[2] + corners[3]) / (4 * h * h)
            assert_close(got, expected, rtol=1e-5, atol=1e-6, label=f"H[{a}][{b}]")
    w_b, b_w = (gc.evaluate(blocks[i][j], FEEDS) for i, j in ((0, 1), (1, 0)))
    assert_close(w_b.reshape(12, 4), b_w.reshape(4, 12).T, rtol=1e-12)  # H is symmetric


def test_cnn_layer_jacobians_and_hessian_match_finite_differences():
    """A convolution layer (conv → batch norm → relu → max-pool) and the Hessian of a loss
    through one: forward mode through the convolution family's rules of every order."""
    rng = np.random.default_rng(23)
    feeds = {"img": rng.standard_normal((1, 2, 5, 5)), "k": rng.standard_normal((2, 2, 3, 3)) * 0.5}
    with gc.Graph("cnn_layer"):
        img = gc.param("img", (1, 2, 5, 5), "float64")
        k = gc.param("k", (2, 2, 3, 3), "float64")
        gamma = gc.constant(np.array([1.5, 0.5]), "float64")
        beta = gc.constant(np.array([0.1, -0.2]), "float64")
        layer = gc.max_pool2d(gc.relu(gc.batch_norm(gc.conv2d(img, k, padding=1), gamma, beta)), 2)
        loss = (gc.tanh(gc.conv2d(img, k, stride=2)) ** 2).sum()
    h = 1e-6
    for name, param in (("img", img), ("k", k)):
        for mode in ("reverse", "forward"):
            jacobian = gc.evaluate(gc.jacobian(layer, param, mode=mode), feeds)
            columns = []
            for j in range(feeds[name].size):
                step = np.zeros(feeds[name].size)
                step[j] = h
                step = step.reshape(feeds[name].shape)
                plus = gc.evaluate(layer, {**feeds, name: feeds[name] + step})
                minus = gc.evaluate(layer, {**feeds, name: feeds[name] - step})
                columns.append(((plus - minus) / (2 * h)).reshape(-1))
            numeric = np.stack(columns, axis=1).reshape(layer.shape + feeds[name].shape)
            assert_close(jacobian, numeric, rtol=1e-5, atol=1e-7, label=f"d layer / d {name} ({mode})")
    hessian = gc.evaluate(gc.hessian(loss, k), feeds).reshape(36, 36)
    gradient = gc.grad(loss, k)
    columns = []
    for j in range(36):
        step = np.zeros(36)
        step[j] = h
        step = step.reshape(2, 2, 3, 3)
        plus = gc.evaluate(gradient, {**feeds, "k": feeds["k"] + step})
        minus = gc.evaluate(gradient, {**feeds, "k": feeds["k"] - step})
        columns.append(((plus - minus) / (2 * h)).reshape(-1))
    assert_close(hessian, np.stack(columns, axis=1), rtol=1e-5, atol=1e-7)
    assert_close(hessian, hessian.T, rtol=1e-10, atol=1e-12)


def test_a_jacobian_compiles():
    output, params = _graph(COMPOSITIONS["layer_norm"])
    jacobian = gc.jacobian(output, params["x"])
    assert_close(gc.compile(jacobian)(**FEEDS), gc.evaluate(jacobian, FEEDS), rtol=1e-10)


def test_jacobian_modes_are_checked():
    output, params = _graph(COMPOSITIONS["mlp_layer"])
    with pytest.raises(ValueError, match="mode must be"):
        gc.jacobian(output, params["x"], mode="sideways")


def test_against_torch_func():
    torch = pytest.importorskip("torch", reason="torch.func is an optional peer (make bench-peers)")
    output, params = _graph(COMPOSITIONS["mlp_layer"])
    x, w, b = (torch.tensor(FEEDS[k]) for k in ("x", "w", "b"))
    expected = torch.func.jacrev(lambda w: torch.tanh(x @ w + b))(w).numpy()
    assert_close(gc.evaluate(gc.jacobian(output, params["w"]), FEEDS), expected, rtol=1e-12)
    with gc.Graph("lse"):
        z = gc.param("z", (5,), "float64")
        loss = gc.log(gc.exp(z).sum())
    z_value = RNG.standard_normal(5)
    hessian = torch.func.hessian(lambda z: torch.logsumexp(z, 0))(torch.tensor(z_value)).numpy()
    assert_close(gc.evaluate(gc.hessian(loss, z), {"z": z_value}), hessian, rtol=1e-10, atol=1e-14)
