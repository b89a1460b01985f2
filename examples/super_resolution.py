"""A super-resolution head: a 1×1 convolution to r²·C channels, then
`pixel_shuffle(·, r)` rearranges them into an image r times larger.

The low-resolution input holds, at each pixel, the r×r block of the
high-resolution image it covers, mixed by an unknown invertible matrix. The
head learns to undo the mixing and to place each value at its sub-pixel
position: after training it reconstructs the high-resolution images, and its
weights equal the inverse mixing in PixelShuffle's channel order (channel
c·r² + i·r + j goes to row offset i, column offset j).

    python examples/super_resolution.py
"""

from __future__ import annotations

import numpy as np

import gradcompiler as gc

FACTOR = 2


def build_head_step(batch: int, height: int, width: int, channels: int):
    """(loss, [w, b]): mse(pixel_shuffle(x @ w + b), target), x channels-last."""
    mixed = channels * FACTOR * FACTOR
    with gc.Graph("super_resolution"):
        x = gc.input("x", (batch, height, width, mixed))
        target = gc.input("target", (batch, channels, height * FACTOR, width * FACTOR))
        w, b = gc.param("w", (mixed, mixed)), gc.param("b", (mixed,))
        features = (x @ w + b).transpose(0, 3, 1, 2)            # 1×1 conv, then NCHW
        loss = gc.mse(gc.pixel_shuffle(features, FACTOR), target)
    return loss, [w, b]


def unshuffle_numpy(images: np.ndarray) -> np.ndarray:
    """(N, C, H·r, W·r) → (N, H, W, C·r²): each pixel's r×r block, in PixelShuffle's order."""
    n, c, hr, wr = images.shape
    h, w = hr // FACTOR, wr // FACTOR
    blocks = images.reshape(n, c, h, FACTOR, w, FACTOR).transpose(0, 2, 4, 1, 3, 5)
    return blocks.reshape(n, h, w, c * FACTOR * FACTOR)


def main(steps: int = 300, batch: int = 8, height: int = 16, width: int = 16, channels: int = 3,
         lr: float = 0.5, seed: int = 0, verbose: bool = True) -> dict:
    """Train the head; return the loss history and how far its weights are from the inverse mixing."""
    rng = np.random.default_rng(seed)
    mixed = channels * FACTOR * FACTOR
    loss, params = build_head_step(batch, height, width, channels)
    step = gc.train_step(loss, params, gc.optim.SGD(lr), target="cpu")
    mixing = (np.eye(mixed) + 0.3 * rng.standard_normal((mixed, mixed)) / np.sqrt(mixed)).astype(np.float32)
    weights = step.init(dict(w=np.zeros((mixed, mixed), np.float32), b=np.zeros(mixed, np.float32)))
    history = []
    for i in range(steps):
        target = rng.standard_normal((batch, channels, height * FACTOR, width * FACTOR)).astype(np.float32)
        x = unshuffle_numpy(target) @ mixing
        history.append(step(weights, x=x, target=target))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps - 1):
            print(f"step {i:4d}  mse {history[-1]:.6f}")
    weight_error = float(np.max(np.abs(weights["w"] - np.linalg.inv(mixing))))
    if verbose:
        print(f"largest difference between the learned weights and the inverse mixing: {weight_error:.4f}")
    return dict(losses=history, weight_error=weight_error)


if __name__ == "__main__":
    main()
