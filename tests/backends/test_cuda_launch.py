"""Launch overhead on the CUDA target: pre-bound launches (`numba_cuda.launch`) and CUDA graphs
(`numba_cuda.cuda_graphs`).

Numba's simulator has neither compiled specializations to bind nor a stream to capture, so
the parts that run on a GPU are pinned here through stand-ins that keep the real APIs'
contracts: a dispatcher with numba-cuda's `[grid, block, stream]`, `overloads`,
`typeof_pyval` and `_Kernel.launch(args, griddim, blockdim, stream, sharedmem)`, and a
capture whose graph does nothing until it is launched and then replays what was recorded
on the buffers it was recorded with (the two properties of a CUDA graph the runner relies
on). The compiled steps are checked against the reference interpreter and, for graphs,
against the same step run eagerly. Under `make gpu-check` (GRADCOMPILER_GPU_CHECK=1) the
pre-bound test checks the real binding on the device, and the last test captures real
graphs through CuPy.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cuda import require_cuda, simulator_active

from cuda_support import on_gpu_check
from oracle import assert_close

cuda = require_cuda()
from gradcompiler.backends.numba_cuda import cuda_graphs, executable  # noqa: E402
from gradcompiler.backends.numba_cuda.launch import PreboundKernel, bound_overload  # noqa: E402

ON_DEVICE = on_gpu_check(cuda)


# -- pre-bound launches -----------------------------------------------------------------------

class _Configured:
    """numba-cuda's `_LaunchConfiguration`: normalised dims, the stream, and a call that
    goes through the dispatcher."""

    def __init__(self, dispatcher, grid, block, stream):
        self.dispatcher = dispatcher
        self.griddim, self.blockdim = (grid, 1, 1), (block, 1, 1)
        self.stream, self.sharedmem = ("core", stream), 0
        self.pre_launch_callbacks = [lambda kernel, config: None] if dispatcher.callbacks else []

    def __call__(self, *args):
        dispatcher = self.dispatcher
        dispatcher.dispatches += 1
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        if types not in dispatcher.compiled:
            dispatcher.compiled[types] = _Compiled(dispatcher.log, dispatcher.sensitive_kernel)
        dispatcher.compiled[types].launch(args, self.griddim, self.blockdim, self.stream, self.sharedmem)


class _Compiled:
    """numba-cuda's `_Kernel`: `launch` runs it (here: out[:] = a + scale * b, on numpy)."""

    def __init__(self, log, launch_config_sensitive=False):
        self.log, self.launch_config_sensitive = log, launch_config_sensitive

    def launch(self, args, griddim, blockdim, stream, sharedmem):
        a, b, out, scale = args
        out[:] = a + scale * b
        self.log.append((griddim, blockdim, stream, sharedmem))


class _FakeOverloadDict(dict):
    """The simulator's `overloads`: a new, empty dict at every read, whose `[...]` answers a
    fake for any signature."""

    def __getitem__(self, key):
        return object()


class _Dispatcher:
    """numba-cuda's `CUDADispatcher` as `launch` uses it; the flags make the cases in which a
    launch must stay on the dispatcher."""

    def __init__(self, simulator=False, sensitive=False, sensitive_kernel=False, callbacks=False):
        self.simulator = simulator
        self.compiled = collections.OrderedDict()  # numba-cuda keeps its overloads in one
        self._launch_config_sensitive = sensitive
        self.sensitive_kernel, self.callbacks = sensitive_kernel, callbacks
        self.log = []
        self.dispatches = self.configures = 0

    @property
    def overloads(self):
        return _FakeOverloadDict() if self.simulator else self.compiled

    def __getitem__(self, configuration):
        self.configures += 1
        return _Configured(self, *configuration)

    @staticmethod
    def typeof_pyval(value):
        return (type(value).__name__, getattr(value, "dtype", None), getattr(value, "ndim", 0))


