"""One executable called from several threads at once: every result is checked against the
reference interpreter (`gc.evaluate`), each thread with feeds of its own.

An executable owns its buffers (arenas, scratch rows, the output arrays it hands out), so
calls are serialised by a lock per executable; without it, another thread's kernels write
into this thread's intermediates between two of its kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

import gradcompiler as gc

THREADS = 4
FEEDS_PER_THREAD = 5


def _step_outputs(rows: int, cols: int):
    """A small training step: two matmuls, a fused activation, a loss and its gradients, so
    one call runs several kernels and library steps through shared intermediate buffers."""
    with gc.Graph("concurrent"):
        x = gc.input("x", (rows, cols), "float64")
        w1, w2 = gc.param("w1", (cols, 4), "float64"), gc.param("w2", (4, 3), "float64")
        loss = gc.sum(gc.exp(gc.tanh(x @ w1) @ w2) * 0.5)
    return [loss, *gc.grad(loss, [x, w1, w2])]


def _feeds(seed: int, rows: int, cols: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(x=rng.standard_normal((rows, cols)), w1=rng.standard_normal((cols, 4)) * 0.5,
                w2=rng.standard_normal((4, 3)) * 0.5)


def _wrong_results(call: Callable, outputs, calls: int, rows: int, cols: int) -> list[str]:
    """Run `call(feeds)` from THREADS threads started together, `calls` times each, cycling
    through feeds of the thread's own; the description of every output unlike the reference's."""
    cases = {(t, k): _feeds(100 * t + k, rows, cols)
             for t in range(THREADS) for k in range(FEEDS_PER_THREAD)}
    wanted = {key: gc.evaluate(outputs, feeds) for key, feeds in cases.items()}
    wrong, errors = [], []
    barrier = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        try:
            barrier.wait()
            for n in range(calls):
                key = (t, n % FEEDS_PER_THREAD)
                for j, (got, want) in enumerate(zip(call(cases[key]), wanted[key])):
                    if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
                        wrong.append(f"thread {t} call {n} output {j}")
        except Exception as err:  # noqa: BLE001 - reported by the test, not lost in the thread
            errors.append(repr(err))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return wrong


def test_cpu_executable_called_from_four_threads_gives_every_result_right():
    outputs = _step_outputs(6, 5)
    step = gc.compile(outputs, target="cpu")
    wrong = _wrong_results(lambda feeds: step(**feeds), outputs, calls=300, rows=6, cols=5)
    assert not wrong, f"{len(wrong)} of {THREADS * 300 * len(outputs)} outputs wrong: {wrong[:5]}"


def test_cpu_results_held_by_one_thread_survive_other_threads_calls():
    """Outputs handed out are the caller's: calls from other threads never write into them."""
    outputs = _step_outputs(6, 5)
    step = gc.compile(outputs, target="cpu")
    feeds = _feeds(7, 6, 5)
    held = step(**feeds)
    assert not _wrong_results(lambda f: step(**f), outputs, calls=50, rows=6, cols=5)
    for got, want in zip(held, gc.evaluate(outputs, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_cuda_executable_called_from_four_threads_gives_every_result_right():
    """The same on the CUDA target (the simulator runs every GPU thread as a Python thread,
    so shapes are tiny and calls few)."""
    from gradcompiler.backends.numba_cuda import require_cuda

    require_cuda()
    outputs = _step_outputs(2, 3)
    step = gc.compile(outputs, target="cuda")
    wrong = _wrong_results(lambda feeds: step(to_host=True, **feeds), outputs, calls=5,
                           rows=2, cols=3)
    assert not wrong, wrong
