"""The dependency graph between kernels while fuse builds them, with cheap cycle tests.

Every join the fuser considers asks "would this loop then depend on a kernel that depends
on it?". Asking a general graph library means a search through all the loop's descendants,
which in a training step is most of the graph (the backward pass depends on every forward
kernel): a quadratic planner. Here the graph keeps a topological numbering `rank` up to date
as edges arrive (Pearce and Kelly, "A dynamic topological sort algorithm for directed
acyclic graphs", 2006): a kernel can only reach kernels of higher rank, so a search from
`a` for `b` stops at rank `rank[b]`, and an edge that already agrees with the numbering
costs nothing. Each search and each renumbering touches only the kernels ranked between
the two ends of the edge, and a search that finds a target ends there.

`topological_order()` is the smallest-index-first order of `networkx`'s
`lexicographical_topological_sort`, so plans are the same as with that library.
"""

from __future__ import annotations

from gradcompiler.ir import smallest_first_order

from .work import WorkCounter


class KernelDag:
    """Kernels 0, 1, ... and their dependency edges, acyclic by construction."""

    def __init__(self, work: WorkCounter):
        self.succ: dict[int, set[int]] = {}
        self.pred: dict[int, set[int]] = {}
        self.rank: dict[int, int] = {}
        self.work = work
        self._next_rank = 0

    def add_node(self, n: int) -> None:
        """A new kernel, ranked last: nothing depends on it yet."""
        self.succ[n], self.pred[n] = set(), set()
        self.rank[n] = self._next_rank
        self._next_rank += 1

    def _search(self, start: int, limit: int, forward: bool) -> list[int]:
        """Kernels reachable from `start` (forward) or reaching it, within rank `limit`."""
        step = self.succ if forward else self.pred
        seen, stack = {start}, [start]
        while stack:
            for m in step[stack.pop()]:
                inside = self.rank[m] <= limit if forward else self.rank[m] >= limit
                if m not in seen and inside:
                    seen.add(m)
                    stack.append(m)
        self.work.nodes_visited += len(seen)
        return list(seen)

    def reaches_any(self, start: int, targets: set[int]) -> bool:
        """Whether a path leads from `start` to one of `targets` (`start` itself excluded)."""
        ahead = [t for t in targets if self.rank[t] > self.rank[start]]
        if not ahead:
            return False
        limit = max(self.rank[t] for t in ahead)
        seen, stack = {start}, [start]
        while stack:
            # the highest-ranked kernel first: the targets are the highest-ranked of all
            for m in sorted(self.succ[stack.pop()], key=self.rank.__getitem__):
                if m in targets:
                    self.work.nodes_visited += len(seen)
                    return True
                if m not in seen and self.rank[m] <= limit:
                    seen.add(m)
                    stack.append(m)
        self.work.nodes_visited += len(seen)
        return False

    def add_edge(self, a: int, b: int) -> None:
        """Add a -> b, which must not close a cycle; renumber the kernels in between."""
        if b in self.succ[a]:
            return
        self.succ[a].add(b)
        self.pred[b].add(a)
        if self.rank[a] < self.rank[b]:
            return
        ahead = self._search(b, self.rank[a], True)
        behind = self._search(a, self.rank[b], False)
        key = self.rank.__getitem__
        moved = sorted(behind, key=key) + sorted(ahead, key=key)
        for n, r in zip(moved, sorted(self.rank[n] for n in moved)):
            self.rank[n] = r

    def remove_edge(self, a: int, b: int) -> None:
        self.succ[a].discard(b)
        self.pred[b].discard(a)

    def contract(self, keep: int, gone: int) -> None:
        """Merge `gone` into `keep`, which has no other path to it (`networkx.contracted_nodes`
        without self-loops)."""
        self.remove_edge(keep, gone)
        for s in self.succ.pop(gone):
            self.pred[s].discard(gone)
            self.add_edge(keep, s)
        for p in self.pred.pop(gone):
            self.succ[p].discard(gone)
            self.add_edge(p, keep)
        del self.rank[gone]

    def merge(self, keep: int, gone: int) -> bool:
        """Contract `gone` into `keep`, which it depends on, unless another path leads from
        `keep` to `gone` (the merged kernel would then depend on itself); whether it did."""
        self.remove_edge(keep, gone)
        if self.reaches_any(keep, {gone}):
            self.add_edge(keep, gone)
            return False
        self.contract(keep, gone)
        return True

    def topological_order(self) -> list[int]:
        """Kahn's algorithm, always taking the smallest ready kernel first."""
        return smallest_first_order({n: len(preds) for n, preds in self.pred.items()},
                                    self.succ.__getitem__)
