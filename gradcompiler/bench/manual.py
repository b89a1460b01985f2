"""`numpy_manual`: every benchmark step written by hand in numpy.

Each function takes the feeds of its workload (`workloads.py`) and returns
`[loss, *gradients]` in the workload's `wrt` order; `AdamWTraining` adds
torch.optim.AdamW's update for a workload that is a whole training step. They are two things at
once: the peer a numpy user would write (so vectorised, no Python loop over
elements, and `h*h*h` rather than `h**3`, whose float power is a scalar
call), and the independent oracle the gradient tests and the suite's
correctness check compare the compiled step against. The backward passes
are derived by hand here, not from the rule table.

They compute in the feeds' dtype (float32 for the benchmark, float64 in the
tests): Python scalars are weakly typed under numpy 2 and keep it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

import gradcompiler as gc

from .workloads import (
    CNN_BN_EPS,
    GPT_HEADS,
    GPT_LN_EPS,
    PIXEL_SHUFFLE_FACTOR,
    Workload,
    attention_scale,
    causal_mask,
    cnn_layers,
    gpt_block_params,
    gpt_param_shapes,
)

Feeds = Mapping[str, np.ndarray]

GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
LAYER_NORM_EPS = 1e-5


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean softmax cross-entropy of (rows, classes) logits and its gradient,
    (softmax − onehot) / rows."""
    rows = np.arange(len(labels))
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    loss = -(shifted[rows, labels] - np.log(total[:, 0])).mean()
    d_logits = e / total
    d_logits[rows, labels] -= 1
    d_logits /= len(labels)
    return np.asarray(loss), d_logits


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = LAYER_NORM_EPS):
    """Layer norm over the last axis: (y, x̂, 1/σ), the last two for the backward."""
    centred = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    xhat = centred * rstd
    return xhat * gamma + beta, xhat, rstd


def _layer_norm_backward(d_y, xhat, rstd, gamma):
    """(dx, dgamma, dbeta) of `_layer_norm`: dx = (1/σ)(dx̂ − mean dx̂ − x̂·mean(dx̂·x̂))."""
    d_xhat = d_y * gamma
    d_x = rstd * (d_xhat - d_xhat.mean(axis=-1, keepdims=True)
                  - xhat * (d_xhat * xhat).mean(axis=-1, keepdims=True))
    width = d_y.shape[-1]
    return d_x, (d_y * xhat).reshape(-1, width).sum(0), d_y.reshape(-1, width).sum(0)


