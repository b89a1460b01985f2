"""A progress bar while kernels compile: the one hook a backend calls.

    with compile_progress(len(kernels)) as tick:
        for kernel in kernels:
            build(kernel)
            tick(kernel.name)

Numba takes seconds per kernel, so a graph with dozens of distinct kernels is
a silent minute without it. The bar appears only when there are more than
`MIN_KERNELS_FOR_BAR` kernels to compile and standard error is a terminal
(tqdm's own rule), or when `GRADCOMPILER_PROGRESS=1` asks for it; `=0`
silences it. The hook knows nothing of kernels or backends, so any stage may
use it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

MIN_KERNELS_FOR_BAR = 3


def _wanted(total: int, enabled: bool | None) -> bool | None:
    """True/False to force the bar on or off; None lets tqdm show it on a terminal only."""
    if total == 0:
        return False  # nothing to wait for
    if enabled is not None:
        return enabled
    setting = os.environ.get("GRADCOMPILER_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    return None if total > MIN_KERNELS_FOR_BAR else False


@contextmanager
def compile_progress(total: int, description: str = "compiling kernels",
                     enabled: bool | None = None,
                     file: TextIO | None = None) -> Iterator[Callable[[str], None]]:
    """Yield `tick(kernel_name)`, to be called once per kernel compiled."""
    wanted = _wanted(total, enabled)
    # Redraw on every tick: a tick comes seconds apart, after a Numba compile.
    bar = tqdm(total=total, desc=description, unit="kernel", file=file or sys.stderr,
               disable=None if wanted is None else not wanted, leave=False, mininterval=0)

    def tick(kernel_name: str) -> None:
        bar.set_postfix_str(kernel_name, refresh=False)
        bar.update(1)

    try:
        yield tick
    finally:
        bar.close()
