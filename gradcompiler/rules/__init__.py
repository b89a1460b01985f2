"""The gradient rule table, one module per op family.

Importing this package registers every rule. See `registry.py` for the rule
contract (modelled on the seed's CustomGradMaker).
"""

from . import conv, custom, elemwise, indexing, linalg, reduce, shape, vision  # noqa: F401
from .registry import (  # noqa: F401
    ForwardNode,
    apply_rule,
    grad_rule,
    has_rule,
    is_non_differentiable,
    non_differentiable,
    rule_of,
)
