"""The benchmark workloads of `docs/benchmarks.md` (`cnn`, issue 14; `gpt`, issue 15), as graph builders.

Each builder returns a `Workload`: the graph, its scalar loss, the tensors
the gradients are taken with respect to, the gradients themselves (built
with `gc.grad`, so the differentiation pass is part of every workload) and a
`make_feeds(rng)` that draws the inputs. Two sizes exist: `"full"` is the
size benchmarks.md fixes, `"tiny"` keeps the same structure at a few
elements per axis so tests (and the suite's quick mode) stay fast.

Builders only use the public API, as a user would: the workloads double as
an end-to-end check of the frontend.

The `dtype` parameter exists for the gradient tests, which compare the
graph against the hand-written numpy step in float64 where rounding cannot
hide a wrong formula; the benchmark always runs float32.

Each workload also states what bounds it: the FLOP count a matmul-bound step
must do (compared against the machine's SGEMM rate) or, for the others, the
bytes it must move at the very least (every feed read once, the loss and
every gradient written once; compared against the memory bandwidth).

A workload with an `optimizer` (`gpt`) is a whole training step: the suite
compiles it with `gc.train_step`, so the optimizer's update is part of what is
timed and checked; its `outputs` are still the loss and the gradients, which
is what the gradient tests compare with the hand-written backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import gradcompiler as gc

SIZES = ("full", "tiny")

# Per workload: the named dimensions of benchmarks.md ("full") and a small
# version with the same structure ("tiny").
DIMS: dict[str, dict[str, dict[str, int]]] = {
    "mlp": {"full": dict(batch=256, features=784, hidden=512, classes=10),
            "tiny": dict(batch=8, features=12, hidden=16, classes=5)},
    "layernorm_gelu": {"full": dict(rows=8192, cols=1024), "tiny": dict(rows=6, cols=16)},
    "attention": {"full": dict(batch=16, seq=256, head=64), "tiny": dict(batch=2, seq=5, head=4)},
    "embedding": {"full": dict(vocab=100_000, lookups=65_536, dim=64),
                  "tiny": dict(vocab=10, lookups=24, dim=4)},
    "bcast_reduce": {"full": dict(rows=4096, cols=4096), "tiny": dict(rows=5, cols=7)},
    "spatial_transformer": {"full": dict(batch=32, channels=3, height=64, width=64),
                            "tiny": dict(batch=2, channels=3, height=6, width=7)},
    "pixel_shuffle": {"full": dict(batch=16, channels=64, height=64, width=64),
                      "tiny": dict(batch=2, channels=8, height=3, width=4)},
    "cnn": {"full": dict(batch=64, channels=3, size=32, width=32, classes=10),
            "tiny": dict(batch=3, channels=2, size=6, width=4, classes=3)},
    "gpt": {"full": dict(batch=8, seq=128, dim=256, blocks=4, vocab=2048),
            "tiny": dict(batch=2, seq=5, dim=8, blocks=2, vocab=11)},
}

NAMES = tuple(DIMS)


@dataclass(frozen=True)
class Workload:
    """One training-style step: a loss and its gradients, plus how to feed it."""

    name: str
    size: str
    dims: dict[str, int]
    graph: gc.Graph
    loss: gc.Tensor
    wrt: tuple[gc.Tensor, ...]
    grads: tuple[gc.Tensor, ...]
    make_feeds: Callable[[np.random.Generator], dict[str, np.ndarray]]
    bound: str          # "gemm" (matmul-bound) or "memory"
    flops: float        # matmul FLOP per step (forward and backward); 0 when memory-bound
    optimizer: gc.optim.Optimizer | None = None   # set: the step is a gc.train_step with it

    @property
    def outputs(self) -> list[gc.Tensor]:
        """What a step computes: the loss first, then the gradients in `wrt` order."""
        return [self.loss, *self.grads]

    @property
    def state_names(self) -> list[str]:
        """A training-step workload's state in the order the suite compares it: each
        parameter and its optimizer slots (`<param>.<slot>`, as `gc.train_step` names them),
        then the step count."""
        slots = self.optimizer.slot_names
        return [n for t in self.wrt for n in (t.name, *(f"{t.name}.{s}" for s in slots))] + ["step"]

    @property
    def min_bytes(self) -> int:
        """Bytes a step must move at least: each feed read once, each output written once."""
        feeds = sum(self.graph[i].type.nbytes for i in self.graph.feed_names.values())
        return feeds + sum(t.type.nbytes for t in self.outputs)


def _normal(rng: np.random.Generator, shape, dtype, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _finish(name: str, size: str, dims: dict[str, int], graph: gc.Graph, loss: gc.Tensor,
            wrt: list[gc.Tensor], make_feeds, flops: float = 0.0,
            optimizer: gc.optim.Optimizer | None = None) -> Workload:
    grads = gc.grad(loss, wrt)
    return Workload(name, size, dims, graph, loss, tuple(wrt), tuple(grads), make_feeds,
                    "gemm" if flops else "memory", float(flops), optimizer)


def build_mlp(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["mlp"][size]
    b, f, h, c = d["batch"], d["features"], d["hidden"], d["classes"]
    with gc.Graph("mlp") as graph:
        x = gc.input("x", (b, f), dtype)
        labels = gc.input("labels", (b,), "int32")
        w1, b1 = gc.param("w1", (f, h), dtype), gc.param("b1", (h,), dtype)
        w2, b2 = gc.param("w2", (h, h), dtype), gc.param("b2", (h,), dtype)
        w3, b3 = gc.param("w3", (h, c), dtype), gc.param("b3", (c,), dtype)
        h1 = gc.relu(x @ w1 + b1)
        h2 = gc.relu(h1 @ w2 + b2)
        loss = gc.cross_entropy(h2 @ w3 + b3, labels)

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return dict(
            x=_normal(rng, (b, f), dtype), labels=rng.integers(0, c, b).astype(np.int32),
            w1=_normal(rng, (f, h), dtype, 1 / math.sqrt(f)), b1=_normal(rng, h, dtype, 0.1),
            w2=_normal(rng, (h, h), dtype, 1 / math.sqrt(h)), b2=_normal(rng, h, dtype, 0.1),
            w3=_normal(rng, (h, c), dtype, 1 / math.sqrt(h)), b3=_normal(rng, c, dtype, 0.1))

    # forward: three matmuls; backward: a weight gradient for each layer and an
    # input gradient for the two upper ones (x needs none)
    layer_macs = [f * h, h * h, h * c]
    flops = 2 * b * (2 * sum(layer_macs) + layer_macs[1] + layer_macs[2])
    return _finish("mlp", size, d, graph, loss, [w1, b1, w2, b2, w3, b3], make_feeds, flops)


def build_layernorm_gelu(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["layernorm_gelu"][size]
    n, k = d["rows"], d["cols"]
    with gc.Graph("layernorm_gelu") as graph:
        x = gc.param("x", (n, k), dtype)
        gamma, beta = gc.param("gamma", (k,), dtype), gc.param("beta", (k,), dtype)
        r = gc.input("r", (n, k), dtype)
        h = gc.layer_norm(x, gamma, beta, axis=-1, eps=1e-5)
        y = gc.gelu_tanh(h) + x
        loss = (y * r).sum()

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return dict(x=_normal(rng, (n, k), dtype), gamma=1 + _normal(rng, k, dtype, 0.1),
                    beta=_normal(rng, k, dtype, 0.1), r=_normal(rng, (n, k), dtype))

    return _finish("layernorm_gelu", size, d, graph, loss, [x, gamma, beta], make_feeds)


def attention_scale(head: int) -> float:
    """The divisor of the scores: √head, i.e. 8 for the benchmark's head size 64."""
    return math.sqrt(head)


