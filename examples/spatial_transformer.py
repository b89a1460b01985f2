"""Recover a known affine transform from images: gradient descent on the matrix
of `warp_affine`.

Smooth random images are warped by a "true" matrix (a small rotation,
scaling and shift); starting from the identity, the example fits one matrix,
shared by the whole batch, that maps the images onto those targets. The
gradient with respect to the matrix is the WarpPerspectiveBackwardMat rule;
the matrix's six entries differ in scale (the linear part multiplies pixel
coordinates), so the update is Adam's, which rescales each entry, with a
larger step for the shift column (pixels) than for the linear part.

The matrix maps output pixels to source pixels (op-reference §9.6): it is
the inverse of the motion seen on the image.

    python examples/spatial_transformer.py
"""

from __future__ import annotations

import math

import numpy as np

import gradcompiler as gc


def true_matrix(size: int, degrees: float = 6.0, scale: float = 1.05,
                shift: tuple[float, float] = (1.5, -1.0)) -> np.ndarray:
    """A rotation and scaling about the image centre, then a shift: (2, 3) float32."""
    angle = math.radians(degrees)
    linear = scale * np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    centre = np.full(2, (size - 1) / 2)
    offset = centre - linear @ centre + np.asarray(shift)
    return np.concatenate([linear, offset[:, None]], axis=1).astype(np.float32)


def smooth_images(rng: np.random.Generator, batch: int, channels: int, size: int) -> np.ndarray:
    """Sums of a few Gaussian blobs: smooth, so the warp's gradient sees far."""
    grid = np.arange(size)
    images = np.zeros((batch, channels, size, size))
    for _ in range(6):
        centre = rng.uniform(0, size, (batch, channels, 2, 1, 1))
        width = rng.uniform(size / 8, size / 4, (batch, channels, 1, 1))
        rows = (grid[:, None] - centre[:, :, 0]) ** 2
        cols = (grid[None, :] - centre[:, :, 1]) ** 2
        images += rng.uniform(-1, 1, (batch, channels, 1, 1)) * np.exp(-(rows + cols) / (2 * width**2))
    return images.astype(np.float32)


def build_fit_step(batch: int, channels: int, size: int):
    """(warped images, loss, grad wrt the shared matrix) of mse(warp_affine(img, mat), target)."""
    with gc.Graph("spatial_transformer"):
        img = gc.input("img", (batch, channels, size, size))
        target = gc.input("target", (batch, channels, size, size))
        mat = gc.param("mat", (2, 3))
        per_image = gc.broadcast_to(mat, (batch, 2, 3))
        warped = gc.warp_affine(img, per_image, (size, size), border_mode="replicate", format="NCHW")
        loss = gc.mse(warped, target)
    return warped, loss, gc.grad(loss, mat)


def main(steps: int = 200, batch: int = 8, channels: int = 3, size: int = 32,
         lr_linear: float = 0.01, lr_shift: float = 0.1, seed: int = 0, verbose: bool = True) -> dict:
    """Fit the matrix; return the loss history, the true and the recovered matrix."""
    rng = np.random.default_rng(seed)
    warped, loss, grad = build_fit_step(batch, channels, size)
    images = smooth_images(rng, batch, channels, size)
    truth = true_matrix(size)
    warp_only = gc.compile([warped], target="cpu")
    (targets,) = warp_only(img=images, mat=truth)
    step = gc.compile([loss, grad], target="cpu")

    mat = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    lr = np.array([[lr_linear, lr_linear, lr_shift]] * 2, np.float32)
    moment, second = np.zeros_like(mat), np.zeros_like(mat)
    history = []
    for i in range(1, steps + 1):
        loss_value, g = step(img=images, target=targets, mat=mat)
        moment = 0.9 * moment + 0.1 * g
        second = 0.999 * second + 0.001 * g * g
        update = (moment / (1 - 0.9**i)) / (np.sqrt(second / (1 - 0.999**i)) + 1e-12)
        mat = (mat - lr * update).astype(np.float32)
        history.append(float(loss_value))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps):
            print(f"step {i:4d}  mse {history[-1]:.6f}")
    if verbose:
        print("true matrix:\n", truth, "\nrecovered:\n", mat)
    return dict(losses=history, true_matrix=truth, recovered_matrix=mat)


if __name__ == "__main__":
    main()
