"""The peers the suite measures beside the compiled step.

A peer turns a workload's feeds into a `run()` that performs one whole step
(loss and every gradient) and returns only once the work is done, so that
the suite can time it like the compiled step. For a training-step workload
(one with an optimizer, `gpt`) a step is the forward, the backward and the
optimizer's update of the peer's own parameters, and the results are the loss
and the updated state. Peers:

* `numpy_manual`: the hand-written numpy steps of `manual.py`, always there;
* `torch_eager`: PyTorch autograd, written as a PyTorch user would
  (`F.cross_entropy`, `F.layer_norm`, `F.grid_sample`, `F.pixel_shuffle`,
  `F.conv2d`, `F.batch_norm`);
* `torch_compile`: the same loss through `torch.compile` (forward and the
  AOT-autograd backward compiled), gradients by `torch.autograd.grad`;
* `jax_jit`: `jax.jit(jax.value_and_grad(loss))`, idiomatic jax
  (`jax.nn`, `jax.scipy.ndimage.map_coordinates` for the warp,
  `jax.lax.conv_general_dilated` for the convolutions); it has no training
  step (its optimizers live in optax, not a dependency), so it skips those.

For a training step the torch peers do what a PyTorch training loop does:
`zero_grad`, the loss, `loss.backward()`, `optimizer.step()` with
torch.optim.AdamW built from the workload's settings; torch_compile compiles
the loss (forward and AOT-autograd backward) and the optimizer's step, as
PyTorch's "compiling the optimizer" recipe does.

A framework that is not installed is not an error: `available_peers` reports
it as skipped with a note. On target "cuda" the torch peers use the GPU when
torch sees one, and jax uses its default device; otherwise they run on the
CPU, and the peer's `device` says so.

The peers' losses are the workloads of benchmarks.md written again in each
framework's own idiom; the suite checks each peer's outputs against
`numpy_manual`, so a mistranslation shows up in the report, not as a fast
wrong number.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import manual
from .workloads import (
    CNN_BN_EPS,
    GPT_HEADS,
    GPT_LN_EPS,
    PIXEL_SHUFFLE_FACTOR,
    Workload,
    attention_scale,
    gpt_block_params,
)

PEER_NAMES = ("numpy_manual", "torch_eager", "torch_compile", "jax_jit")


@dataclass
class PreparedPeer:
    """One peer bound to one workload's feeds."""

    run: Callable[[], Any]                          # one step; returns when it is done
    to_numpy: Callable[[Any], list[np.ndarray]]     # run()'s result as [loss, *grads], or for
    device: str                                     # a training step [loss, *state]


@dataclass(frozen=True)
class Peer:
    name: str
    prepare: Callable[[Workload, Mapping[str, np.ndarray], str], PreparedPeer] | None
    note: str = ""          # why it is skipped, or what it runs on
    trains: bool = True     # has a training step (forward, backward, optimizer update)

    @property
    def available(self) -> bool:
        return self.prepare is not None


# -- numpy ---------------------------------------------------------------------------------------

def _prepare_numpy(work: Workload, feeds: Mapping[str, np.ndarray], target: str) -> PreparedPeer:
    if work.optimizer is not None:
        training = manual.AdamWTraining(work, feeds)
        return PreparedPeer(training, training.results, "cpu")
    step = manual.STEPS[work.name]
    return PreparedPeer(lambda: step(feeds), list, "cpu")


# -- torch ---------------------------------------------------------------------------------------

