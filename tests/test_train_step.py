"""`gc.optim` and `gc.train_step` against plain numpy implementations of torch.optim's
documented update rules (float64, 20 steps, the learning rate changed between calls), the
state updated in place (the caller's arrays are the executable's buffers) and no per-call
allocation proportional to the parameters."""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu.buffers import ALIGN

from oracle import assert_close

BATCH, FEATURES, UNITS = 5, 4, 3
STEPS = 20


def build_model(dtype="float64"):
    """loss = Σ tanh(x·W + b) ⊙ y: a gradient numpy can write by hand."""
    with gc.Graph("tanh_layer") as graph:
        x = gc.input("x", (BATCH, FEATURES), dtype)
        y = gc.input("y", (BATCH, UNITS), dtype)
        w = gc.param("w", (FEATURES, UNITS), dtype)
        b = gc.param("b", (UNITS,), dtype)
        loss = (gc.tanh(x @ w + b) * y).sum()
    return graph, loss, [w, b]


def numpy_loss_and_grads(params, x, y):
    h = np.tanh(x @ params["w"] + params["b"])
    dz = (1 - h * h) * y
    return float((h * y).sum()), {"w": x.T @ dz, "b": dz.sum(axis=0)}


def numpy_sgd(params, grads, state, lr, t, momentum=0.0, dampening=0.0, nesterov=False,
              weight_decay=0.0):
    """torch.optim.SGD's documented algorithm."""
    for name, p in params.items():
        g = grads[name] + weight_decay * p
        if momentum:
            b = g.copy() if t == 1 else momentum * state[name] + (1 - dampening) * g
            state[name] = b
            g = g + momentum * b if nesterov else b
        params[name] = p - lr * g


def numpy_adam(params, grads, state, lr, t, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
               decoupled=False):
    """torch.optim.Adam's (and, decoupled, AdamW's) documented algorithm."""
    beta1, beta2 = betas
    for name, p in params.items():
        g = grads[name]
        if decoupled:
            p = p - lr * weight_decay * p
        else:
            g = g + weight_decay * p
        m, v = state.setdefault(name, (np.zeros_like(p), np.zeros_like(p)))
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        state[name] = (m, v)
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        params[name] = p - lr * m_hat / (np.sqrt(v_hat) + eps)


