"""The ring all-reduce's schedule on plain objects (no Ray): every member ends with numpy's
sum of all vectors, bitwise equal across members, for rings of 1 to 5 and vectors shorter
than the ring (empty chunks)."""

from __future__ import annotations

import numpy as np
import pytest

from gradcompiler.distributed.allreduce import RingMember, ring_allreduce, ring_rounds

from oracle import assert_close


@pytest.mark.parametrize("members", [1, 2, 3, 5])
@pytest.mark.parametrize("length", [2, 7, 64])
def test_every_member_ends_with_the_sum(members, length):
    rng = np.random.default_rng(members * 100 + length)
    vectors = [rng.standard_normal(length) for _ in range(members)]
    ring = [RingMember(k, members) for k in range(members)]
    first = [m.ring_begin(v.copy()) for m, v in zip(ring, vectors)]
    calls = []

    def invoke(member, round_, chunk):
        calls.append(round_)
        return member.ring_receive(round_, chunk)

    last = ring_allreduce(ring, first, invoke)
    assert last == [None] * members
    assert len(calls) == members * ring_rounds(members)
    for m in ring:
        assert_close(m.reduced, np.sum(vectors, axis=0), rtol=1e-15)
        assert m.reduced.tobytes() == ring[0].reduced.tobytes()


def test_each_member_sends_two_n_minus_one_chunks_of_a_nth():
    members, length = 4, 400
    ring = [RingMember(k, members) for k in range(members)]
    sent = {k: 0 for k in range(members)}
    first = [m.ring_begin(np.ones(length)) for m in ring]
    for k, chunk in enumerate(first):
        sent[k] += chunk.size

    def invoke(member, round_, chunk):
        out = member.ring_receive(round_, chunk)
        sent[member.rank] += 0 if out is None else out.size
        return out

    ring_allreduce(ring, first, invoke)
    assert sent == {k: 2 * (members - 1) * length // members for k in range(members)}
