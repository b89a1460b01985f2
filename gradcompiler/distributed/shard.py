"""Splitting a global batch into shards, and the graph re-specialised to a shard's size.

Shapes are static, so a worker that computes 5 samples of a 10-sample batch
needs a graph of 5 samples. `specialise` makes it from the forward graph, not
from the differentiated one: every data feed's axis 0 becomes the shard's size
and every node downstream is re-inferred by its own op. Differentiating after
that is what keeps the backward right, because rules bake shapes into their
nodes (the gradient of a mean scales by 1/count as a constant of the graph);
re-inferring a backward would keep the old count and be silently wrong.

An op that carries a shape (Reshape, Broadcast, ReduceTo) follows the batch
when it reads a value that follows it and its shape starts with the batch
size: a reshape (B, 784) → (B, 28, 28) becomes (b, 28, 28). Anything else that
bakes the batch in (a reshape that merges it with another axis, a constant of
the batch's length) fails its op's own shape check, and that is raised as a
ShardError naming the node and the user's line.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import BuildError, FeedError, ShardError
from ..ir import Graph, Node, Op


def data_feeds(graph: Graph, ids: Iterable[int]) -> list[Node]:
    """The data feeds (role `input`) among the nodes `ids`, in id order."""
    return [graph[i] for i in sorted(ids) if graph[i].role == "input"]


def batch_size(feeds: list[Node]) -> int:
    """The axis-0 size every data feed shares, or a ShardError naming the first that differs."""
    if not feeds:
        raise ShardError("data-parallel training splits the data feeds along axis 0, but the "
                         "loss reads no gc.input")
    for node in feeds:
        if not node.type.shape:
            raise ShardError(f"data feed '{node.name}' is a scalar; every data feed is split "
                             "along axis 0, the batch axis", site=node.site)
    first = feeds[0]
    for node in feeds[1:]:
        if node.type.shape[0] != first.type.shape[0]:
            raise ShardError(f"data feeds disagree on the batch (axis 0): '{first.name}' has "
                             f"{first.type.shape[0]} samples, '{node.name}' "
                             f"{node.type.shape[0]}; every data feed is split along axis 0",
                             site=node.site)
    return first.type.shape[0]


def shard_sizes(batch: int, workers: int) -> list[int]:
    """Samples per worker, as numpy's array_split deals them: the first `batch % workers`
    shards one larger."""
    if not isinstance(workers, int) or workers < 1:
        raise ShardError(f"workers={workers!r}; it must be a positive integer")
    if workers > batch:
        raise ShardError(f"workers={workers} is more than the batch of {batch} samples: a "
                         "worker would get an empty shard")
    return [batch // workers + (k < batch % workers) for k in range(workers)]


def split_batch(data: Mapping[str, Any], feeds: list[Node], sizes: list[int]) -> list[dict]:
    """One dict of views per shard of the global batch `data`, checked against the feeds."""
    names = {node.name: node for node in feeds}
    unknown, missing = sorted(set(data) - set(names)), sorted(set(names) - set(data))
    if unknown or missing:
        raise FeedError(f"data-parallel step: the batch must give exactly the data feeds "
                        f"{sorted(names)}; missing {missing}, unexpected {unknown}")
    arrays = {name: np.asarray(value) for name, value in data.items()}
    batch = sum(sizes)
    for name, array in arrays.items():
        if array.shape != names[name].type.shape:
            raise FeedError(f"data-parallel step: '{name}' has shape {array.shape}, expected "
                            f"{names[name].type.shape} (a global batch of {batch})")
    bounds = np.cumsum([0, *sizes])
    return [{name: array[lo:hi] for name, array in arrays.items()}
            for lo, hi in itertools.pairwise(bounds)]


def _following(op: Op, batch: int, shard: int) -> Op:
    """`op` with a carried shape that starts with the batch size made to start with `shard`."""
    shape = getattr(op, "shape", None)
    if not dataclasses.is_dataclass(op) or not isinstance(shape, tuple) or shape[:1] != (batch,):
        return op
    return dataclasses.replace(op, shape=(shard, *shape[1:]))


def specialise(graph: Graph, keep: Iterable[int], batch: int, shard: int) -> Graph:
    """A copy of `graph` holding the ancestors of `keep`, whose data feeds have `shard`
    samples instead of `batch` (module docstring)."""
    clone = graph.copy(f"{graph.name}[{shard} of {batch}]")
    clone.remove(set(graph.nodes) - graph.ancestors(keep))
    follows: set[int] = set()
    for i in clone.topo_order():
        node = clone[i]
        if node.role == "input":
            op = dataclasses.replace(node.op, shape=(shard, *node.op.shape[1:]))
        elif any(j in follows for j in node.inputs):
            op = _following(node.op, batch, shard)
        else:
            continue
        follows.add(i)
        try:
            inferred = op.infer(*(clone[j].type for j in node.inputs))
        except BuildError as err:
            name = f" '{node.name}'" if node.name else ""
            raise ShardError(f"%{node.id}{name} cannot follow the batch from {batch} to a shard "
                             f"of {shard} samples: {err.message}. Its shape bakes the batch "
                             "size in, so this graph cannot be split along axis 0",
                             op=node.op.label, site=node.site) from None
        clone.nodes[i] = dataclasses.replace(node, op=op, type=inferred)
    return clone
