"""`custom_gradient`: give a composite a backward of its own.

    @gc.custom_gradient
    def ste_round(x):                       # forward: round; backward: identity
        return gc.round(x), lambda g: [g]

    @gc.custom_gradient
    def logsumexp(x):                        # a residual: the backward reads the output
        y = ...
        return y, lambda g, y, x: [gc.exp(x - y) * g], (y, x)

The decorated function builds its forward with ordinary ops and returns
`(output, backward)` or `(output, backward, residuals)`. `backward(g,
*residuals)` builds, with ordinary ops, one gradient per Tensor argument of
the function (in order; None where none flows). The residuals are the forward
values the backward reads, stated explicitly as the seed's CustomGradMaker
states captures: the backward receives them as Tensors of the graph being
differentiated, so it also works on the float64 copy `check_grads` makes (a
Tensor merely captured by the closure would belong to the wrong graph there,
and is refused with a message that says so).

What follows from building it as one CustomGradient node (ops/custom.py):
- `gc.grad` uses the backward and never enters the composite, and since the
  backward is made of ordinary nodes, a gradient of the gradient works;
- `gc.jvp` (linearise and transpose) transposes the backward, which is right
  when the backward is linear in `g`, as a VJP is; a backward that is not (a
  clipped gradient) makes jvp raise, naming the composite;
- `gc.check_grads` refuses, unless told `custom_gradients="check"`, to compare
  a user's backward with finite differences (an intentional difference, a
  straight-through estimator, would read as a bug), except a backward
  declared `exact=True`: the true derivative computed another way, as
  `gc.batch_norm`'s is (in two passes over memory where the differentiated
  composite takes three);
- fusion sees only ordinary nodes (the node is removed before the passes run),
  and DOT dumps draw the forward and the backward as labelled clusters.

A composite has one output Tensor: several outputs can be concatenated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .errors import GraphError
from .frontend.tensor import Tensor, apply
from .ir import call_site
from .ops.custom import CustomGradient


def custom_gradient(forward: Callable | None = None, *, exact: bool = False) -> Callable:
    """Decorate `forward` (module docstring): its calls build a composite whose gradient is
    the backward it returns. `@custom_gradient(exact=True)` states that the backward is the
    composite's true derivative, only built another way (in fewer passes over memory, say):
    check_grads then compares it with finite differences like any other gradient."""
    if forward is None:
        return functools.partial(custom_gradient, exact=exact)
    name = getattr(forward, "__name__", "custom")

    @functools.wraps(forward)
    def composite(*args, **kwargs) -> Tensor:
        arguments = [a for a in args if isinstance(a, Tensor)]
        if not arguments:
            raise GraphError(f"custom_gradient '{name}': call it with at least one Tensor argument",
                             site=call_site())
        graph = arguments[0].graph
        with graph.scope(name):
            result = forward(*args, **kwargs)
            output, backward, residuals = _unpack(name, result)
            for value in [*arguments, *residuals, output]:
                if value.graph is not graph:
                    raise GraphError(f"custom_gradient '{name}': its Tensors come from different "
                                     "graphs", site=call_site())
            op = CustomGradient(backward, name, len(arguments), len(residuals), exact)
            return apply(op, *arguments, *residuals, output)

    return composite


def _unpack(name: str, result) -> tuple[Tensor, Callable, tuple[Tensor, ...]]:
    shape_hint = "(output, backward) or (output, backward, residuals)"
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise GraphError(f"custom_gradient '{name}': the forward must return {shape_hint}, "
                         f"not {type(result).__name__}", site=call_site())
    output, backward = result[0], result[1]
    residuals = tuple(result[2]) if len(result) == 3 else ()
    if not isinstance(output, Tensor):
        raise GraphError(f"custom_gradient '{name}': the output must be one Tensor, not "
                         f"{type(output).__name__} (concatenate several outputs into one)",
                         site=call_site())
    if not callable(backward):
        raise GraphError(f"custom_gradient '{name}': the second value returned must be the "
                         f"backward, a callable, not {type(backward).__name__}", site=call_site())
    if not all(isinstance(r, Tensor) for r in residuals):
        raise GraphError(f"custom_gradient '{name}': residuals must be Tensors", site=call_site())
    return output, backward, residuals
