"""The fixed-point driver of `simplify`: a worklist over the graph's nodes.

Every node is visited once in topological order; when a rewrite replaces a
node, only what the change can affect is visited again: the replacement
and its consumers (their inputs changed), and the consumers of the inputs of
each node the change left dead (their single-use conditions may now hold).
Rewrites only ever shrink or canonicalise the graph, so this terminates;
the step budget turns a rewrite that undoes another into an error instead
of a hang.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

from gradcompiler.errors import GraphError
from gradcompiler.ir import Graph

from .registry import rewrites_for

if TYPE_CHECKING:
    from ..pipeline import PassContext


class _Worklist:
    def __init__(self, ids) -> None:
        self.queue = deque(ids)
        self.queued = set(self.queue)

    def push(self, *ids: int) -> None:
        for i in ids:
            if i not in self.queued:
                self.queued.add(i)
                self.queue.append(i)

    def pop(self) -> int:
        i = self.queue.popleft()
        self.queued.discard(i)
        return i

    def __bool__(self) -> bool:
        return bool(self.queue)


def drop_dead(graph: Graph, node_id: int, work: _Worklist) -> None:
    """Remove `node_id` if nothing reads it, then its inputs that became unread."""
    stack = [node_id]
    while stack:
        n = stack.pop()
        if n not in graph or graph.consumers(n) or graph.is_output(n):
            continue
        inputs = graph[n].inputs
        graph.remove([n])
        for i in set(inputs):
            work.push(*graph.consumers(i))
            stack.append(i)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """Apply the registered rewrites until none applies; return counts by rewrite."""
    counts: Counter[str] = Counter()
    work = _Worklist(graph.topo_order())
    budget = 20 * len(graph) + 1000
    while work:
        node_id = work.pop()
        ctx.work.nodes_visited += 1
        if node_id not in graph:
            continue
        node = graph[node_id]
        for rule in rewrites_for(node.op):
            new = rule(graph, node, ctx)
            if new is None or new == node_id:
                continue
            if graph[new].type != node.type:
                raise GraphError(f"rewrite {rule.__name__} replaced %{node_id} ({node.type}) "
                                 f"with %{new} of type {graph[new].type}", op=node.op.label, site=node.site)
            graph.replace_uses(node_id, new)
            counts[rule.__name__] += 1
            work.push(new, *graph.consumers(new))
            drop_dead(graph, node_id, work)
            budget -= 1
            if budget < 0:
                raise GraphError(f"simplify did not reach a fixed point on graph '{graph.name}' "
                                 f"(last rewrite: {rule.__name__})")
            break
    return dict(counts)
