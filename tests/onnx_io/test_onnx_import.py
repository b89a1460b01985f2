"""gc.from_onnx on models written with onnx.helper: what it returns, values against
onnxruntime, gradients wrt the imported params against float64 finite differences, the
compiled CPU step against the reference, and every refusal naming what it is about."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import gradcompiler as gc
from gradcompiler.errors import OnnxError, UnsupportedOnnxOp

from onnx_models import cnn, mlp, transformer_block
from oracle import assert_close


def _onnxruntime(model, **feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_mlp_import_parts_and_values(rng):
    model = mlp(np.float32)
    m = gc.from_onnx(model, shapes={"x": (5, 6)})
    assert list(m.inputs) == ["x"] and m.inputs["x"].shape == (5, 6)
    assert sorted(m.params) == sorted(i.name for i in model.graph.initializer)
    assert all(m.params[k].shape == m.initializers[k].shape for k in m.params)
    assert m.outputs[0].shape == (5, 3) and m.opset == 17
    x = rng.standard_normal((5, 6)).astype(np.float32)
    got = gc.evaluate(m.outputs, {"x": x, **m.param_feeds()})[0]
    assert_close(got, _onnxruntime(model, x=x)[0], rtol=1e-5)


def test_mlp_gradients_wrt_params_finite_differences(rng):
    m = gc.from_onnx(mlp(np.float64), shapes={"x": (4, 6)})
    with m.graph:
        labels = gc.input("labels", (4,), "int32")
        loss = gc.cross_entropy(m.outputs[0], labels)
    feeds = {"x": rng.standard_normal((4, 6)), "labels": np.array([0, 2, 1, 2], np.int32),
             **m.param_feeds()}
    report = gc.check_grads(loss, list(m.params.values()), feeds)
    assert report.ok and len(report.results) == len(m.params)


def test_transformer_block_folds_shape_arithmetic_and_matches_onnxruntime(rng):
    model = transformer_block(np.float32)
    m = gc.from_onnx(model, shapes={"x": (2, 4, 8)})
    ops = {type(n.op).__name__ for n in m.graph.nodes.values()}
    assert "Reshape" in ops  # the reshapes got their target shapes as numbers
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)
    got = gc.evaluate(m.outputs, {"x": x, **m.param_feeds()})[0]
    assert_close(got, _onnxruntime(model, x=x)[0], rtol=1e-5, scaled_atol=1e-5)


def test_transformer_block_gradients_and_compiled_step(rng):
    m = gc.from_onnx(transformer_block(np.float64), shapes={"x": (2, 4, 8)})
    with m.graph:
        loss = gc.mean(m.outputs[0] * m.outputs[0])
    params = list(m.params.values())
    feeds = {"x": rng.standard_normal((2, 4, 8)), **m.param_feeds()}
    assert gc.check_grads(loss, params, feeds).ok
    grads = gc.grad(loss, params)
    step = gc.compile([loss, *grads], target="cpu")
    for got, want in zip(step(feeds), gc.evaluate([loss, *grads], feeds)):
        assert_close(got, want, rtol=1e-9, scaled_atol=1e-12)


def _cnn_step(dtype, batch=3):
    m = gc.from_onnx(cnn(dtype), shapes={"x": (batch, 2, 6, 6)})
    with m.graph:
        loss = gc.cross_entropy(m.outputs[0], gc.input("labels", (batch,), "int32"))
    return m, loss


def test_cnn_matches_onnxruntime(rng):
    model = cnn(np.float32)
    m = gc.from_onnx(model, shapes={"x": (3, 2, 6, 6)})
    x = rng.standard_normal((3, 2, 6, 6)).astype(np.float32)
    got = gc.evaluate(m.outputs, {"x": x, **m.param_feeds()})[0]
    assert_close(got, _onnxruntime(model, x=x)[0], rtol=1e-5, scaled_atol=1e-6)


def test_cnn_gradients_wrt_params_and_compiled_step(rng):
    m, loss = _cnn_step(np.float64)
    params = list(m.params.values())
    feeds = {"x": rng.standard_normal((3, 2, 6, 6)), "labels": np.array([0, 4, 2], np.int32),
             **m.param_feeds()}
    report = gc.check_grads(loss, params, feeds)
    assert report.ok and len(report.results) == len(params) == 8
    grads = gc.grad(loss, params)
    step = gc.compile([loss, *grads], target="cpu")
    for got, want in zip(step(feeds), gc.evaluate([loss, *grads], feeds)):
        assert_close(got, want, rtol=1e-9, scaled_atol=1e-12)


def _pool_model(op_type, shape, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * len(shape))
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    return helper.make_model(helper.make_graph([node], "pool", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("op_type, attrs", [
    ("MaxPool", {"pads": [0, 1, 2, 0], "ceil_mode": 1}),
    ("MaxPool", {"pads": [2, 2, 2, 2]}),
    ("AveragePool", {"pads": [0, 1, 2, 0], "ceil_mode": 1, "count_include_pad": 1}),
    ("AveragePool", {"pads": [1, 2, 2, 1], "ceil_mode": 1, "count_include_pad": 0}),
    ("AveragePool", {"pads": [2, 2, 2, 2], "count_include_pad": 0}),
    ("AveragePool", {"auto_pad": "SAME_LOWER", "strides": [2, 3], "count_include_pad": 0}),
    ("MaxPool", {"auto_pad": "VALID", "strides": [2, 1]}),
])
def test_pooling_padding_the_op_cannot_take_matches_onnxruntime(rng, op_type, attrs):
    """Asymmetric or over-half-kernel padding, made explicit before the op, and ceil_mode's
    last window cropped to ONNX's output size."""
    model = _pool_model(op_type, (2, 3, 7, 8), kernel_shape=[3, 3],
                        **{"strides": [2, 2], **attrs})
    m = gc.from_onnx(model)
    x = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    want = _onnxruntime(model, x=x)[0]
    got = gc.evaluate(m.outputs, {"x": x})[0]
    assert_close(got, want, rtol=1e-6, scaled_atol=1e-6)


