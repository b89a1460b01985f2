"""Optimizers whose update is part of the compiled step: `SGD`, `Adam`, `AdamW`.

    opt = gc.optim.AdamW(1e-3)
    step = gc.train_step(loss, params, opt)       # forward, backward and update in one program

An optimizer is a small class whose `update` builds graph nodes, with the same
frontend ops a user writes, from each parameter, its gradient and its slots
(momentum buffers, moment estimates). Built as nodes, the update goes through
the passes like the rest of the step: each parameter's update is one
elementwise loop that reads the parameter, its gradient and its slots once and
writes the new values over the old ones (donation, `passes/memory.py`),
instead of the numpy pass per parameter and temporary per call that an update
outside the step costs.

The formulas are torch.optim's documented ones, term for term, so that a model
trained here and one trained with torch agree to rounding:

* SGD: g ← g + λθ; with momentum μ, b ← g on the first step, else
  b ← μb + (1 − τ)g, and g ← g + μb (nesterov) or g ← b; θ ← θ − γg.
* Adam: g ← g + λθ; m ← β₁m + (1 − β₁)g; v ← β₂v + (1 − β₂)g²;
  θ ← θ − γ·m̂ / (√v̂ + ε) with m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ),
  evaluated as torch does: (γ / (1 − β₁ᵗ))·m / (√v / √(1 − β₂ᵗ) + ε).
* AdamW: θ ← θ(1 − γλ) first (decoupled weight decay), then Adam without λ.

The learning rate γ and the step count t are 0-d float64 feeds, so a schedule
changes γ per call without a recompile, and the bias corrections are computed
in float64 whatever the parameters' dtype (as torch computes them in Python
floats). The scalars derived from them (γ / (1 − β₁ᵗ), ...) are computed once
per step and cast to each parameter's dtype; the per-element work is the
parameter's own dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .frontend.math import cast, sqrt, where
from .frontend.sources import full
from .frontend.tensor import Tensor

SCALAR_DTYPE = np.dtype(np.float64)
"""The dtype of the learning-rate and step-count feeds and of the scalars derived from them."""


@dataclass(frozen=True)
class UpdateInputs:
    """What an update reads besides the parameters and gradients.

    `lr`: the learning rate of this call; `step`: this update's step number t (1 on the
    first call), both 0-d float64 Tensors; `slots[param name][slot name]`: the slot's
    current value, of the parameter's shape and dtype.
    """

    lr: Tensor
    step: Tensor
    slots: Mapping[str, Mapping[str, Tensor]]


def _like(scalar: Tensor | float, param: Tensor):
    """A scalar of the optimizer's float64 arithmetic in `param`'s dtype (Python floats as is)."""
    return scalar if not isinstance(scalar, Tensor) else cast(scalar, param.dtype)


def _check_range(name: str, value: float, low: float, high: float | None = None) -> None:
    if not (low <= value and (high is None or value < high)):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"invalid {name}: {value!r}; it must lie in {bound}")


class Optimizer:
    """The interface `gc.train_step` drives: a default learning rate, the slots each parameter
    needs, and `update`, which builds the new parameter and slot values as nodes."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, lr: float):
        _check_range("learning rate", float(lr), 0.0)
        self.lr = float(lr)

    def update(self, params: Mapping[str, Tensor], grads: Mapping[str, Tensor],
               inputs: UpdateInputs) -> dict[str, dict[str, Tensor]]:
        """New values by parameter name: {"param": θ', slot name: slot', ...}."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class SGD(Optimizer):
    """torch.optim.SGD: `lr`, `momentum`, `dampening`, `nesterov`, `weight_decay`."""

    def __init__(self, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0):
        super().__init__(lr)
        _check_range("momentum", float(momentum), 0.0)
        _check_range("weight_decay", float(weight_decay), 0.0)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires a momentum and zero dampening "
                             "(as in torch)")
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.nesterov, self.weight_decay = bool(nesterov), float(weight_decay)
        self.slot_names = ("momentum_buffer",) if self.momentum else ()

    def update(self, params, grads, inputs):
        first = inputs.step == 1.0
        # b ← g on the first step (the buffer starts at zero, so 0·b + 1·g is g exactly)
        keep = take = None
        if self.momentum:
            keep = where(first, full((), 0.0, SCALAR_DTYPE), self.momentum)
            take = where(first, full((), 1.0, SCALAR_DTYPE), 1.0 - self.dampening)
        new = {}
        for name, p in params.items():
            g = grads[name]
            if self.weight_decay:
                g = g + self.weight_decay * p
            values = {}
            if self.momentum:
                b = _like(keep, p) * inputs.slots[name]["momentum_buffer"] + _like(take, p) * g
                values["momentum_buffer"] = b
                g = g + self.momentum * b if self.nesterov else b
            values["param"] = p - _like(inputs.lr, p) * g
            new[name] = values
        return new


class Adam(Optimizer):
    """torch.optim.Adam (amsgrad off): `lr`, `betas`, `eps`, `weight_decay` added to the
    gradient (L2 regularisation)."""

    slot_names = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(lr)
        beta1, beta2 = (float(b) for b in betas)
        _check_range("beta1", beta1, 0.0, 1.0)
        _check_range("beta2", beta2, 0.0, 1.0)
        _check_range("eps", float(eps), 0.0)
        _check_range("weight_decay", float(weight_decay), 0.0)
        self.betas, self.eps, self.weight_decay = (beta1, beta2), float(eps), float(weight_decay)

    def update(self, params, grads, inputs):
        beta1, beta2 = self.betas
        step_size = inputs.lr / (1.0 - beta1 ** inputs.step)
        correction2_sqrt = sqrt(1.0 - beta2 ** inputs.step)
        decoupled = self.decoupled and self.weight_decay
        decay = 1.0 - inputs.lr * self.weight_decay if decoupled else None
        new = {}
        for name, p in params.items():
            g, slots = grads[name], inputs.slots[name]
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            if decay is not None:
                p = p * _like(decay, p)
            m = beta1 * slots["exp_avg"] + (1.0 - beta1) * g
            v = beta2 * slots["exp_avg_sq"] + (1.0 - beta2) * (g * g)
            denom = sqrt(v) / _like(correction2_sqrt, p) + self.eps
            new[name] = {"param": p - _like(step_size, p) * (m / denom),
                         "exp_avg": m, "exp_avg_sq": v}
        return new


class AdamW(Adam):
    """torch.optim.AdamW: Adam whose weight decay shrinks the parameter itself,
    θ ← θ(1 − γλ), before the Adam step (decoupled, not added to the gradient)."""

    decoupled = True

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(lr, betas, eps, weight_decay)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "UpdateInputs"]