def _operands(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(5), rng.standard_normal(5), np.zeros(5)


def test_a_prebound_launch_goes_through_the_dispatcher_once_then_launches_the_compiled_kernel(monkeypatch):
    monkeypatch.delenv("GRADCOMPILER_CUDA_PREBIND", raising=False)
    dispatcher = _Dispatcher()
    launch = PreboundKernel(dispatcher, 3, 8)
    for call in range(4):
        a, b, out = _operands(call)
        launch(0, a, b, out, 2.0)
        assert_close(out, a + 2.0 * b, rtol=1e-15)  # the arguments reach the kernel, in order
    assert dispatcher.dispatches == 1 and dispatcher.configures == 1
    assert launch.bound is next(iter(dispatcher.overloads.values()))
    assert dispatcher.log == [((3, 1, 1), (8, 1, 1), ("core", 0), 0)] * 4  # the same configured launch
    stream = object()
    launch(stream, *_operands(9), 2.0)  # another stream: configured again, not resolved again
    assert dispatcher.dispatches == 1 and dispatcher.configures == 2
    assert dispatcher.log[-1][2] == ("core", stream)
    monkeypatch.setenv("GRADCOMPILER_CUDA_PREBIND", "0")  # the switch to measure without it
    assert PreboundKernel(dispatcher, 3, 8).prebind is False


def test_binding_finds_the_specialization_of_the_calls_argument_types():
    dispatcher = _Dispatcher()
    a, b, out = _operands(1)
    dispatcher[2, 4, 0](a.astype(np.float32), b.astype(np.float32), out.astype(np.float32), 1.0)
    dispatcher[2, 4, 0](a, b, out, 1.0)  # a second specialization, for float64
    kernel = bound_overload(dispatcher, dispatcher[2, 4, 0], (a, b, out, 1.0))
    assert kernel is dispatcher.overloads[tuple(dispatcher.typeof_pyval(x) for x in (a, b, out, 1.0))]
    assert bound_overload(dispatcher, dispatcher[2, 4, 0], (a, b, out, "other")) is None  # never compiled


@pytest.mark.parametrize("case", [dict(simulator=True), dict(sensitive=True), dict(sensitive_kernel=True),
                                  dict(callbacks=True), "prebind=False"], ids=str)
def test_launches_stay_on_the_dispatcher_where_binding_would_not_be_the_same_launch(case):
    """The simulator (no compiled kernels to bind; its configured launch is the kernel
    itself), launch-configuration-sensitive dispatchers or kernels, pre-launch callbacks,
    and a caller that asks not to bind (the debug mode)."""
    dispatcher = _Dispatcher(**case) if isinstance(case, dict) else _Dispatcher()
    launch = PreboundKernel(dispatcher, 3, 8, prebind=True if isinstance(case, dict) else False)
    for call in range(3):
        a, b, out = _operands(call)
        launch(0, a, b, out, -1.0)
        assert_close(out, a - b, rtol=1e-15)
    assert launch.bound is None
    assert dispatcher.dispatches == 3 and dispatcher.configures == 3


def _step_graph(rng):
    """Elementwise kernels, a row reduction (a generated kernel with a fold of partials), a
    tiled matmul, and a gather by a fed index (a device-side index check: not capturable)
    between them."""
    with gc.Graph("launches"):
        x, w = gc.input("x", (4, 6)), gc.input("w", (6, 3))
        idx = gc.input("idx", (5,), "int32")
        h = gc.tanh(x @ w) * 2.0 + 1.0
        picked = h[idx]
        outs = [h, (h * h).sum(axis=1), picked.sum(), gc.exp(picked - 1.0) @ gc.transpose(w)]
    return outs, lambda: {"x": rng.standard_normal((4, 6)).astype(np.float32),
                          "w": rng.standard_normal((6, 3)).astype(np.float32),
                          "idx": rng.integers(-4, 4, 5).astype(np.int32)}


def test_compiled_steps_bind_their_launches_on_a_device_and_stay_on_the_dispatcher_on_the_simulator():
    rng = np.random.default_rng(3)
    outputs, feeds_for = _step_graph(rng)
    step = gc.compile(outputs, target="cuda")
    for _ in range(2):
        feeds = feeds_for()
        for got, want in zip(step(to_host=True, **feeds), gc.evaluate(outputs, feeds)):
            assert_close(got, want, rtol=1e-5)
    kernels = [launch for launch in step._runner.launches if isinstance(launch, executable._KernelLaunch)]
    assert kernels and all(launch.kernel.resolved for launch in kernels)
    if simulator_active(cuda):
        assert all(launch.kernel.bound is None for launch in kernels)  # nothing compiled to bind
    else:  # the real specialization, whose launch later calls go to
        assert all(type(launch.kernel.bound).__name__ == "_Kernel" for launch in kernels)


def test_debug_mode_keeps_every_launch_on_the_dispatcher():
    outputs, feeds_for = _step_graph(np.random.default_rng(4))
    step = gc.compile(outputs, target="cuda", debug=True)
    step(to_host=True, **feeds_for())
    kernels = [launch for launch in step._runner.launches if isinstance(launch, executable._KernelLaunch)]
    assert all(not launch.kernel.prebind and launch.kernel.bound is None for launch in kernels)


# -- CUDA graphs ------------------------------------------------------------------------------

class _StandInCapture:
    """A CUDA graph's contract without CUDA: capturing runs nothing; launching the graph runs
    what was recorded, on the buffers it was recorded with."""

    def __init__(self):
        self.captured = self.launched = 0

    def capture(self, record):
        self.captured += 1
        return record

    def launch(self, graph, stream):
        self.launched += 1
        graph(stream)


def _with_graphs(monkeypatch, capture):
    monkeypatch.setattr(executable, "graph_capture", lambda option=None: capture)


@pytest.fixture
def tiled_matmuls(monkeypatch):
    """The tiled matmul kernel, which a graph can hold, on a device too: the default cuBLAS
    route runs eagerly there, and each product would end a segment of its own. The route is
    chosen once per process (`cublas.matmul_route`), so it is chosen again on both sides."""
    from gradcompiler.backends.numba_cuda import cublas

    monkeypatch.setenv("GRADCOMPILER_CUDA_MATMUL", "tiled")
    cublas.matmul_route.cache_clear()
    yield
    monkeypatch.delenv("GRADCOMPILER_CUDA_MATMUL")
    cublas.matmul_route.cache_clear()


def test_graphs_are_asked_for_and_never_planned_where_they_cannot_be_captured(monkeypatch, tiled_matmuls):
    monkeypatch.delenv(cuda_graphs.ENV, raising=False)
    assert cuda_graphs.graph_capture() is None
    assert cuda_graphs.unavailable_reason() == "off (GRADCOMPILER_CUDA_GRAPHS unset)"
    monkeypatch.setenv(cuda_graphs.ENV, "1")
    assert cuda_graphs.graph_capture(False) is None  # the option wins over the environment
    if simulator_active(cuda):
        assert cuda_graphs.graph_capture() is None and "simulator" in cuda_graphs.unavailable_reason()
    outputs, _ = _step_graph(np.random.default_rng(5))
    runner = gc.compile(outputs, target="cuda")._runner
    if simulator_active(cuda):
        assert runner.capture is None and "simulator" in runner.graph_status
    _with_graphs(monkeypatch, _StandInCapture())
    runner = gc.compile(outputs, target="cuda")._runner
    assert runner.capture is not None and runner.graph_status.startswith("on:")
    assert [capturable for capturable, _ in runner.segments] == [True, False, True]  # the gather runs eagerly
    assert gc.compile(outputs, target="cuda", debug=True)._runner.capture is None
    with gc.Graph("only a gather"):
        x, idx = gc.input("x", (4, 3)), gc.input("idx", (2,), "int32")
        gathered = x[idx]
    runner = gc.compile(gathered, target="cuda")._runner
    assert runner.capture is None and "no launch" in runner.graph_status


def test_replayed_graphs_equal_the_reference_and_the_eager_step_with_fresh_feeds_every_call(monkeypatch):
    rng = np.random.default_rng(6)
    outputs, feeds_for = _step_graph(rng)
    eager = gc.compile(outputs, target="cuda")
    capture = _StandInCapture()
    _with_graphs(monkeypatch, capture)
    step = gc.compile(outputs, target="cuda")
    runner = step._runner
    earlier = []
    for call in range(3):
        feeds = feeds_for()
        on_device = {k: cuda.to_device(v) for k, v in feeds.items()}
        got = step(on_device)
        want = gc.evaluate(outputs, feeds)
        for k, (g, e, w) in enumerate(zip(got, eager(to_host=True, **feeds), want)):
            assert_close(g.copy_to_host(), w, rtol=1e-5, label=f"call {call} output {k}")
            assert_close(g.copy_to_host(), e, rtol=1e-6, label=f"call {call} output {k} against eager")
        earlier.append((got, want))
        # the feeds were copied into the executable's own buffers, which the graphs hold
        for name in ("x", "w"):
            b = next(b for b, s in enumerate(runner.program.buffers) if s.role == "feed" and s.feed_name == name)
            assert runner._owned[b] is not on_device[name]
            np.testing.assert_array_equal(runner._owned[b].copy_to_host(), feeds[name].reshape(-1))
    assert runner.captures == 1 and capture.captured == 2  # two capturable segments, captured once
    assert capture.launched == 2 * 2  # replayed from the second call on
    for call, (got, want) in enumerate(earlier):  # no call overwrote an earlier call's outputs
        for k, (g, w) in enumerate(zip(got, want)):
            assert_close(g.copy_to_host(), w, rtol=1e-5, label=f"call {call} output {k}, kept")


def _sgd_problem():
    with gc.Graph("sgd"):
        x, w = gc.input("x", (3, 4)), gc.param("w", (4, 2))
        loss = ((x @ w) * (x @ w)).mean()
    return x, w, loss


def _numpy_sgd(w, x, lr):
    y = x @ w
    return float((y * y).mean()), w - lr * (2.0 / y.size) * (x.T @ y)


def test_a_train_step_under_graphs_captures_its_state_in_place_and_again_when_an_array_changes(monkeypatch):
    capture = _StandInCapture()
    _with_graphs(monkeypatch, capture)
    _, w, loss = _sgd_problem()
    step = gc.train_step(loss, [w], gc.optim.SGD(0.1), target="cuda")
    runner = step.executable._runner
    assert runner.capture is not None and runner.written_feeds  # w is updated in place
    rng = np.random.default_rng(7)
    want = rng.standard_normal((4, 2)).astype(np.float32).astype(np.float64)
    state = step.init({"w": want})
    held = state["w"]
    for call in range(4):
        if call == 2:  # a new array for the state: the graphs hold the old one's address
            state["w"] = cuda.to_device(state["w"].copy_to_host())
        x = rng.standard_normal((3, 4)).astype(np.float32)
        got_loss = step(state, x=x)
        want_loss, want = _numpy_sgd(want, x.astype(np.float64), 0.1)
        assert_close(np.float64(got_loss), np.float64(want_loss), rtol=1e-5, label=f"loss {call}")
        assert_close(state["w"].copy_to_host().astype(np.float64), want, rtol=1e-5, label=f"w after call {call}")
    assert held is not state["w"]
    assert runner.captures == 2  # once after the first call, once for the new array


def test_a_capture_that_fails_warns_once_and_the_step_runs_eagerly(monkeypatch):
    class Refusing(_StandInCapture):
        def capture(self, record):
            raise RuntimeError("operation not permitted when stream is capturing")

    _with_graphs(monkeypatch, Refusing())
    outputs, feeds_for = _step_graph(np.random.default_rng(8))
    step = gc.compile(outputs, target="cuda")
    with pytest.warns(RuntimeWarning, match="without CUDA graphs.*not permitted"):
        first = feeds_for()
        got = step(to_host=True, **first)
    for g, w in zip(got, gc.evaluate(outputs, first)):
        assert_close(g, w, rtol=1e-5)
    assert step._runner.capture is None and "capture failed" in step._runner.graph_status
    second = feeds_for()
    for g, w in zip(step(to_host=True, **second), gc.evaluate(outputs, second)):
        assert_close(g, w, rtol=1e-5)


@pytest.mark.skipif(not ON_DEVICE, reason="CUDA graphs need a GPU and CuPy: make gpu-check runs this")
def test_real_cuda_graphs_equal_the_reference(monkeypatch, tiled_matmuls):
    monkeypatch.setenv(cuda_graphs.ENV, "1")
    assert cuda_graphs.graph_capture() is not None, "make gpu-check needs CuPy (the cuda extra)"
    rng = np.random.default_rng(9)
    outputs, feeds_for = _step_graph(rng)
    step = gc.compile(outputs, target="cuda")
    assert step._runner.graph_status.startswith("on:"), step._runner.graph_status
    for call in range(3):
        feeds = feeds_for()
        for k, (g, w) in enumerate(zip(step(to_host=True, **feeds), gc.evaluate(outputs, feeds))):
            assert_close(g, w, rtol=1e-5, label=f"call {call} output {k}")
    assert step._runner.captures == 1