@pytest.mark.parametrize("attrs, match", [
    ({"dilations": [2, 2]}, r"MaxPool node .*attribute dilations=\[2, 2\] is not supported"),
    ({"auto_pad": "SAME"}, r"attribute auto_pad='SAME' is not supported"),
])
def test_pooling_refusals_name_the_attribute(attrs, match):
    with pytest.raises(OnnxError, match=match):
        gc.from_onnx(_pool_model("MaxPool", (1, 1, 5, 5), kernel_shape=[2, 2], **attrs))


def test_a_3d_convolution_is_refused_naming_the_rank():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 5)
    w = numpy_helper.from_array(np.ones((1, 1, 2, 2, 2), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv3d")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxError, match=r"Conv node 'conv3d' .*3-d input .*2-d \(N, C, H, W\)"):
        gc.from_onnx(model)


def test_names_from_the_model_never_reach_generated_code(rng):
    """Feed and node names are user strings: a name that is Python code runs as data."""
    name = 'x"); import os; os.system("false"); ("\n'
    x_info = helper.make_tensor_value_info(name, TensorProto.FLOAT, [3])
    y_info = helper.make_tensor_value_info("y'\\", TensorProto.FLOAT, [3])
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w\n}{")
    node = helper.make_node("Mul", [name, "w\n}{"], ["y'\\"], name="n'; raise SystemExit")
    model = helper.make_model(helper.make_graph([node], "g\"", [x_info], [y_info], [w]))
    m = gc.from_onnx(model)
    x = rng.standard_normal(3).astype(np.float32)
    got = gc.compile(m.outputs, target="cpu")({name: x, **m.param_feeds()})[0]
    assert_close(got, x * np.arange(3, dtype=np.float32), rtol=1e-7)


def _single(op_type, inputs, attrs=None, dtype=TensorProto.FLOAT, shape=(2, 3), opset=17):
    infos = [helper.make_tensor_value_info(i, dtype, list(shape)) for i in inputs]
    out = helper.make_tensor_value_info("out", dtype, list(shape))
    node = helper.make_node(op_type, inputs, ["out"], name="the_node", **(attrs or {}))
    graph = helper.make_graph([node], "g", infos, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unsupported_op_names_type_node_opset_and_the_list():
    with pytest.raises(UnsupportedOnnxOp) as err:
        gc.from_onnx(_single("Hardmax", ["x"]))
    message = str(err.value)
    assert "Hardmax" in message and "'the_node'" in message and "opset 17" in message
    assert "supported: Abs, Add," in message and "Where" in message


def test_unsupported_attribute_value_is_named():
    with pytest.raises(OnnxError, match=r"Gelu node 'the_node'.*approximate='fast'"):
        gc.from_onnx(_single("Gelu", ["x"], {"approximate": "fast"}, opset=20))
    with pytest.raises(OnnxError, match=r"ArgMax.*select_last_index_typo|select_last_index_typo.*ArgMax"):
        gc.from_onnx(_single("ArgMax", ["x"], {"select_last_index_typo": 1}))


def test_symbolic_dimension_without_a_size_names_input_and_dimension():
    with pytest.raises(OnnxError, match=r"input 'x': dimension 0 'batch' is symbolic"):
        gc.from_onnx(mlp())
    with pytest.raises(OnnxError, match=r"shapes\['x'\] = \(4, 7\) does not fit"):
        gc.from_onnx(mlp(), shapes={"x": (4, 7)})


def test_truncated_and_non_onnx_files(tmp_path):
    data = mlp().SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxError, match="truncated.onnx.* is not an ONNX model"):
        gc.from_onnx(truncated)
    text = tmp_path / "notes.onnx"
    text.write_text("hello, this is not a model\n")
    with pytest.raises(OnnxError, match="notes.onnx.* is not an ONNX model"):
        gc.from_onnx(str(text))
    with pytest.raises(OnnxError, match="cannot read file"):
        gc.from_onnx(tmp_path / "missing.onnx")


def test_initializer_of_a_dtype_the_project_lacks():
    model = mlp(np.float32)
    half = numpy_helper.from_array(np.ones(3, np.float16), "layer2.bias")
    model.graph.initializer[-1].CopyFrom(half)
    with pytest.raises(OnnxError, match="initializer 'layer2.bias' has element type FLOAT16"):
        gc.from_onnx(model, shapes={"x": (2, 6)})


def test_opset_below_13_is_refused():
    with pytest.raises(OnnxError, match="opset 12; opsets 13 and later"):
        gc.from_onnx(_single("Relu", ["x"], opset=12))


def test_shape_input_from_data_asks_for_its_value(rng):
    infos = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
             helper.make_tensor_value_info("shape", TensorProto.INT64, [2])]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 2])
    node = helper.make_node("Reshape", ["x", "shape"], ["out"], name="r")
    model = helper.make_model(helper.make_graph([node], "g", infos, [out]))
    with pytest.raises(OnnxError, match=r"graph input 'shape'.*values=\{'shape': \.\.\.\}"):
        gc.from_onnx(model)
    m = gc.from_onnx(model, values={"shape": np.array([3, 2])})
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert list(m.inputs) == ["x"]
    assert_close(gc.evaluate(m.outputs[0], x=x), x.reshape(3, 2), rtol=0)


def test_without_onnx_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnx", None)
    with pytest.raises(OnnxError, match=r"pip install 'gradcompiler\[onnx\]'"):
        gc.from_onnx(b"")


def test_model_from_bytes_and_path(tmp_path, rng):
    model = mlp(np.float32)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    values = [gc.evaluate(gc.from_onnx(source, shapes={"x": (2, 6)}).outputs[0],
                          {"x": x, **gc.from_onnx(model, shapes={"x": (2, 6)}).param_feeds()})
              for source in (model.SerializeToString(), path, str(path))]
    for value in values[1:]:
        assert_close(value, values[0], rtol=0)
