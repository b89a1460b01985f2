"""`collector_paused()`: no cyclic garbage collection while a graph is differentiated or compiled.

Python's collector runs a full collection, which scans every tracked object, each time the
surviving objects have grown by a quarter. Compiling a 100,000-node graph keeps millions of
small objects alive (nodes, index expressions, instructions), so the collections it triggers
rescan ever more of them: measured at depth 2,500 of the residual MLP they cost as much as
the compile itself, and made its time grow faster than the graph. The compiler creates little
cyclic garbage, so it runs with the collector paused; the collector is resumed on exit (when
it was on), and the next collection reclaims whatever cycles the compile left. Nested uses
leave the pause to the outermost one.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
