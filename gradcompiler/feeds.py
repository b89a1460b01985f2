"""Feed validation shared by the reference interpreter and every backend.

A feed is checked before anything runs: a missing or unexpected name, a
wrong shape or a wrong dtype is a `FeedError` naming the feed and both the
expected and the given type. Non-contiguous arrays and arrays of the right
dtype in the other byte order are copied (never read with the wrong strides
or bytes); read-only arrays are fine, since feeds are never written.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from .errors import FeedError
from .ir import Node


def validate_feeds(
    placeholders: list[Node], feeds: Mapping[str, Any], ignorable: Collection[str] = ()
) -> dict[str, np.ndarray]:
    """Check `feeds` against the placeholders a program needs; return contiguous arrays by name.

    `ignorable` names feeds of the same graph that this program does not read (a
    gradient that does not depend on a label, say): they are accepted and ignored,
    so one feed dict serves every output. Any other unknown name is an error.
    """
    expected = {n.op.feed_name: n for n in placeholders}
    missing = sorted(set(expected) - set(feeds))
    extra = sorted(set(feeds) - set(expected) - set(ignorable))
    if missing:
        raise FeedError(f"missing feed(s) {missing}; this program needs {sorted(expected)}")
    if extra:
        raise FeedError(f"unexpected feed(s) {extra}; this program takes {sorted(expected)}")
    arrays = {}
    for name, node in expected.items():
        value = feeds[name]
        if value is None:
            raise FeedError(f"feed '{name}' is None; it needs an array of shape {node.type.shape} "
                            f"and dtype {node.type.dtype.name}")
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        want = node.type
        if array.dtype != want.dtype and array.dtype.newbyteorder("=") == want.dtype:
            array = array.astype(want.dtype)  # big-endian float32 is still float32
        if array.dtype != want.dtype:
            raise FeedError(
                f"feed '{name}' has dtype {array.dtype.name}, expected {want.dtype.name}; "
                f"convert it with .astype(np.{want.dtype.name})"
            )
        if tuple(array.shape) != want.shape:
            raise FeedError(f"feed '{name}' has shape {tuple(array.shape)}, expected {want.shape}")
        # ascontiguousarray would turn a 0-d feed into shape (1,); 0-d arrays are always contiguous
        arrays[name] = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    return arrays
