"""Ring all-reduce: every member ends with the sum of all members' vectors.

Each of the N members cuts its vector into N chunks. In N − 1 rounds of
reduce-scatter, member k passes a running partial sum of one chunk to member
k + 1, which adds its own; afterwards member k holds the complete sum of chunk
k + 1. In N − 1 rounds of all-gather the complete chunks travel round the ring
and overwrite the partial ones. Each member sends 2(N − 1) chunks of L/N
elements, 2(N − 1)/N · L in all, which no longer grows with N: that is why it
is the algorithm of data-parallel training (docs/scaling.md projects it).

Every chunk's sum is formed by one chain of additions, in one order, and then
copied to everyone, so the members end with bitwise-equal vectors: replicas
that apply the same update to equal gradients stay bitwise equal, and a
checksum can compare them exactly.

Why not `ray.util.collective`: its CPU backend needs pygloo, which has no
wheel for this Python, and its NCCL backend needs GPUs. Here the chunks travel
as Ray objects: the driver submits every round's calls at once, passing each
member the object reference its predecessor returns, so the driver holds only
references while Ray moves the chunks between the actors (through the shared
object store; a chunk under Ray's inline limit, about 100 KiB, rides inside the
task's message). Calls from one caller to one actor run in submission order,
and a member's round r waits for its predecessor's round r − 1, which is the
ring's own order.

`RingMember` holds one member's side; `ring_allreduce` drives the rounds through
a caller-supplied `invoke`, so the same schedule runs on Ray actors and, in
tests, on plain objects.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def ring_rounds(members: int) -> int:
    """Rounds of a ring all-reduce among `members`: N − 1 to reduce, N − 1 to gather."""
    return 2 * (members - 1)


def _sent_chunk(rank: int, round_: int, members: int) -> int:
    """The chunk member `rank` sends in `round_`."""
    if round_ < members - 1:
        return (rank - round_) % members
    return (rank + 1 - (round_ - members + 1)) % members


class RingMember:
    """One member of the ring: `rank` of `members`, reducing the vector given to `ring_begin`."""

    def __init__(self, rank: int, members: int):
        self.rank, self.members = rank, members
        self._vector: np.ndarray | None = None
        self._chunks: list[slice] = []

    def ring_begin(self, vector: np.ndarray) -> np.ndarray | None:
        """Start reducing `vector` (owned by the member from now on); the chunk of round 0,
        None for a ring of one."""
        bounds = np.linspace(0, vector.size, self.members + 1).round().astype(int)
        self._vector, self._chunks = vector, [slice(a, b) for a, b in itertools.pairwise(bounds)]
        return self._outgoing(0)

    def ring_receive(self, round_: int, chunk: np.ndarray) -> np.ndarray | None:
        """Take the predecessor's chunk of `round_`; the chunk to send in the next round, or
        None once the vector holds the complete sum."""
        target = self._chunks[_sent_chunk(self.rank - 1, round_, self.members)]
        if round_ < self.members - 1:
            self._vector[target] += chunk
        else:
            self._vector[target] = chunk
        return self._outgoing(round_ + 1)

    @property
    def reduced(self) -> np.ndarray:
        return self._vector

    def _outgoing(self, round_: int) -> np.ndarray | None:
        if round_ >= ring_rounds(self.members):
            return None
        return self._vector[self._chunks[_sent_chunk(self.rank, round_, self.members)]].copy()


def ring_allreduce(members: Sequence[Any], outgoing: Sequence[Any],
                   invoke: Callable[[Any, int, Any], Any]) -> list[Any]:
    """Run every round: `outgoing[k]` is what member k's `ring_begin` returned (or a reference
    to it), `invoke(member, round, chunk)` calls that member's `ring_receive`. What the
    last round returned, one per member."""
    outgoing = list(outgoing)
    for round_ in range(ring_rounds(len(members))):
        outgoing = [invoke(member, round_, outgoing[k - 1]) for k, member in enumerate(members)]
    return outgoing
