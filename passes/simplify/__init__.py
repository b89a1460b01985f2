"""`simplify`: local rewrites applied to a fixed point.

Each rewrite is a small function registered for the op classes it matches
(`registry.rewrite`), grouped by theme: `views` (reshape chains, cancelling
axis ops, no-op broadcasts and reduce-tos, reductions of broadcasts),
`matmul` (transposes folded into flags), `products` (a full sum of a
product against a tensor read off the product's gradient), `vision` (a differentiated affine
warp reads its gradients' homogeneous matrix), `arith` (x·1, x+0, −(−x),
x·0 where exact, identity ops) and `scatter` (scatter into zeros followed by
an add). Rewrites keep every node's type, keep the role, origin and call site
of the node they replace, and never change a value beyond rounding
(`arith` states its two documented exceptions). `driver.run` is the pass.
"""

from . import arith, matmul, products, scatter, views, vision  # noqa: F401  (importing registers the rewrites)
from .driver import run
from .registry import REWRITES, rewrite

__all__ = ["run", "rewrite", "REWRITES"]