def build_attention(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["attention"][size]
    b, t, e = d["batch"], d["seq"], d["head"]
    with gc.Graph("attention") as graph:
        q, k, v = (gc.param(name, (b, t, e), dtype) for name in ("q", "k", "v"))
        r = gc.input("r", (b, t, e), dtype)
        scores = gc.matmul(q, k.transpose(0, 2, 1)) / attention_scale(e)
        out = gc.matmul(gc.softmax(scores, axis=-1), v)
        loss = (out * r).sum()

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {name: _normal(rng, (b, t, e), dtype) for name in ("q", "k", "v", "r")}

    # S = QKᵀ and O = PV forward; dP, dV, dQ, dK backward: six (t,t,e) products per batch
    flops = 6 * 2 * b * t * t * e
    return _finish("attention", size, d, graph, loss, [q, k, v], make_feeds, flops)


def build_embedding(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["embedding"][size]
    vocab, m, e = d["vocab"], d["lookups"], d["dim"]
    with gc.Graph("embedding") as graph:
        table = gc.param("table", (vocab, e), dtype)
        idx = gc.input("idx", (m,), "int64")
        r = gc.input("r", (m, e), dtype)
        loss = (gc.tanh(table[idx]) * r).sum()

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        # more lookups than rows at the tiny size, and ~28% repeats at the full one
        return dict(table=_normal(rng, (vocab, e), dtype), idx=rng.integers(0, vocab, m).astype(np.int64),
                    r=_normal(rng, (m, e), dtype))

    return _finish("embedding", size, d, graph, loss, [table], make_feeds)


def build_bcast_reduce(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["bcast_reduce"][size]
    n, k = d["rows"], d["cols"]
    with gc.Graph("bcast_reduce") as graph:
        x = gc.param("x", (n, k), dtype)
        b, w = gc.param("b", (k,), dtype), gc.param("w", (k,), dtype)
        loss = (gc.relu(x + b) * w).sum()

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return dict(x=_normal(rng, (n, k), dtype), b=_normal(rng, k, dtype, 0.5), w=_normal(rng, k, dtype))

    return _finish("bcast_reduce", size, d, graph, loss, [x, b, w], make_feeds)


def near_identity_mats(rng: np.random.Generator, n: int, dtype, shift: float) -> np.ndarray:
    """(n, 2, 3) affine maps close to the identity: ±5% linear part, ±`shift` px translation."""
    mats = np.zeros((n, 2, 3))
    mats[:, 0, 0] = mats[:, 1, 1] = 1.0
    mats[:, :, :2] += rng.uniform(-0.05, 0.05, (n, 2, 2))
    mats[:, :, 2] = rng.uniform(-shift, shift, (n, 2))
    return mats.astype(dtype)


def build_spatial_transformer(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["spatial_transformer"][size]
    n, c, h, w = d["batch"], d["channels"], d["height"], d["width"]
    with gc.Graph("spatial_transformer") as graph:
        img = gc.param("img", (n, c, h, w), dtype)
        mat = gc.param("mat", (n, 2, 3), dtype)
        r = gc.input("r", (n, c, h, w), dtype)
        out = gc.warp_affine(img, mat, (h, w), border_mode="replicate", format="NCHW")
        loss = (out * r).sum()

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return dict(img=_normal(rng, (n, c, h, w), dtype),
                    mat=near_identity_mats(rng, n, dtype, shift=max(h, w) / 16),
                    r=_normal(rng, (n, c, h, w), dtype))

    return _finish("spatial_transformer", size, d, graph, loss, [img, mat], make_feeds)


PIXEL_SHUFFLE_FACTOR = 2


def build_pixel_shuffle(size: str = "full", dtype="float32") -> Workload:
    d = DIMS["pixel_shuffle"][size]
    shape = (d["batch"], d["channels"], d["height"], d["width"])
    with gc.Graph("pixel_shuffle") as graph:
        x = gc.param("x", shape, dtype)
        y = gc.pixel_shuffle(x, PIXEL_SHUFFLE_FACTOR)
        loss = (y * y).sum() / 2

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return dict(x=_normal(rng, shape, dtype))

    return _finish("pixel_shuffle", size, d, graph, loss, [x], make_feeds)


CNN_BN_EPS = 1e-5


def cnn_layers(width: int, channels: int) -> list[tuple[str, tuple[int, int, int, int], int]]:
    """(name, filter shape, stride) of the cnn workload's convolutions, in order: a stem,
    two residual blocks of two convolutions each, and a stride-2 convolution to 2·width."""
    three = (3, 3)
    layers = [("stem", (width, channels, *three), 1)]
    for block in (1, 2):
        layers += [(f"res{block}a", (width, width, *three), 1),
                   (f"res{block}b", (width, width, *three), 1)]
    return layers + [("down", (2 * width, width, *three), 2)]


def build_cnn(size: str = "full", dtype="float32") -> Workload:
    """A small ResNet: conv3×3 + BN + ReLU, two residual blocks, a stride-2 conv + BN + ReLU,
    global average pooling, a linear layer and cross-entropy. The convolutions have no
    bias (BN's beta is the bias; a bias before BN would get a zero gradient)."""
    d = DIMS["cnn"][size]
    n, c, s, w, k = d["batch"], d["channels"], d["size"], d["width"], d["classes"]
    layers = cnn_layers(w, c)
    with gc.Graph("cnn") as graph:
        x = gc.input("x", (n, c, s, s), dtype)
        labels = gc.input("labels", (n,), "int32")
        params = {}
        for name, shape, _ in layers:
            params[name] = (gc.param(f"{name}_w", shape, dtype),
                            gc.param(f"{name}_gamma", (shape[0],), dtype),
                            gc.param(f"{name}_beta", (shape[0],), dtype))
        fc_w, fc_b = gc.param("fc_w", (2 * w, k), dtype), gc.param("fc_b", (k,), dtype)

        def conv_bn(h, name, stride):
            weight, gamma, beta = params[name]
            return gc.batch_norm(gc.conv2d(h, weight, stride=stride, padding=1), gamma, beta,
                                 eps=CNN_BN_EPS)

        h = gc.relu(conv_bn(x, "stem", 1))
        for block in (1, 2):
            inner = gc.relu(conv_bn(h, f"res{block}a", 1))
            h = gc.relu(conv_bn(inner, f"res{block}b", 1) + h)
        h = gc.relu(conv_bn(h, "down", 2))
        pooled = gc.adaptive_avg_pool2d(h, 1).reshape(n, 2 * w)
        loss = gc.cross_entropy(pooled @ fc_w + fc_b, labels)

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        feeds = dict(x=_normal(rng, (n, c, s, s), dtype),
                     labels=rng.integers(0, k, n).astype(np.int32))
        for name, shape, _ in layers:
            fan_in = shape[1] * shape[2] * shape[3]
            feeds[f"{name}_w"] = _normal(rng, shape, dtype, math.sqrt(2 / fan_in))
            feeds[f"{name}_gamma"] = 1 + _normal(rng, shape[0], dtype, 0.1)
            feeds[f"{name}_beta"] = _normal(rng, shape[0], dtype, 0.1)
        feeds.update(fc_w=_normal(rng, (2 * w, k), dtype, 1 / math.sqrt(2 * w)),
                     fc_b=_normal(rng, k, dtype, 0.1))
        return feeds

    # each convolution: forward, data gradient (not for the stem: x needs none), filter gradient
    flops = 0
    for index, (_, shape, stride) in enumerate(layers):
        out = s // stride if stride > 1 else s
        macs = n * out * out * shape[0] * shape[1] * shape[2] * shape[3]
        flops += 2 * macs * (2 if index == 0 else 3)
    flops += 2 * n * 2 * w * k * 2
    wrt = [t for name, _, _ in layers for t in params[name]] + [fc_w, fc_b]
    return _finish("cnn", size, d, graph, loss, wrt, make_feeds, flops)


GPT_LN_EPS = 1e-5
GPT_HEADS = 4
GPT_OPTIMIZER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
"""AdamW's settings for the gpt step (torch's defaults but the learning rate): the peers
build torch.optim.AdamW and the numpy oracle its update from the same numbers."""


def gpt_block_params(block: int) -> list[str]:
    """The parameter names of one pre-LN block, in `wrt` order."""
    return [f"{name}{block}" for name in ("ln1_gamma", "ln1_beta", "wq", "wk", "wv", "wo",
                                          "ln2_gamma", "ln2_beta", "up", "down")]


def gpt_param_shapes(vocab: int, seq: int, dim: int, blocks: int) -> dict[str, tuple[int, ...]]:
    """Every parameter of the gpt step by name, in `wrt` order (the gradients' order)."""
    shapes = {"wte": (vocab, dim), "wpe": (seq, dim)}
    for k in range(blocks):
        vector, square = (dim,), (dim, dim)
        shapes.update(zip(gpt_block_params(k), [vector, vector, square, square, square, square,
                                                vector, vector, (dim, 4 * dim), (4 * dim, dim)]))
    return {**shapes, "lnf_gamma": (dim,), "lnf_beta": (dim,), "head": (dim, vocab)}


def causal_mask(seq: int, dtype) -> np.ndarray:
    """(seq, seq) added to the attention scores: 0 where a query may look (keys up to its own
    position), −inf above the diagonal, so softmax gives the future exactly zero weight."""
    return np.triu(np.full((seq, seq), -np.inf), 1).astype(dtype)


def build_gpt(size: str = "full", dtype="float32", **dims: int) -> Workload:
    """A GPT-like language model's training step: token and position embeddings, pre-LN
    blocks of causal attention with GPT_HEADS heads and a GELU MLP of 4·dim (linear layers
    without bias, as nanoGPT's bias=False), a final layer norm, an untied output projection,
    next-token cross-entropy, and AdamW over every parameter. `dims` replace some of the
    size's dimensions (the remat test's longer sequence: activations outweighing the
    parameters, as at the full size)."""
    d = {**DIMS["gpt"][size], **dims}
    b, t, e, vocab = d["batch"], d["seq"], d["dim"], d["vocab"]
    head = e // GPT_HEADS
    shapes = gpt_param_shapes(vocab, t, e, d["blocks"])
    with gc.Graph("gpt") as graph:
        tokens = gc.input("tokens", (b, t), "int64")
        targets = gc.input("targets", (b, t), "int64")
        p = {name: gc.param(name, shape, dtype) for name, shape in shapes.items()}
        mask = gc.constant(causal_mask(t, dtype))

        def heads_of(z):  # (b, t, e) → (b, heads, t, head)
            return z.reshape(b, t, GPT_HEADS, head).transpose(0, 2, 1, 3)

        x = p["wte"][tokens] + p["wpe"]
        for k in range(d["blocks"]):
            ln1_gamma, ln1_beta, wq, wk, wv, wo, ln2_gamma, ln2_beta, up, down = gpt_block_params(k)
            a = gc.layer_norm(x, p[ln1_gamma], p[ln1_beta], eps=GPT_LN_EPS)
            q, key, v = (heads_of(a @ p[w]) for w in (wq, wk, wv))
            scores = gc.matmul(q, key, transpose_b=True) / attention_scale(head) + mask
            o = (gc.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, e)
            x = x + o @ p[wo]
            m = gc.layer_norm(x, p[ln2_gamma], p[ln2_beta], eps=GPT_LN_EPS)
            x = x + gc.gelu_tanh(m @ p[up]) @ p[down]
        f = gc.layer_norm(x, p["lnf_gamma"], p["lnf_beta"], eps=GPT_LN_EPS)
        logits = (f @ p["head"]).reshape(b * t, vocab)
        loss = gc.cross_entropy(logits, targets.reshape(b * t))

    def make_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        feeds = dict(tokens=rng.integers(0, vocab, (b, t)).astype(np.int64),
                     targets=rng.integers(0, vocab, (b, t)).astype(np.int64))
        for name, shape in shapes.items():
            if "gamma" in name:
                feeds[name] = 1 + _normal(rng, shape, dtype, 0.1)
            elif "beta" in name:
                feeds[name] = _normal(rng, shape, dtype, 0.1)
            elif name in ("wte", "wpe"):
                feeds[name] = _normal(rng, shape, dtype)
            else:
                feeds[name] = _normal(rng, shape, dtype, 1 / math.sqrt(shape[0]))
        return feeds

    # forward, data gradient and weight gradient of every product: the block's four
    # projections and its MLP (12·dim² per row), the output projection, and the two
    # attention products per head (QKᵀ, PV; the causal half is computed too)
    rows = b * t
    macs = d["blocks"] * (12 * rows * e * e + 2 * b * t * t * e) + rows * e * vocab
    return _finish("gpt", size, d, graph, loss, [p[name] for name in shapes], make_feeds,
                   2 * 3 * macs, gc.optim.AdamW(**GPT_OPTIMIZER))


BUILDERS: dict[str, Callable[..., Workload]] = {
    "mlp": build_mlp,
    "layernorm_gelu": build_layernorm_gelu,
    "attention": build_attention,
    "embedding": build_embedding,
    "bcast_reduce": build_bcast_reduce,
    "spatial_transformer": build_spatial_transformer,
    "pixel_shuffle": build_pixel_shuffle,
    "cnn": build_cnn,
    "gpt": build_gpt,
}


def build(name: str, size: str = "full", dtype="float32") -> Workload:
    """The workload `name` at `size` ("full" or "tiny")."""
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(NAMES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    return BUILDERS[name](size, dtype)


FEED_SEED = 20261129


def feeds_for(workload: Workload, seed: int = FEED_SEED) -> dict[str, np.ndarray]:
    """The workload's feeds from a fixed seed: every peer sees the same numbers."""
    return workload.make_feeds(np.random.default_rng(seed))