CASES = {
    "sgd": (lambda: gc.optim.SGD(0.1), lambda *a: numpy_sgd(*a)),
    "sgd_momentum_dampening_decay": (
        lambda: gc.optim.SGD(0.1, momentum=0.9, dampening=0.3, weight_decay=0.01),
        lambda *a: numpy_sgd(*a, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov_decay": (
        lambda: gc.optim.SGD(0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
        lambda *a: numpy_sgd(*a, momentum=0.8, nesterov=True, weight_decay=0.02)),
    "adam_decay": (
        lambda: gc.optim.Adam(0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
        lambda *a: numpy_adam(*a, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    "adamw": (lambda: gc.optim.AdamW(0.01), lambda *a: numpy_adam(*a, weight_decay=0.01,
                                                                   decoupled=True)),
}


def learning_rate(k: int, default: float) -> float | None:
    """A schedule fed every other call (None: the optimizer's own lr)."""
    return None if k % 2 == 0 else default * 0.5 ** (k % 5)


def batches(rng):
    for _ in range(STEPS):
        yield rng.standard_normal((BATCH, FEATURES)), rng.standard_normal((BATCH, UNITS))


def initial(rng):
    return {"w": rng.standard_normal((FEATURES, UNITS)) * 0.5, "b": rng.standard_normal(UNITS) * 0.1}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_optimizer_follows_torch_documented_update_for_20_steps(case):
    make, oracle = CASES[case]
    optimizer = make()
    _, loss, params = build_model()
    step = gc.train_step(loss, params, optimizer)
    rng = np.random.default_rng(15)
    start = initial(rng)
    state = step.init(start)
    want, slots = {k: v.copy() for k, v in start.items()}, {}
    for k, (x, y) in enumerate(batches(rng)):
        lr = learning_rate(k, optimizer.lr)
        got_loss = step(state, lr=lr, x=x, y=y)
        want_loss, grads = numpy_loss_and_grads(want, x, y)
        oracle(want, grads, slots, optimizer.lr if lr is None else lr, k + 1)
        assert_close(np.float64(got_loss), np.float64(want_loss), rtol=1e-12, label=f"loss {k}")
    for name in want:
        assert_close(state[name], want[name], rtol=1e-12, label=name)
    assert state["step"] == STEPS


def test_state_arrays_are_updated_in_place_and_calls_allocate_nothing_per_parameter():
    _, loss, params = build_model()
    step = gc.train_step(loss, params, gc.optim.Adam(0.01))
    rng = np.random.default_rng(3)
    state = step.init(initial(rng))
    held = dict(state)  # the caller's own references to the state's arrays
    assert sorted(state) == ["b", "b.exp_avg", "b.exp_avg_sq", "step", "w", "w.exp_avg",
                             "w.exp_avg_sq"]
    # each array starts on a pair of cache lines, as the runtime's own (buffers.empty)
    assert [state[name].ctypes.data % ALIGN for name in sorted(state)] == [0] * len(state)
    with pytest.raises(gc.FeedError, match=r"'w' has shape \(3,\), expected"):
        step.init({**initial(rng), "w": np.zeros(3)})
    assert step.executable.donated_in_place == frozenset(step.executable.donate)
    data = list(batches(rng))
    step(state, x=data[0][0], y=data[0][1])  # the first call may allocate the loss's array
    before = step.executable.allocations
    for x, y in data[1:4]:
        step(state, x=x, y=y)
    assert step.executable.allocations == before
    for name, array in held.items():
        assert state[name] is array and np.shares_memory(state[name], array)
    assert not np.array_equal(held["w.exp_avg"], 0)
    assert held["step"] == 4


def test_a_donation_the_plan_cannot_honour_is_copied_into_the_feed():
    """The loss's reduction and w's update share one loop over w, and a reduction reads
    every element before the loop ends, so w cannot be overwritten there: the update is
    computed apart and copied into the caller's array."""
    with gc.Graph():
        w = gc.param("w", (3,), "float64")
        x = gc.input("x", (3,), "float64")
        loss = (w * x).sum()
        w_new = w - 0.5 * x
    step = gc.compile([loss, w_new], donate={1: "w"})
    assert step.donate == {1: "w"} and step.donated_in_place == frozenset()
    w0 = np.array([1.0, 2.0, 3.0])
    w_arr, xv = w0.copy(), np.array([0.5, -1.0, 2.0])
    got_loss, got_new = step(w=w_arr, x=xv)
    assert got_new is w_arr
    assert_close(w_arr, w0 - 0.5 * xv, rtol=1e-15)
    assert_close(np.asarray(got_loss), np.float64(w0 @ xv), rtol=1e-15)


def test_donated_feed_must_be_the_callers_writeable_array():
    with gc.Graph():
        w = gc.param("w", (3,), "float64")
        out = w * 0.5
    step = gc.compile([out], donate={0: "w"})
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(gc.FeedError, match="'w' is updated in place"):
        step(w=frozen)
    with pytest.raises(gc.FeedError, match="'w' is updated in place"):
        step(w=np.ones(6)[::2])


def test_train_step_refuses_state_names_taken_by_the_graph_and_non_params():
    with gc.Graph():
        x = gc.input("step", (2,), "float64")
        w = gc.param("w", (2,), "float64")
        loss = (w * x).sum()
    with pytest.raises(gc.GraphError, match=r"\['step'\] are the training state's"):
        gc.train_step(loss, [w], gc.optim.SGD(0.1))
    with pytest.raises(gc.GraphError, match="must be a gc.param"):
        gc.train_step(loss, [x], gc.optim.SGD(0.1))


def batch_norm_model():
    """Σ batch_norm(x·W)·y in training mode, whose running statistics are state the step
    updates without training them (train_step's `updates`)."""
    with gc.Graph("bn_layer"):
        x = gc.input("x", (BATCH, FEATURES), "float64")
        y = gc.input("y", (BATCH, UNITS), "float64")
        w = gc.param("w", (FEATURES, UNITS), "float64")
        gamma, beta = gc.param("gamma", (UNITS,), "float64"), gc.param("beta", (UNITS,), "float64")
        mean, var = gc.input("mean", (UNITS,), "float64"), gc.input("var", (UNITS,), "float64")
        out, new_mean, new_var = gc.batch_norm(x @ w, gamma, beta, mean, var, momentum=0.2)
        loss = (out * y).sum()
    return loss, [w, gamma, beta], {"mean": new_mean, "var": new_var}


def numpy_batch_norm_step(params, stats, x, y, lr, momentum=0.2, eps=1e-5):
    """One SGD step of `batch_norm_model` in plain numpy: batch statistics, torch's
    momentum convention and unbiased running variance."""
    z = x @ params["w"]
    mu, var = z.mean(axis=0), z.var(axis=0)
    inv = 1 / np.sqrt(var + eps)
    zhat = (z - mu) * inv
    dzhat = y * params["gamma"]
    dz = inv * (dzhat - dzhat.mean(axis=0) - zhat * (dzhat * zhat).mean(axis=0))
    grads = {"w": x.T @ dz, "gamma": (y * zhat).sum(axis=0), "beta": y.sum(axis=0)}
    for name, g in grads.items():
        params[name] = params[name] - lr * g
    n = len(z)
    stats["mean"] = (1 - momentum) * stats["mean"] + momentum * mu
    stats["var"] = (1 - momentum) * stats["var"] + momentum * var * n / (n - 1)


def test_updates_write_batch_norm_statistics_back_in_place():
    loss, params, updates = batch_norm_model()
    step = gc.train_step(loss, params, gc.optim.SGD(0.05), updates=updates)
    rng = np.random.default_rng(11)
    start = {"w": rng.standard_normal((FEATURES, UNITS)), "gamma": np.ones(UNITS),
             "beta": np.zeros(UNITS), "mean": np.zeros(UNITS), "var": np.ones(UNITS)}
    state = step.init(start)
    held = dict(state)
    want = {k: start[k].copy() for k in ("w", "gamma", "beta")}
    stats = {k: start[k].copy() for k in ("mean", "var")}
    for x, y in list(batches(rng))[:5]:
        step(state, x=x, y=y)
        numpy_batch_norm_step(want, stats, x, y, 0.05)
    for name, value in {**want, **stats}.items():
        assert state[name] is held[name]
        assert_close(state[name], value, rtol=1e-12, label=name)
    with pytest.raises(gc.FeedError, match=r"no initial value for \['var'\]"):
        step.init({k: v for k, v in start.items() if k != "var"})


def test_updates_are_checked_against_the_inputs_they_replace():
    loss, params, updates = batch_norm_model()
    with pytest.raises(gc.GraphError, match="'moving' is no input of the graph"):
        gc.train_step(loss, params, gc.optim.SGD(0.1), updates={"moving": updates["mean"]})
    with pytest.raises(gc.GraphError, match="'w' is a parameter"):
        gc.train_step(loss, params, gc.optim.SGD(0.1), updates={"w": updates["mean"]})
    with loss.graph:
        wrong = updates["mean"].reshape(1, UNITS)
    with pytest.raises(gc.GraphError, match=r"updates\['mean'\] is float64\[1, 3\], but input 'mean' "
                       r"is float64\[3\]"):
        gc.train_step(loss, params, gc.optim.SGD(0.1), updates={"mean": wrong})


def test_optimizer_arguments_are_checked_as_torch_checks_them():
    with pytest.raises(ValueError, match="nesterov"):
        gc.optim.SGD(0.1, nesterov=True)
    with pytest.raises(ValueError, match="beta2"):
        gc.optim.Adam(0.1, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="learning rate"):
        gc.optim.AdamW(-1.0)


def test_cuda_train_step_keeps_the_state_on_the_device_and_matches_numpy():
    from gradcompiler.backends.numba_cuda.device import is_device_array

    _, loss, params = build_model()
    optimizer = gc.optim.AdamW(0.02, weight_decay=0.1)
    step = gc.train_step(loss, params, optimizer, target="cuda")
    rng = np.random.default_rng(7)
    start = initial(rng)
    state = step.init(start)
    held = dict(state)
    want, slots = {k: v.copy() for k, v in start.items()}, {}
    allocated = []
    for k, (x, y) in enumerate(list(batches(rng))[:3]):
        lr = learning_rate(k, optimizer.lr)
        got_loss = step(state, lr=lr, x=x, y=y)
        allocated.append(step.executable.allocations[1])
        want_loss, grads = numpy_loss_and_grads(want, x, y)
        numpy_adam(want, grads, slots, optimizer.lr if lr is None else lr, k + 1,
                   weight_decay=0.1, decoupled=True)
        assert_close(np.float64(got_loss), np.float64(want_loss), rtol=1e-12, label=f"loss {k}")
    for name in want:
        assert is_device_array(state[name]) and state[name] is held[name]
        assert_close(state[name].copy_to_host(), want[name], rtol=1e-12, label=name)
    assert step.executable.donated_in_place == frozenset(step.executable.donate)
    # per call only the loss's own device array (a returned value is never reused)
    assert np.diff(allocated).tolist() == [8, 8]


TORCH_OPTIMIZERS = {
    "sgd_momentum_dampening_decay": ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    "sgd_nesterov_decay": ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    "adam_decay": ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    "adamw": ("AdamW", dict(lr=0.01)),
}


@pytest.mark.parametrize("case", sorted(TORCH_OPTIMIZERS))
def test_each_optimizer_equals_torch_optim_itself(case):
    """The same 20 steps through torch.optim, where torch is installed (`make bench-peers`),
    its learning rate set per step as ours is fed."""
    torch = pytest.importorskip("torch", reason="torch.optim is an optional peer (make bench-peers)")
    name, options = TORCH_OPTIMIZERS[case]
    optimizer = CASES[case][0]()
    _, loss, params = build_model()
    step = gc.train_step(loss, params, optimizer)
    rng = np.random.default_rng(16)
    start = initial(rng)
    state = step.init(start)
    w, b = (torch.tensor(start[k], requires_grad=True) for k in ("w", "b"))
    theirs = getattr(torch.optim, name)([w, b], **options)
    for k, (x, y) in enumerate(batches(rng)):
        lr = learning_rate(k, optimizer.lr)
        step(state, lr=lr, x=x, y=y)
        for group in theirs.param_groups:
            group["lr"] = options["lr"] if lr is None else lr
        theirs.zero_grad()
        (torch.tanh(torch.tensor(x) @ w + b) * torch.tensor(y)).sum().backward()
        theirs.step()
    assert_close(state["w"], w.detach().numpy(), rtol=1e-12)
    assert_close(state["b"], b.detach().numpy(), rtol=1e-12)
