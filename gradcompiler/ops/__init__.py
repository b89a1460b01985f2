"""Every op of the IR, one family per module.

`all_op_classes()` lists the concrete op classes; registry tests use it to
check that each op has a forward test and either a gradient rule or an
explicit non-differentiable mark.
"""

from __future__ import annotations

from ..ir import Op
from . import (  # noqa: F401
    conv,
    custom,
    elemwise,
    indexing,
    linalg,
    pool,
    reduce,
    shape,
    source,
    vision,
)


def all_op_classes() -> list[type[Op]]:
    found: list[type[Op]] = []
    stack = list(Op.__subclasses__())
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: c.__name__)