def _torch_losses(torch) -> dict[str, Callable[..., Any]]:
    functional = torch.nn.functional

    def mlp(x, labels, w1, b1, w2, b2, w3, b3):
        h = functional.relu(x @ w1 + b1)
        h = functional.relu(h @ w2 + b2)
        return functional.cross_entropy(h @ w3 + b3, labels)

    def layernorm_gelu(x, gamma, beta, r):
        h = functional.layer_norm(x, x.shape[-1:], gamma, beta, eps=manual.LAYER_NORM_EPS)
        return ((functional.gelu(h, approximate="tanh") + x) * r).sum()

    def attention(q, k, v, r):
        p = torch.softmax(q @ k.transpose(1, 2) / attention_scale(q.shape[-1]), dim=-1)
        return ((p @ v) * r).sum()

    def embedding(table, idx, r):
        return (torch.tanh(functional.embedding(idx, table)) * r).sum()

    def bcast_reduce(x, b, w):
        return (functional.relu(x + b) * w).sum()

    def spatial_transformer(img, mat, r):
        # pixel-space inverse map → grid_sample's normalised coordinates (align_corners=True);
        # REPLICATE is padding_mode="border" (op-reference §9.8)
        _, _, h, w = img.shape
        ow = torch.arange(w, dtype=img.dtype, device=img.device)
        oh = torch.arange(h, dtype=img.dtype, device=img.device)[:, None]
        m = mat[:, :, :, None, None]
        xs = m[:, 0, 0] * ow + m[:, 0, 1] * oh + m[:, 0, 2]
        ys = m[:, 1, 0] * ow + m[:, 1, 1] * oh + m[:, 1, 2]
        grid = torch.stack([2 * xs / (w - 1) - 1, 2 * ys / (h - 1) - 1], dim=-1)
        out = functional.grid_sample(img, grid, mode="bilinear", padding_mode="border",
                                     align_corners=True)
        return (out * r).sum()

    def pixel_shuffle(x):
        y = functional.pixel_shuffle(x, PIXEL_SHUFFLE_FACTOR)
        return (y * y).sum() / 2

    def cnn(x, labels, fc_w, fc_b, **p):
        def conv_bn(h, name, stride):
            z = functional.conv2d(h, p[f"{name}_w"], stride=stride, padding=1)
            return functional.batch_norm(z, None, None, p[f"{name}_gamma"], p[f"{name}_beta"],
                                         training=True, eps=CNN_BN_EPS)

        h = functional.relu(conv_bn(x, "stem", 1))
        for block in (1, 2):
            inner = functional.relu(conv_bn(h, f"res{block}a", 1))
            h = functional.relu(conv_bn(inner, f"res{block}b", 1) + h)
        h = functional.relu(conv_bn(h, "down", 2))
        pooled = functional.adaptive_avg_pool2d(h, 1).flatten(1)
        return functional.cross_entropy(pooled @ fc_w + fc_b, labels)

    def gpt(tokens, targets, wte, wpe, lnf_gamma, lnf_beta, head, **p):
        (b, t), e = tokens.shape, wte.shape[1]

        def norm(x, gamma, beta):
            return functional.layer_norm(x, (e,), gamma, beta, eps=GPT_LN_EPS)

        x = functional.embedding(tokens, wte) + wpe
        for k in range(sum(name.startswith("wq") for name in p)):
            ln1_gamma, ln1_beta, wq, wk, wv, wo, ln2_gamma, ln2_beta, up, down = (
                p[name] for name in gpt_block_params(k))
            a = norm(x, ln1_gamma, ln1_beta)
            q, key, v = ((a @ w).view(b, t, GPT_HEADS, e // GPT_HEADS).transpose(1, 2)
                         for w in (wq, wk, wv))
            o = functional.scaled_dot_product_attention(q, key, v, is_causal=True)  # scale 1/√head
            x = x + o.transpose(1, 2).reshape(b, t, e) @ wo
            x = x + functional.gelu(norm(x, ln2_gamma, ln2_beta) @ up, approximate="tanh") @ down
        logits = norm(x, lnf_gamma, lnf_beta) @ head
        return functional.cross_entropy(logits.view(b * t, -1), targets.view(-1))

    return dict(mlp=mlp, layernorm_gelu=layernorm_gelu, attention=attention, embedding=embedding,
                bcast_reduce=bcast_reduce, spatial_transformer=spatial_transformer,
                pixel_shuffle=pixel_shuffle, cnn=cnn, gpt=gpt)


def _torch_device(torch, target: str) -> str:
    return "cuda" if target == "cuda" and torch.cuda.is_available() else "cpu"


def _torch_peer(compiled: bool):
    def prepare(work: Workload, feeds: Mapping[str, np.ndarray], target: str) -> PreparedPeer:
        import torch

        device = _torch_device(torch, target)
        loss_fn = _torch_losses(torch)[work.name]
        if compiled:
            loss_fn = torch.compile(loss_fn)
        wrt_names = [t.name for t in work.wrt]
        tensors = {}
        for name, value in feeds.items():
            # torch indexes with int64 (cross_entropy targets, embedding ids); a copy, so that
            # a training step's in-place updates leave the feeds as they were
            array = value.astype(np.int64) if value.dtype.kind in "iu" else value
            tensor = torch.from_numpy(np.array(array, order="C")).to(device)
            tensors[name] = tensor.requires_grad_(name in wrt_names)
        sources = [tensors[n] for n in wrt_names]
        if work.optimizer is not None:
            return _torch_training(torch, work, loss_fn, tensors, sources, compiled, device)

        def run():
            loss = loss_fn(**tensors)
            grads = torch.autograd.grad(loss, sources)
            if device == "cuda":
                torch.cuda.synchronize()
            return [loss, *grads]

        def to_numpy(result) -> list[np.ndarray]:
            return [t.detach().cpu().numpy() for t in result]

        return PreparedPeer(run, to_numpy, device)

    return prepare


def _torch_training(torch, work: Workload, loss_fn, tensors: dict, sources: list, compiled: bool,
                    device: str) -> PreparedPeer:
    """A PyTorch training step of `work` over the leaf tensors `sources` (module docstring)."""
    settings = work.optimizer
    optimizer = torch.optim.AdamW(sources, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                  weight_decay=settings.weight_decay)

    def update():
        optimizer.step()

    if compiled:
        update = torch.compile(update, fullgraph=False)

    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(**tensors)
        loss.backward()
        update()
        if device == "cuda":
            torch.cuda.synchronize()
        return loss

    def to_numpy(loss) -> list[np.ndarray]:
        state = {"step": optimizer.state[sources[0]]["step"]}
        for t, source in zip(work.wrt, sources):
            slots = optimizer.state[source]
            state.update({t.name: source, f"{t.name}.exp_avg": slots["exp_avg"],
                          f"{t.name}.exp_avg_sq": slots["exp_avg_sq"]})
        return [np.asarray(loss.detach().cpu().numpy())] + [
            np.asarray(torch.as_tensor(state[n]).detach().cpu().numpy()) for n in work.state_names]

    return PreparedPeer(run, to_numpy, device)


# -- jax -----------------------------------------------------------------------------------------

def _jax_losses(jax) -> dict[str, Callable[..., Any]]:
    jnp = jax.numpy

    def mlp(x, labels, w1, b1, w2, b2, w3, b3):
        h = jax.nn.relu(x @ w1 + b1)
        h = jax.nn.relu(h @ w2 + b2)
        logp = jax.nn.log_softmax(h @ w3 + b3, axis=-1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    def layernorm_gelu(x, gamma, beta, r):
        h = jax.nn.standardize(x, axis=-1, epsilon=manual.LAYER_NORM_EPS) * gamma + beta
        return ((jax.nn.gelu(h, approximate=True) + x) * r).sum()

    def attention(q, k, v, r):
        p = jax.nn.softmax(q @ jnp.swapaxes(k, 1, 2) / attention_scale(q.shape[-1]), axis=-1)
        return ((p @ v) * r).sum()

    def embedding(table, idx, r):
        return (jnp.tanh(jnp.take(table, idx, axis=0)) * r).sum()

    def bcast_reduce(x, b, w):
        return (jax.nn.relu(x + b) * w).sum()

    def spatial_transformer(img, mat, r):
        # map_coordinates(order=1, mode="nearest") is bilinear with REPLICATE borders
        _, _, h, w = img.shape
        oh, ow = jnp.meshgrid(jnp.arange(h, dtype=img.dtype), jnp.arange(w, dtype=img.dtype),
                              indexing="ij")

        def warp_one(plane_stack, m):
            xs = m[0, 0] * ow + m[0, 1] * oh + m[0, 2]
            ys = m[1, 0] * ow + m[1, 1] * oh + m[1, 2]
            sample = lambda plane: jax.scipy.ndimage.map_coordinates(  # noqa: E731
                plane, [ys, xs], order=1, mode="nearest")
            return jax.vmap(sample)(plane_stack)

        return (jax.vmap(warp_one)(img, mat) * r).sum()

    def pixel_shuffle(x):
        b, cr2, h, w = x.shape
        f = PIXEL_SHUFFLE_FACTOR
        c = cr2 // (f * f)
        y = x.reshape(b, c, f, f, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(b, c, h * f, w * f)
        return (y * y).sum() / 2

    def cnn(x, labels, fc_w, fc_b, **p):
        def conv_bn(h, name, stride):
            z = jax.lax.conv_general_dilated(h, p[f"{name}_w"], (stride, stride),
                                             ((1, 1), (1, 1)),
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            z = jax.nn.standardize(z, axis=(0, 2, 3), epsilon=CNN_BN_EPS)
            return z * p[f"{name}_gamma"][:, None, None] + p[f"{name}_beta"][:, None, None]

        h = jax.nn.relu(conv_bn(x, "stem", 1))
        for block in (1, 2):
            inner = jax.nn.relu(conv_bn(h, f"res{block}a", 1))
            h = jax.nn.relu(conv_bn(inner, f"res{block}b", 1) + h)
        h = jax.nn.relu(conv_bn(h, "down", 2))
        logp = jax.nn.log_softmax(h.mean(axis=(2, 3)) @ fc_w + fc_b, axis=-1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    return dict(mlp=mlp, layernorm_gelu=layernorm_gelu, attention=attention, embedding=embedding,
                bcast_reduce=bcast_reduce, spatial_transformer=spatial_transformer,
                pixel_shuffle=pixel_shuffle, cnn=cnn)


def _prepare_jax(work: Workload, feeds: Mapping[str, np.ndarray], target: str) -> PreparedPeer:
    import jax

    loss_fn = _jax_losses(jax)[work.name]
    wrt_names = [t.name for t in work.wrt]
    # jax without x64 indexes in int32; every index here fits
    arrays = {k: jax.device_put(v.astype(np.int32) if v.dtype.kind in "iu" else v)
              for k, v in feeds.items()}
    differentiable = {k: arrays[k] for k in wrt_names}
    rest = {k: v for k, v in arrays.items() if k not in differentiable}
    step = jax.jit(jax.value_and_grad(lambda d, other: loss_fn(**d, **other)))

    def run():
        loss, grads = step(differentiable, rest)
        return jax.block_until_ready((loss, grads))

    def to_numpy(result) -> list[np.ndarray]:
        loss, grads = result
        return [np.asarray(loss)] + [np.asarray(grads[n]) for n in wrt_names]

    return PreparedPeer(run, to_numpy, str(jax.devices()[0].platform))


# -- discovery -----------------------------------------------------------------------------------

def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def available_peers(names: Sequence[str] = PEER_NAMES) -> list[Peer]:
    """Every requested peer; those whose framework is missing carry prepare=None and a note."""
    has_torch, has_jax = _installed("torch"), _installed("jax")
    missing = "not installed (make bench-peers installs it)"
    table = {
        "numpy_manual": Peer("numpy_manual", _prepare_numpy),
        "torch_eager": Peer("torch_eager", _torch_peer(False)) if has_torch
        else Peer("torch_eager", None, f"torch {missing}"),
        "torch_compile": Peer("torch_compile", _torch_peer(True)) if has_torch
        else Peer("torch_compile", None, f"torch {missing}"),
        "jax_jit": Peer("jax_jit", _prepare_jax, trains=False) if has_jax
        else Peer("jax_jit", None, f"jax {missing}", trains=False),
    }
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown}; expected some of {PEER_NAMES}")
    return [table[n] for n in names]


def max_relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """Largest |got − want| / (max |want| + tiny) over all outputs: one scale per output.

    Infinite where a shape differs or any value of either side is NaN or ±inf: max() would
    drop a NaN error (max(0.0, nan) is 0.0), and a workload's step has no non-finite output
    to compare."""
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g64.shape != w64.shape or not (np.isfinite(g64).all() and np.isfinite(w64).all()):
            return math.inf
        scale = float(np.max(np.abs(w64))) if w64.size else 0.0
        err = float(np.max(np.abs(g64 - w64))) if w64.size else 0.0
        worst = max(worst, err / (scale + 1e-30))
    return worst
