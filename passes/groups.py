"""Fusion groups: the contract between the `fuse` pass, the `memory` pass,
the Kernel IR lowering and the DOT dump.

A `FusionGroup` is a set of nodes that become one kernel (or one library
call). Only its `outputs` are materialised in memory; every other member is
computed in registers (elementwise), read through an index map (views), or
accumulated (reductions). `inputs` are materialised values from outside the
group that its members read. The `FusionPlan` keeps groups in execution
order, so liveness can be computed over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GROUP_KINDS = ("source", "loop", "reduce", "library", "alias")


@dataclass(frozen=True)
class FusionGroup:
    name: str  # sanitised kernel name, e.g. "k3_reduce"
    kind: str  # one of GROUP_KINDS ("alias": a view of another buffer, no kernel)
    nodes: tuple[int, ...]  # members, in topological order
    outputs: tuple[int, ...]  # members whose values are materialised
    inputs: tuple[int, ...]  # materialised values from outside that members read


@dataclass
class FusionPlan:
    groups: list[FusionGroup] = field(default_factory=list)

    def group_of(self) -> dict[int, FusionGroup]:
        """Node id → the group it belongs to."""
        return {n: g for g in self.groups for n in g.nodes}

    def kernels(self) -> list[FusionGroup]:
        """Groups that run code (not sources, not aliases)."""
        return [g for g in self.groups if g.kind in ("loop", "reduce", "library")]
