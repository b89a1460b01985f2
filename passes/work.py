"""A deterministic measure of the work the passes do, so that a test can check that compile
time grows linearly with the graph without timing anything."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkCounter:
    """Cone walks the fuser made, and nodes (or kernel groups) the planning steps visited."""

    cone_evaluations: int = 0
    nodes_visited: int = 0

    def total(self) -> int:
        return self.cone_evaluations + self.nodes_visited
