"""`KernelDag` answers as networkx does on random acyclic graphs built edge by edge: the same
reachability, the same smallest-first topological order, the same graph after contractions."""

import networkx as nx
import numpy as np
import pytest

from gradcompiler.passes.kernel_dag import KernelDag
from gradcompiler.passes.work import WorkCounter


def _random_pair(rng, n: int):
    """A KernelDag and a networkx DiGraph with the same random acyclic edges, inserted in an
    order that often disagrees with the kernels' indices (so ranks must be renumbered)."""
    hidden = rng.permutation(n)  # a topological order unknown to the KernelDag
    dag, ref = KernelDag(WorkCounter()), nx.DiGraph()
    for k in range(n):
        dag.add_node(k)
        ref.add_node(k)
    for _ in range(3 * n):
        a, b = rng.choice(n, 2, replace=False)
        if hidden[a] > hidden[b]:
            a, b = b, a
        dag.add_edge(int(a), int(b))
        ref.add_edge(int(a), int(b))
    return dag, ref


def _ranks_are_topological(dag: KernelDag) -> bool:
    return all(dag.rank[a] < dag.rank[b] for a, succ in dag.succ.items() for b in succ)


@pytest.mark.parametrize("seed", range(5))
def test_reachability_and_order_match_networkx(seed):
    rng = np.random.default_rng(seed)
    dag, ref = _random_pair(rng, 30)
    assert _ranks_are_topological(dag)
    assert dag.topological_order() == list(nx.lexicographical_topological_sort(ref))
    for a in range(30):
        for b in range(30):
            if a != b:
                assert dag.reaches_any(a, {b}) == nx.has_path(ref, a, b)


@pytest.mark.parametrize("seed", range(5))
def test_contraction_matches_networkx(seed):
    rng = np.random.default_rng(100 + seed)
    dag, ref = _random_pair(rng, 30)
    contracted = 0
    for a, b in list(ref.edges):
        if a not in ref or b not in ref or not ref.has_edge(a, b):
            continue
        ref.remove_edge(a, b)
        alone = not nx.has_path(ref, a, b)
        ref.add_edge(a, b)
        if alone:
            dag.contract(a, b)
            nx.contracted_nodes(ref, a, b, self_loops=False, copy=False)
            contracted += 1
    assert contracted > 3
    assert _ranks_are_topological(dag)
    assert {(a, b) for a, s in dag.succ.items() for b in s} == set(ref.edges)
    assert dag.topological_order() == list(nx.lexicographical_topological_sort(ref))
