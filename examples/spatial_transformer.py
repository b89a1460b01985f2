"""Recover a known affine transform from images: gradient descent on the matrix
of `warp_affine`.

Smooth random images are warped by a "true" matrix (a small rotation,
scaling and shift); starting from the identity, the example fits one matrix,
shared by the whole batch, that maps the images onto those targets. The
gradient with respect to the matrix is the WarpPerspectiveBackwardMat rule;
the matrix's six entries differ in scale (the linear part multiplies pixel
coordinates), so the update is Adam's, which rescales each entry, with a
larger step for the shift column (pixels) than for the linear part: the
trained parameter is the matrix divided column-wise by `step_scale` (Adam's
step is invariant to a gradient's scale, so a column multiplied by k moves k
times as far), and `gc.train_step` runs the warp, its gradient and Adam's
update as one compiled step.

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


def step_scale(lr_linear: float, lr_shift: float) -> np.ndarray:
    """The matrix = the parameter × this, column-wise: Adam at `lr_linear` then moves the
    shift column `lr_shift / lr_linear` times as far as the linear part."""
    return np.array([[1.0, 1.0, lr_shift / lr_linear]] * 2, np.float32)


def warp(img: gc.Tensor, mat: gc.Tensor) -> gc.Tensor:
    """The (batch, channels, size, size) images warped by the one (2, 3) matrix `mat`."""
    batch, size = img.shape[0], img.shape[-1]
    per_image = gc.broadcast_to(mat, (batch, 2, 3))
    return gc.warp_affine(img, per_image, (size, size), border_mode="replicate", format="NCHW")


def build_fit_step(batch: int, channels: int, size: int, lr_linear: float, lr_shift: float):
    """The training step of mse(warp(img, scaled · step_scale), target) with Adam."""
    with gc.Graph("spatial_transformer"):
        scaled = gc.param("scaled", (2, 3))
        img = gc.input("img", (batch, channels, size, size))
        target = gc.input("target", (batch, channels, size, size))
        loss = gc.mse(warp(img, scaled * step_scale(lr_linear, lr_shift)), target)
    return gc.train_step(loss, [scaled], gc.optim.Adam(lr_linear, eps=1e-12))


def main(steps: int = 200, batch: int = 8, channels: int = 3, size: int = 32,
         lr_linear: float = 0.01, lr_shift: float = 0.1, seed: int = 0, verbose: bool = True) -> dict:
    """Fit the matrix; return the loss history, the true and the recovered matrix."""
    rng = np.random.default_rng(seed)
    images = smooth_images(rng, batch, channels, size)
    truth = true_matrix(size)
    with gc.Graph("warp"):
        warp_only = gc.compile([warp(gc.input("img", images.shape), gc.input("mat", (2, 3)))])
    (targets,) = warp_only(img=images, mat=truth)
    step = build_fit_step(batch, channels, size, lr_linear, lr_shift)

    scale = step_scale(lr_linear, lr_shift)
    state = step.init({"scaled": np.array([[1, 0, 0], [0, 1, 0]], np.float32) / scale})
    history = []
    for i in range(1, steps + 1):
        history.append(step(state, img=images, target=targets))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps):
            print(f"step {i:4d}  mse {history[-1]:.6f}")
    mat = state["scaled"] * scale
    if verbose:
        print("true matrix:\n", truth, "\nrecovered:\n", mat)
    return dict(losses=history, true_matrix=truth, recovered_matrix=mat)


if __name__ == "__main__":
    main()
