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

from onnx_models import mlp, transformer_block
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
