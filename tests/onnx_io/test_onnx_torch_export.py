"""Models exported by torch.onnx.export (dynamo=False) import, and their loss and every
parameter gradient match torch autograd on the same weights: float64 within 1e-9 relative,
float32 within 1e-4. Needs torch (not a test dependency of this project)."""

from __future__ import annotations

import io

import pytest

import gradcompiler as gc

from oracle import assert_close

torch = pytest.importorskip("torch", reason="torch (for torch.onnx.export) is an optional peer, "
                            "not a test dependency: make bench-peers installs it")


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class PreLNBlock(torch.nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


CASES = {"cnn": (SmallCNN, (3, 2, 6, 6)), "transformer": (PreLNBlock, (2, 4, 8))}


def _distinct(module):
    """Random values for every parameter and buffer. torch.onnx.export merges initializers of
    equal value: a fresh norm layer's weight (ones) and bias (zeros) would become one
    initializer with the running statistics and the other norm layer's, whose gradient is
    then the sum over its uses, not any one torch parameter's. Trained weights differ."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        for name, b in module.named_buffers():
            if b.is_floating_point():
                b.copy_(torch.rand_like(b) + 0.5 if name.endswith("var") else torch.randn_like(b) * 0.1)
    return module


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_export_matches_autograd(case, dtype, rtol):
    torch.manual_seed(0)
    module_class, shape = CASES[case]
    module = _distinct(module_class().to(dtype).eval())
    x = torch.randn(shape, dtype=dtype)
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, input_names=["x"], output_names=["y"],
                      dynamo=False, do_constant_folding=False)
    m = gc.from_onnx(buffer.getvalue())
    with m.graph:
        loss = gc.mean(m.outputs[0] * m.outputs[0])
    names = list(m.params)
    values = gc.evaluate([loss, *gc.grad(loss, [m.params[n] for n in names])],
                         {"x": x.numpy(), **m.param_feeds()})
    torch_loss = (module(x) ** 2).mean()
    torch_loss.backward()
    by_name = dict(module.named_parameters())
    assert_close(values[0], torch_loss.detach().numpy(), rtol=rtol)
    checked = 0
    for name, got in zip(names, values[1:]):
        if name in by_name:
            assert_close(got, by_name[name].grad.numpy(), rtol=rtol)
            checked += 1
    assert checked == len(by_name)
