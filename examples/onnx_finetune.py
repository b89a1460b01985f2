"""Fine-tune a model that was built elsewhere: export it to ONNX, import it, train it.

With torch installed, a small torch classifier is exported with torch.onnx.export; without
it, the same shape of model is written with onnx.helper. Either way gc.from_onnx turns
the file into a Graph whose initializers are trainable params; a cross-entropy loss is
attached, the training step (forward, backward and the SGD update, `gc.train_step`) is
compiled for the CPU, a few steps run on synthetic clustered data, and the DOT of the
backward graph is written next to the model.

    python examples/onnx_finetune.py [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import gradcompiler as gc

FEATURES, HIDDEN, CLASSES, BATCH = 8, 16, 3, 32


def export_with_torch(path: str) -> bool:
    """Write a torch MLP to `path`; False when torch is not installed."""
    try:
        import torch
    except ImportError:
        return False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.GELU(),
                                torch.nn.LayerNorm(HIDDEN), torch.nn.Linear(HIDDEN, CLASSES))
    torch.onnx.export(model, (torch.zeros(BATCH, FEATURES),), path, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    return True


def export_with_onnx_helper(path: str) -> None:
    """The same model written node by node, as torch.onnx.export writes it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "fc1.weight": rng.standard_normal((HIDDEN, FEATURES)) / np.sqrt(FEATURES),
        "fc1.bias": np.zeros(HIDDEN), "norm.weight": np.ones(HIDDEN),
        "norm.bias": np.zeros(HIDDEN),
        "fc2.weight": rng.standard_normal((CLASSES, HIDDEN)) / np.sqrt(HIDDEN),
        "fc2.bias": np.zeros(CLASSES),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("Gelu", ["h"], ["a"]),
        helper.make_node("LayerNormalization", ["a", "norm.weight", "norm.bias"], ["n"]),
        helper.make_node("Gemm", ["n", "fc2.weight", "fc2.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)


def batch(rng: np.random.Generator, centres: np.ndarray):
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    x = centres[labels] + 0.5 * rng.standard_normal((BATCH, FEATURES))
    return x.astype(np.float32), labels


def main(steps: int = 60, out: str | None = None, lr: float = 0.2) -> list[float]:
    out = out or tempfile.mkdtemp(prefix="onnx_finetune_")
    path = os.path.join(out, "classifier.onnx")
    source = "torch.onnx.export" if export_with_torch(path) else "onnx.helper"
    if source == "onnx.helper":
        export_with_onnx_helper(path)
    model = gc.from_onnx(path, shapes={"x": (BATCH, FEATURES)})
    with model.graph:
        labels = gc.input("labels", (BATCH,), "int32")
        loss = gc.cross_entropy(model.outputs[0], labels)
    names = list(model.params)
    step = gc.train_step(loss, [model.params[n] for n in names], gc.optim.SGD(lr), target="cpu")
    step.to_dot(os.path.join(out, "backward.dot"), stage="backward")
    state = step.init(model.param_feeds())
    rng = np.random.default_rng(1)
    centres = 2.0 * rng.standard_normal((CLASSES, FEATURES))
    losses = []
    for _ in range(steps):
        x, y = batch(rng, centres)
        losses.append(step(state, x=x, labels=y))
    print(f"model from {source}: {len(names)} params, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
          f"backward graph in {os.path.join(out, 'backward.dot')}")
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    main(args.steps, args.out)
