"""gc.to_onnx: a differentiated graph (forward and backward nodes, the loss and its
gradients as outputs) written as ONNX, run by onnxruntime, against gc's own values; every
export rule uses ONNX ops of the import table; a graph with an op that has no ONNX
equivalent is refused naming it."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import gradcompiler as gc
from gradcompiler.errors import OnnxError
from gradcompiler.onnx.op_table import TABLE

from onnx_models import cnn, mlp, transformer_block
from oracle import assert_close


def _run(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def _training_step(model, shape, loss_fn):
    m = gc.from_onnx(model, shapes={"x": shape})
    with m.graph:
        loss = loss_fn(m)
    params = list(m.params.values())
    return m, [loss, *gc.grad(loss, params)]


def _check_against_onnxruntime(outputs, feeds, tmp_path):
    path = tmp_path / "step.onnx"
    model = gc.to_onnx(outputs, path, names=["loss"] + [f"grad_{k}" for k in
                                                        range(len(outputs) - 1)])
    assert path.exists() and {n.op_type for n in model.graph.node} <= set(TABLE)
    want = gc.evaluate(outputs, feeds)
    got = _run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-5, scaled_atol=1e-6)
    return model


def test_exported_mlp_training_step_runs_in_onnxruntime(rng, tmp_path):
    def loss(m):
        labels = gc.input("labels", (4,), "int32")
        return gc.cross_entropy(m.outputs[0], labels)

    m, outputs = _training_step(mlp(np.float32), (4, 6), loss)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32),
             "labels": np.array([0, 2, 1, 2], np.int32), **m.param_feeds()}
    model = _check_against_onnxruntime(outputs, feeds, tmp_path)
    assert [o.name for o in model.graph.output][:2] == ["loss", "grad_0"]


def test_exported_cnn_training_step_runs_in_onnxruntime(rng, tmp_path):
    """Conv, batch norm, relu, max-pool, linear, cross-entropy: the backward graph holds
    ConvolutionBackwardFilter (a Conv) and MAX PoolingBackward (MaxPool's Indices and a
    ScatterElements); the input is not differentiated, so no ConvolutionBackwardData."""
    def loss(m):
        return gc.cross_entropy(m.outputs[0], gc.input("labels", (3,), "int32"))

    m, outputs = _training_step(cnn(np.float32), (3, 2, 6, 6), loss)
    feeds = {"x": rng.standard_normal((3, 2, 6, 6)).astype(np.float32),
             "labels": np.array([1, 4, 0], np.int32), **m.param_feeds()}
    model = _check_against_onnxruntime(outputs, feeds, tmp_path)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and {"MaxPool", "ScatterElements"} <= set(ops)


def test_exported_training_mode_batch_norm_step_runs_in_onnxruntime(rng, tmp_path):
    """Training-mode batch norm has a backward of its own (a custom gradient): its node exports
    as the Identity of its forward value, and the backward as the ops it is made of."""
    with gc.Graph("bn_train"):
        x = gc.input("x", (4, 3, 2, 5))
        gamma, beta = gc.param("gamma", (3,)), gc.param("beta", (3,))
        t = gc.input("t", (4, 3, 2, 5))
        loss = (gc.relu(gc.batch_norm(x, gamma, beta)) * t).sum()
        outputs = [loss, *gc.grad(loss, [x, gamma, beta])]
    feeds = {"x": rng.standard_normal((4, 3, 2, 5)).astype(np.float32),
             "t": rng.standard_normal((4, 3, 2, 5)).astype(np.float32),
             "gamma": rng.standard_normal(3).astype(np.float32),
             "beta": rng.standard_normal(3).astype(np.float32)}
    model = _check_against_onnxruntime(outputs, feeds, tmp_path)
    assert "Identity" in {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_exported_convolution_and_pooling_gradients_run_in_onnxruntime(rng, tmp_path, ceil_mode):
    """Grouped, strided, dilated, padded convolutions and both average modes: every export
    rule of the family, with geometry where the filter gradient's taps overhang the kernel
    and ceil_mode's last window hangs past the image."""
    with gc.Graph("convs"):
        x = gc.param("x", (2, 4, 9, 8))
        w = gc.param("w", (6, 2, 3, 2))
        wt = gc.param("wt", (6, 3, 2, 3))
        y = gc.conv2d(x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
        up = gc.conv_transpose2d(y, wt, stride=2, padding=1, output_padding=1, groups=3)
        a = gc.avg_pool2d(up, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=True)
        b = gc.avg_pool2d(up, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=False)
        c = gc.max_pool2d(up, (3, 2), (2, 3), (1, 1), ceil_mode=ceil_mode)
        loss = gc.sum(a * b) + gc.sum(gc.tanh(c))
        outputs = [loss, *gc.grad(loss, [x, w, wt])]
    feeds = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in
             (("x", x.shape), ("w", w.shape), ("wt", wt.shape))}
    _check_against_onnxruntime(outputs, feeds, tmp_path)


def test_exported_transformer_block_step_runs_in_onnxruntime(rng, tmp_path):
    m, outputs = _training_step(transformer_block(np.float32), (2, 4, 8),
                                lambda m: gc.mean(m.outputs[0] * m.outputs[0]))
    feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32), **m.param_feeds()}
    _check_against_onnxruntime(outputs, feeds, tmp_path)


def test_exported_compiled_executable_matches_its_own_values(rng, tmp_path):
    m, outputs = _training_step(mlp(np.float32), (3, 6),
                                lambda m: gc.mean(m.outputs[0] * m.outputs[0]))
    step = gc.compile(outputs, target="cpu")
    feeds = {"x": rng.standard_normal((3, 6)).astype(np.float32), **m.param_feeds()}
    got = _run(gc.to_onnx(step), feeds)
    for g, w in zip(got, step(feeds)):
        assert_close(g, w, rtol=1e-5, scaled_atol=1e-6)


def test_export_round_trips_through_the_importer(rng):
    m, outputs = _training_step(transformer_block(np.float64), (1, 4, 8),
                                lambda m: gc.sum(gc.tanh(m.outputs[0])))
    feeds = {"x": rng.standard_normal((1, 4, 8)), **m.param_feeds()}
    back = gc.from_onnx(gc.to_onnx(outputs))
    got = gc.evaluate(back.outputs, {k: feeds[k] for k in back.inputs})
    for g, w in zip(got, gc.evaluate(outputs, feeds)):
        assert_close(g, w, rtol=1e-12)


def test_an_op_without_onnx_equivalent_is_named():
    with gc.Graph("g"):
        x = gc.input("x", (4,))
        y = gc.floor(x) * 2.0
    with pytest.raises(OnnxError, match=r"Elemwise FLOOR at .*test_onnx_export.py.* no ONNX "):
        gc.to_onnx(y)


def test_max_pooling_of_a_values_input_is_named():
    """Second-order max-pooling gradients pool one tensor at another's maxima; ONNX has no
    such op, so the export says which node it is."""
    with gc.Graph("g"):
        x = gc.input("x", (1, 1, 4, 4))
        pooled = gc.max_pool2d(x, 2)
        (dx,) = gc.grad(gc.sum(pooled * pooled), [x])
        (ddx,) = gc.grad(gc.sum(dx * dx), [x])
    with pytest.raises(OnnxError, match=r"%\d+ Pooling MAX at .*test_onnx_export.py.*: max pooling "
                       r"of a second \(values\) input"):
        gc.to_onnx(ddx)
