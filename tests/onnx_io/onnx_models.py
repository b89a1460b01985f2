"""Small ONNX models written with onnx.helper, as PyTorch's exporter would write them: an
MLP (Gemm, MatMul, Add, Relu, Tanh), a CNN (Conv, BatchNormalization in inference mode,
Relu, MaxPool, Flatten, Gemm) and a pre-LN transformer block (LayerNormalization, MatMul,
Softmax, Gelu, and the Shape → Gather → Unsqueeze → Concat → Reshape arithmetic around the
head split). Weights are initializers; the batch dimension is symbolic."""

from __future__ import annotations

import itertools

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _model(nodes, inputs, outputs, weights: dict[str, np.ndarray], name: str):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp(dtype=np.float64, sizes=(6, 8, 5, 3), seed=0):
    rng = np.random.default_rng(seed)
    elem = ELEM[dtype]
    weights = {}
    nodes = []
    h = "x"
    for k, (a, b) in enumerate(itertools.pairwise(sizes)):
        weights[f"layer{k}.weight"] = (rng.standard_normal((b, a)) / np.sqrt(a)).astype(dtype)
        weights[f"layer{k}.bias"] = (0.1 * rng.standard_normal(b)).astype(dtype)
        out = f"linear{k}"
        if k % 2 == 0:  # torch's Linear as Gemm with transB, and as MatMul + Add
            nodes.append(helper.make_node("Gemm", [h, f"layer{k}.weight", f"layer{k}.bias"],
                                          [out], name=f"/layer{k}/Gemm", transB=1))
        else:
            weights[f"layer{k}.weight"] = weights[f"layer{k}.weight"].T.copy()
            nodes += [helper.make_node("MatMul", [h, f"layer{k}.weight"], [out + "_mm"]),
                      helper.make_node("Add", [out + "_mm", f"layer{k}.bias"], [out])]
        if k < len(sizes) - 2:
            act = "Relu" if k % 2 == 0 else "Tanh"
            nodes.append(helper.make_node(act, [out], [f"act{k}"], name=f"/act{k}/{act}"))
            h = f"act{k}"
        else:
            h = out
    nodes.append(helper.make_node("Identity", [h], ["logits"]))
    x = helper.make_tensor_value_info("x", elem, ["batch", sizes[0]])
    y = helper.make_tensor_value_info("logits", elem, ["batch", sizes[-1]])
    return _model(nodes, [x], [y], weights, "mlp")


def cnn(dtype=np.float64, channels=2, filters=4, image=6, classes=5, seed=0):
    """conv 3x3 (pad 1) → batch norm → relu → max-pool 2x2 → flatten → linear, with the
    attributes torch.onnx.export writes for Conv2d, BatchNorm2d (after .eval()),
    MaxPool2d and Linear at opset 17."""
    rng = np.random.default_rng(seed)
    elem = ELEM[dtype]
    pooled = filters * (image // 2) ** 2
    weights = {
        "conv.weight": (rng.standard_normal((filters, channels, 3, 3)) / 4).astype(dtype),
        "conv.bias": (0.1 * rng.standard_normal(filters)).astype(dtype),
        "bn.weight": (1 + 0.1 * rng.standard_normal(filters)).astype(dtype),
        "bn.bias": (0.1 * rng.standard_normal(filters)).astype(dtype),
        "bn.running_mean": (0.1 * rng.standard_normal(filters)).astype(dtype),
        "bn.running_var": (1 + 0.2 * rng.random(filters)).astype(dtype),
        "fc.weight": (rng.standard_normal((classes, pooled)) / np.sqrt(pooled)).astype(dtype),
        "fc.bias": (0.1 * rng.standard_normal(classes)).astype(dtype),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "conv.weight", "conv.bias"], ["conv"], name="/conv/Conv",
          dilations=[1, 1], group=1, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        n("BatchNormalization", ["conv", "bn.weight", "bn.bias", "bn.running_mean",
                                 "bn.running_var"], ["bn"], name="/bn/BatchNormalization",
          epsilon=1e-5, momentum=0.9, training_mode=0),
        n("Relu", ["bn"], ["act"], name="/Relu"),
        n("MaxPool", ["act"], ["pool"], name="/MaxPool", ceil_mode=0, kernel_shape=[2, 2],
          pads=[0, 0, 0, 0], strides=[2, 2]),
        n("Flatten", ["pool"], ["flat"], name="/Flatten", axis=1),
        n("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="/fc/Gemm", alpha=1.0,
          beta=1.0, transB=1),
    ]
    x = helper.make_tensor_value_info("x", elem, ["batch", channels, image, image])
    y = helper.make_tensor_value_info("logits", elem, ["batch", classes])
    return _model(nodes, [x], [y], weights, "cnn")