def _gelu_tanh(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GELU's tanh form and its derivative, ½(1+t) + ½h(1−t²)·c(1 + 3a·h²)."""
    t = np.tanh(GELU_C * (h + GELU_A * (h * h * h)))
    return 0.5 * h * (1 + t), 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * GELU_C * (1 + 3 * GELU_A * (h * h))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_backward(p: np.ndarray, d_p: np.ndarray) -> np.ndarray:
    return p * (d_p - (d_p * p).sum(axis=-1, keepdims=True))


def mlp(f: Feeds) -> list[np.ndarray]:
    x, labels = f["x"], f["labels"]
    z1 = x @ f["w1"] + f["b1"]
    h1 = np.maximum(z1, 0)
    z2 = h1 @ f["w2"] + f["b2"]
    h2 = np.maximum(z2, 0)
    loss, d_logits = _cross_entropy(h2 @ f["w3"] + f["b3"], labels)
    d_z2 = np.where(z2 > 0, d_logits @ f["w3"].T, 0)
    d_z1 = np.where(z1 > 0, d_z2 @ f["w2"].T, 0)
    return [loss, x.T @ d_z1, d_z1.sum(0), h1.T @ d_z2, d_z2.sum(0),
            h2.T @ d_logits, d_logits.sum(0)]


def layernorm_gelu(f: Feeds) -> list[np.ndarray]:
    x, gamma, r = f["x"], f["gamma"], f["r"]
    h, xhat, rstd = _layer_norm(x, gamma, f["beta"])
    gelu, d_gelu = _gelu_tanh(h)
    loss = ((gelu + x) * r).sum()
    d_x, d_gamma, d_beta = _layer_norm_backward(r * d_gelu, xhat, rstd, gamma)
    return [np.asarray(loss), d_x + r, d_gamma, d_beta]


def attention(f: Feeds) -> list[np.ndarray]:
    q, k, v, r = f["q"], f["k"], f["v"], f["r"]
    scale = attention_scale(q.shape[-1])
    p = _softmax(q @ k.transpose(0, 2, 1) / scale)
    loss = ((p @ v) * r).sum()
    d_v = p.transpose(0, 2, 1) @ r
    d_s = _softmax_backward(p, r @ v.transpose(0, 2, 1)) / scale
    return [np.asarray(loss), d_s @ k, d_s.transpose(0, 2, 1) @ q, d_v]


def embedding(f: Feeds) -> list[np.ndarray]:
    table, idx, r = f["table"], f["idx"], f["r"]
    t = np.tanh(table[idx])
    loss = (t * r).sum()
    d_table = np.zeros_like(table)
    np.add.at(d_table, idx, r * (1 - t * t))  # repeated indices accumulate
    return [np.asarray(loss), d_table]


def bcast_reduce(f: Feeds) -> list[np.ndarray]:
    x, b, w = f["x"], f["b"], f["w"]
    z = x + b
    d_w = np.maximum(z, 0).sum(axis=0)
    d_x = np.where(z > 0, w, 0)
    return [np.asarray(d_w @ w), d_x, d_x.sum(axis=0), d_w]


def spatial_transformer(f: Feeds) -> list[np.ndarray]:
    """Bilinear warp_affine with REPLICATE borders, NCHW, output size = input size.

    The forward gathers the four taps of every output pixel from the
    flattened image; the image gradient scatters them back with one
    `np.bincount` (repeated taps accumulate); the matrix gradient follows
    d out / d(xs, ys) times (ow, oh, 1).
    """
    img, mat, r = f["img"], f["mat"], f["r"]
    n, c, h, w = img.shape
    dtype = img.dtype
    ow = np.arange(w, dtype=dtype)[None, None, :]
    oh = np.arange(h, dtype=dtype)[None, :, None]
    m = mat[:, :, :, None, None]
    xs = m[:, 0, 0] * ow + m[:, 0, 1] * oh + m[:, 0, 2]          # (n, h, w)
    ys = m[:, 1, 0] * ow + m[:, 1, 1] * oh + m[:, 1, 2]
    x0, y0 = np.floor(xs), np.floor(ys)
    ax, ay = (xs - x0).reshape(n, 1, -1), (ys - y0).reshape(n, 1, -1)
    cols = [np.clip(x0 + i, 0, w - 1).astype(np.int64) for i in (0, 1)]
    rows = [np.clip(y0 + i, 0, h - 1).astype(np.int64) for i in (0, 1)]
    taps = [(rows[i] * w + cols[j]).reshape(n, 1, -1) for i in (0, 1) for j in (0, 1)]
    flat = img.reshape(n, c, h * w)
    v00, v01, v10, v11 = (np.take_along_axis(flat, tap, axis=2) for tap in taps)
    weights = [(1 - ax) * (1 - ay), ax * (1 - ay), (1 - ax) * ay, ax * ay]
    out = weights[0] * v00 + weights[1] * v01 + weights[2] * v10 + weights[3] * v11
    g = r.reshape(n, c, h * w)
    loss = (out * g).sum()

    plane = (np.arange(n * c) * (h * w)).reshape(n, c, 1)
    keys = np.concatenate([np.broadcast_to(tap + plane, g.shape).ravel() for tap in taps])
    values = np.concatenate([(wt * g).ravel() for wt in weights])
    d_img = np.bincount(keys, values, minlength=n * c * h * w).astype(dtype).reshape(img.shape)

    g_xs = (g * ((1 - ay) * (v01 - v00) + ay * (v11 - v10))).sum(axis=1)   # (n, h*w)
    g_ys = (g * ((1 - ax) * (v10 - v00) + ax * (v11 - v01))).sum(axis=1)
    basis = np.stack([np.broadcast_to(ow, (1, h, w)).ravel(), np.broadcast_to(oh, (1, h, w)).ravel(),
                      np.ones(h * w, dtype)], axis=1)                        # (h*w, 3)
    d_mat = np.stack([g_xs @ basis, g_ys @ basis], axis=1)
    return [np.asarray(loss), d_img, d_mat]


def pixel_shuffle(f: Feeds) -> list[np.ndarray]:
    x = f["x"]
    b, cr2, h, w = x.shape
    r = PIXEL_SHUFFLE_FACTOR
    c = cr2 // (r * r)
    y = x.reshape(b, c, r, r, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(b, c, h * r, w * r)
    flat = y.ravel()
    loss = np.dot(flat, flat) / 2
    d_y = y  # d(½Σy²)/dy
    d_x = d_y.reshape(b, c, h, r, w, r).transpose(0, 1, 3, 5, 2, 4).reshape(x.shape)
    return [np.asarray(loss), d_x]


def _im2col(x: np.ndarray, k: int, stride: int) -> tuple[np.ndarray, int, int]:
    """Rows (n, oh, ow), columns (c, kh, kw) of a k×k, padding-1 convolution's taps."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]                    # (n, c, oh, ow, k, k)
    n, c, oh, ow = windows.shape[:4]
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k), oh, ow


def _conv(x, w, stride):
    cols, oh, ow = _im2col(x, w.shape[2], stride)
    y = (cols @ w.reshape(w.shape[0], -1).T).reshape(x.shape[0], oh, ow, w.shape[0])
    return y.transpose(0, 3, 1, 2), cols


def _conv_backward(dy, cols, x_shape, w, stride, need_dx=True):
    """(dx or None, dw): dw = dyᵀ·cols; dx folds dy·w back over the taps (col2im)."""
    n, o, oh, ow = dy.shape
    k = w.shape[2]
    rows = dy.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (rows.T @ cols).reshape(w.shape)
    if not need_dx:
        return None, dw
    dcols = (rows @ w.reshape(o, -1)).reshape(n, oh, ow, x_shape[1], k, k)
    padded = np.zeros((n, x_shape[1], x_shape[2] + 2, x_shape[3] + 2), dy.dtype)
    for kh in range(k):
        for kw in range(k):
            padded[:, :, kh:kh + stride * (oh - 1) + 1:stride,
                   kw:kw + stride * (ow - 1) + 1:stride] += dcols[..., kh, kw].transpose(0, 3, 1, 2)
    return padded[:, :, 1:-1, 1:-1], dw


def _bn(z, gamma, beta):
    mu = z.mean(axis=(0, 2, 3), keepdims=True)
    centred = z - mu
    rstd = 1 / np.sqrt((centred * centred).mean(axis=(0, 2, 3), keepdims=True) + CNN_BN_EPS)
    xhat = centred * rstd
    return xhat * gamma[None, :, None, None] + beta[None, :, None, None], xhat, rstd


def _bn_backward(dy, xhat, rstd, gamma):
    """(dz, dgamma, dbeta): the two-reduction form of batch norm's gradient."""
    dbeta = dy.sum(axis=(0, 2, 3))
    dgamma = (dy * xhat).sum(axis=(0, 2, 3))
    count = dy.size // dy.shape[1]
    dz = (gamma[None, :, None, None] * rstd / count) * (
        count * dy - dbeta[None, :, None, None] - xhat * dgamma[None, :, None, None])
    return dz, dgamma, dbeta


def cnn(f: Feeds) -> list[np.ndarray]:
    """The cnn workload: im2col convolutions through BLAS, batch norm by hand."""
    x, labels = f["x"], f["labels"]
    layers = cnn_layers(f["stem_w"].shape[0], x.shape[1])
    saved = {}

    def conv_bn(h, name, stride):
        z, cols = _conv(h, f[f"{name}_w"], stride)
        y, xhat, rstd = _bn(z, f[f"{name}_gamma"], f[f"{name}_beta"])
        saved[name] = (h.shape, cols, xhat, rstd, stride)
        return y

    h = np.maximum(conv_bn(x, "stem", 1), 0)
    acts = {"stem": h}
    for block in (1, 2):
        inner = np.maximum(conv_bn(h, f"res{block}a", 1), 0)
        h = np.maximum(conv_bn(inner, f"res{block}b", 1) + h, 0)
        acts[f"res{block}a"], acts[f"res{block}b"] = inner, h
    h = np.maximum(conv_bn(h, "down", 2), 0)
    acts["down"] = h
    pooled = h.mean(axis=(2, 3))
    loss, d_logits = _cross_entropy(pooled @ f["fc_w"] + f["fc_b"], labels)
    grads = {"fc_w": pooled.T @ d_logits, "fc_b": d_logits.sum(0)}

    def conv_bn_backward(dy, name):
        x_shape, cols, xhat, rstd, stride = saved[name]
        dz, grads[f"{name}_gamma"], grads[f"{name}_beta"] = _bn_backward(
            dy, xhat, rstd, f[f"{name}_gamma"])
        dx, grads[f"{name}_w"] = _conv_backward(dz, cols, x_shape, f[f"{name}_w"], stride,
                                                need_dx=name != "stem")
        return dx

    d_h = d_logits @ f["fc_w"].T
    d_h = np.broadcast_to(d_h[:, :, None, None] / (h.shape[2] * h.shape[3]), h.shape)
    d_h = conv_bn_backward(np.where(acts["down"] > 0, d_h, 0), "down")
    for block in (2, 1):
        d_sum = np.where(acts[f"res{block}b"] > 0, d_h, 0)       # through the block's ReLU
        d_inner = conv_bn_backward(d_sum, f"res{block}b")
        d_h = d_sum + conv_bn_backward(np.where(acts[f"res{block}a"] > 0, d_inner, 0),
                                       f"res{block}a")
    conv_bn_backward(np.where(acts["stem"] > 0, d_h, 0), "stem")
    order = [f"{name}_{part}" for name, _, _ in layers for part in ("w", "gamma", "beta")]
    return [loss] + [grads[k] for k in order] + [grads["fc_w"], grads["fc_b"]]


def _rows(z: np.ndarray) -> np.ndarray:
    """(..., width) as (rows, width): a linear layer's input or output gradient as a matrix."""
    return z.reshape(-1, z.shape[-1])


def gpt(f: Feeds) -> list[np.ndarray]:
    """The gpt workload's loss and gradients: embeddings, pre-LN blocks of causal multi-head
    attention and a GELU MLP, the final layer norm, the output projection, cross-entropy."""
    tokens, targets, wte = f["tokens"], f["targets"], f["wte"]
    (b, t), (vocab, e) = tokens.shape, wte.shape
    head = e // GPT_HEADS
    scale, mask = attention_scale(head), causal_mask(t, wte.dtype)
    blocks = sum(name.startswith("wq") for name in f)

    def split(z):  # (b, t, e) → (b, heads, t, head)
        return z.reshape(b, t, GPT_HEADS, head).transpose(0, 2, 1, 3)

    def merge(z):
        return z.transpose(0, 2, 1, 3).reshape(b, t, e)

    def norm(z, gamma, beta):
        return _layer_norm(z, f[gamma], f[beta], GPT_LN_EPS)

    x = wte[tokens] + f["wpe"]
    saved = []
    for k in range(blocks):
        ln1_gamma, ln1_beta, wq, wk, wv, wo, ln2_gamma, ln2_beta, up, down = gpt_block_params(k)
        a, a_hat, a_rstd = norm(x, ln1_gamma, ln1_beta)
        q, key, v = (split(a @ f[w]) for w in (wq, wk, wv))
        p = _softmax(q @ key.transpose(0, 1, 3, 2) / scale + mask)
        o = merge(p @ v)
        x = x + o @ f[wo]
        m, m_hat, m_rstd = norm(x, ln2_gamma, ln2_beta)
        g, d_gelu = _gelu_tanh(m @ f[up])
        x = x + g @ f[down]
        saved.append((a, a_hat, a_rstd, q, key, v, p, o, m, m_hat, m_rstd, g, d_gelu))
    y, y_hat, y_rstd = norm(x, "lnf_gamma", "lnf_beta")
    loss, d_logits = _cross_entropy(_rows(y) @ f["head"], targets.ravel())
    grads = {"head": _rows(y).T @ d_logits}
    d_x, grads["lnf_gamma"], grads["lnf_beta"] = _layer_norm_backward(
        (d_logits @ f["head"].T).reshape(b, t, e), y_hat, y_rstd, f["lnf_gamma"])
    for k in reversed(range(blocks)):
        ln1_gamma, ln1_beta, wq, wk, wv, wo, ln2_gamma, ln2_beta, up, down = gpt_block_params(k)
        a, a_hat, a_rstd, q, key, v, p, o, m, m_hat, m_rstd, g, d_gelu = saved[k]
        grads[down] = _rows(g).T @ _rows(d_x)
        d_u = (d_x @ f[down].T) * d_gelu
        grads[up] = _rows(m).T @ _rows(d_u)
        d_m, grads[ln2_gamma], grads[ln2_beta] = _layer_norm_backward(
            d_u @ f[up].T, m_hat, m_rstd, f[ln2_gamma])
        d_x = d_x + d_m
        grads[wo] = _rows(o).T @ _rows(d_x)
        d_o = split(d_x @ f[wo].T)
        d_s = _softmax_backward(p, d_o @ v.transpose(0, 1, 3, 2)) / scale
        d_a = np.zeros_like(a)
        for w, d in ((wq, d_s @ key), (wk, d_s.transpose(0, 1, 3, 2) @ q),
                     (wv, p.transpose(0, 1, 3, 2) @ d_o)):
            grads[w] = _rows(a).T @ _rows(merge(d))
            d_a += merge(d) @ f[w].T
        d_ln, grads[ln1_gamma], grads[ln1_beta] = _layer_norm_backward(
            d_a, a_hat, a_rstd, f[ln1_gamma])
        d_x = d_x + d_ln
    grads["wpe"] = d_x.sum(axis=0)
    grads["wte"] = np.zeros_like(wte)
    np.add.at(grads["wte"], tokens.ravel(), _rows(d_x))  # repeated tokens accumulate
    return [loss] + [grads[name] for name in gpt_param_shapes(vocab, t, e, blocks)]


def adamw_update(params: dict[str, np.ndarray], grads: Mapping[str, np.ndarray],
                 slots: dict[str, tuple[np.ndarray, np.ndarray]], step: int, lr: float,
                 betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """torch.optim.AdamW's documented update at step number `step`, in place: θ ← θ(1 − γλ),
    m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², θ ← θ − γ·m̂ / (√v̂ + ε)."""
    beta1, beta2 = betas
    for name, p in params.items():
        g, (m, v) = grads[name], slots[name]
        p *= 1 - lr * weight_decay
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * (g * g)
        p -= (lr / (1 - beta1 ** step)) * m / (np.sqrt(v / (1 - beta2 ** step)) + eps)


class AdamWTraining:
    """The numpy training step of a workload with an AdamW optimizer: the hand-written loss
    and gradients, then `adamw_update`, on parameters and slots of its own (copies of the
    feeds' initial values, zeros). A call is one step; `results(loss)` is the loss and the
    state in `work.state_names` order, what the compiled step is checked against."""

    def __init__(self, work: Workload, feeds: Feeds):
        optimizer = work.optimizer
        if not isinstance(optimizer, gc.optim.AdamW):
            raise NotImplementedError(f"numpy training step for {optimizer!r}: only AdamW")
        self.settings = dict(lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
                             weight_decay=optimizer.weight_decay)
        self.loss_and_grads, self.state_names = STEPS[work.name], work.state_names
        self.names = [t.name for t in work.wrt]
        self.params = {n: np.array(feeds[n]) for n in self.names}
        self.data = {k: v for k, v in feeds.items() if k not in self.params}
        self.slots = {n: (np.zeros_like(p), np.zeros_like(p)) for n, p in self.params.items()}
        self.step = 0

    def __call__(self) -> np.ndarray:
        loss, *grads = self.loss_and_grads({**self.data, **self.params})
        self.step += 1
        adamw_update(self.params, dict(zip(self.names, grads)), self.slots, self.step,
                     **self.settings)
        return loss

    def results(self, loss: np.ndarray) -> list[np.ndarray]:
        state = {"step": np.asarray(float(self.step))}
        for name, p in self.params.items():
            state[name] = p
            state[f"{name}.exp_avg"], state[f"{name}.exp_avg_sq"] = self.slots[name]
        return [np.asarray(loss), *(state[n] for n in self.state_names)]


STEPS: dict[str, Callable[[Feeds], list[np.ndarray]]] = {
    "mlp": mlp,
    "layernorm_gelu": layernorm_gelu,
    "attention": attention,
    "embedding": embedding,
    "bcast_reduce": bcast_reduce,
    "spatial_transformer": spatial_transformer,
    "pixel_shuffle": pixel_shuffle,
    "cnn": cnn,
    "gpt": gpt,
}
