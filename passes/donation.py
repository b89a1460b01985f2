"""Donation: an output written over the buffer of the feed it replaces (a parameter, an
optimizer slot), so a training step updates its state in place instead of handing back
new arrays that the caller copies over the old ones.

    schedule_donations(graph, plan, root, wanted) -> (groups in execution order, granted)

`wanted` maps an output node to the feed node whose memory it should take. A
wish is granted when writing the output there cannot change what any kernel
reads:

* the output is the feed itself (nothing to write), or a value stored by a loop
  kernel (not a library call: a call writes its whole result before anything
  reads the old values);
* that kernel reads the feed, if it does, only as an elementwise loop reading
  element i before writing element i (`memory._in_place_safe`, the rule of every
  in-place reuse);
* every other kernel that reads the feed, or a view of it, runs before that
  kernel. The fusion plan's order may put a reader later (a matmul that reads a
  weight for the gradient of the layer below), so the groups are ordered again:
  a topological sort of the kernels' data dependencies plus an edge from each
  reader of a donated feed to the kernel that overwrites it, preferring the
  fusion plan's order wherever the edges leave a choice. A wish whose edges close
  a cycle is dropped; the caller then copies that output into the feed's array
  after the step.

Linear in the plan's size (one sort over the groups and their inputs, plus one
more per cycle found, which in a training step never happens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import networkx as nx

from gradcompiler.ir import Graph

from .groups import FusionGroup, FusionPlan

InPlaceRule = Callable[[Graph, FusionGroup, int, int, dict[int, int]], bool]


def _writable(graph: Graph, group: FusionGroup, out: int, feed: int, root: dict[int, int],
              in_place_safe: InPlaceRule) -> bool:
    if out not in group.outputs or group.kind not in ("loop", "reduce"):
        return False
    reads_feed = [i for i in group.inputs if root.get(i, i) == feed]
    return not reads_feed or (feed in group.inputs and in_place_safe(graph, group, feed, out, root))


def schedule_donations(graph: Graph, plan: FusionPlan, root: dict[int, int],
                       wanted: Mapping[int, int], in_place_safe: InPlaceRule
                       ) -> tuple[list[FusionGroup], dict[int, int]]:
    """The plan's groups in an order that honours the granted wishes, and those wishes."""
    groups = list(plan.groups)
    if not wanted:
        return groups, {}
    group_of = {n: k for k, g in enumerate(groups) for n in g.nodes}
    granted = {out: feed for out, feed in wanted.items() if out == feed}
    writer = {out: group_of[out] for out, feed in wanted.items() if out != feed
              and feed in graph and _writable(graph, groups[group_of[out]], out, feed, root,
                                              in_place_safe)}
    readers: dict[int, set[int]] = {}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for k, group in enumerate(groups):
        for i in group.inputs:
            if i in group_of and group_of[i] != k:
                dag.add_edge(group_of[i], k)
            readers.setdefault(root.get(i, i), set()).add(k)
    while True:
        extra = [(r, w, out) for out, w in writer.items() for r in readers.get(wanted[out], ())
                 if r != w]
        order_dag = dag.copy()
        order_dag.add_edges_from((r, w) for r, w, _ in extra)
        try:
            order = list(nx.lexicographical_topological_sort(order_dag))
            break
        except nx.NetworkXUnfeasible:
            cycle = {(a, b) for a, b in nx.find_cycle(order_dag)}
            for _, _, out in (e for e in extra if (e[0], e[1]) in cycle):
                writer.pop(out, None)
    granted.update({out: wanted[out] for out in writer})
    return [groups[k] for k in order], granted