def transformer_block(dtype=np.float64, tokens=4, dim=8, heads=2, hidden=16, seed=0):
    """y = x + attn(ln1(x)); out = y + W2·gelu(W1·ln2(y)), with heads split by a reshape
    whose target shape is computed from Shape as torch.onnx.export writes it."""
    rng = np.random.default_rng(seed)
    elem = ELEM[dtype]

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

    weights = {
        "ln1.weight": (1 + 0.1 * rng.standard_normal(dim)).astype(dtype),
        "ln1.bias": (0.1 * rng.standard_normal(dim)).astype(dtype),
        "ln2.weight": (1 + 0.1 * rng.standard_normal(dim)).astype(dtype),
        "ln2.bias": (0.1 * rng.standard_normal(dim)).astype(dtype),
        "attn.q": w(dim, dim), "attn.k": w(dim, dim), "attn.v": w(dim, dim),
        "attn.out": w(dim, dim), "mlp.fc1": w(dim, hidden), "mlp.fc2": w(hidden, dim),
        "mlp.fc1.bias": (0.1 * rng.standard_normal(hidden)).astype(dtype),
        "c_heads": np.array([heads], np.int64), "c_head_dim": np.array([dim // heads], np.int64),
        "c_dim": np.array([dim], np.int64), "c_zero": np.array(0, np.int64),
        "c_one": np.array(1, np.int64),
    }
    n = helper.make_node
    scale = numpy_helper.from_array(np.array(np.sqrt(dim // heads), dtype))
    nodes = [
        n("Constant", [], ["c_scale"], value=scale),
        n("LayerNormalization", ["x", "ln1.weight", "ln1.bias"], ["h1"], epsilon=1e-5),
        # batch and tokens from Shape, as the exporter writes x.view(B, T, H, D/H)
        n("Shape", ["h1"], ["shape"]),
        n("Gather", ["shape", "c_zero"], ["batch"], axis=0),
        n("Gather", ["shape", "c_one"], ["tokens"], axis=0),
        n("Unsqueeze", ["batch", "c_zero"], ["batch_1d"]),
        n("Unsqueeze", ["tokens", "c_zero"], ["tokens_1d"]),
        n("Concat", ["batch_1d", "tokens_1d", "c_heads", "c_head_dim"], ["split_shape"], axis=0),
        n("Concat", ["batch_1d", "tokens_1d", "c_dim"], ["merge_shape"], axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [n("MatMul", ["h1", f"attn.{name}"], [f"{name}_flat"]),
                  n("Reshape", [f"{name}_flat", "split_shape"], [f"{name}_heads"]),
                  n("Transpose", [f"{name}_heads"], [name],
                    perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3])]
    nodes += [
        n("MatMul", ["q", "k"], ["scores_raw"]),
        n("Div", ["scores_raw", "c_scale"], ["scores"]),
        n("Softmax", ["scores"], ["probs"], axis=-1),
        n("MatMul", ["probs", "v"], ["context_heads"]),
        n("Transpose", ["context_heads"], ["context_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["context_t", "merge_shape"], ["context"]),
        n("MatMul", ["context", "attn.out"], ["attended"]),
        n("Add", ["x", "attended"], ["y"]),
        n("LayerNormalization", ["y", "ln2.weight", "ln2.bias"], ["h2"], epsilon=1e-5),
        n("MatMul", ["h2", "mlp.fc1"], ["fc1_mm"]),
        n("Add", ["fc1_mm", "mlp.fc1.bias"], ["fc1"]),
        n("Gelu", ["fc1"], ["act"]),
        n("MatMul", ["act", "mlp.fc2"], ["fc2"]),
        n("Add", ["y", "fc2"], ["out"]),
    ]
    x = helper.make_tensor_value_info("x", elem, ["batch", tokens, dim])
    out = helper.make_tensor_value_info("out", elem, ["batch", tokens, dim])
    model = _model(nodes, [x], [out], weights, "block")
    model.opset_import[0].version = 20  # Gelu is in opset 20
    return model
