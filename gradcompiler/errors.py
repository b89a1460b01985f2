"""Exceptions a user can act on.

Every error the library raises for user input comes from here. Build-time
errors (`ShapeError`, `DTypeError`, `GraphError`) name the op, the shapes or
dtypes involved and the user's own line (the call site recorded on the node
being built). Run-time errors (`FeedError`, `IndexOutOfRangeError`,
`NonFiniteError`) are raised before any compiled kernel touches memory, so a
bad feed can never crash the interpreter.
"""

from __future__ import annotations


class GradCompilerError(Exception):
    """Base class of every error this library raises on purpose."""


class BuildError(GradCompilerError):
    """A mistake detected while the graph is being built."""

    def __init__(self, message: str, op: str | None = None, site: str | None = None):
        self.message = message
        self.op = op
        self.site = site
        prefix = f"{op}: " if op else ""
        suffix = f"\n  at {site}" if site else ""
        super().__init__(f"{prefix}{message}{suffix}")

    def at(self, site: str) -> BuildError:
        """The same error, pointing at `site` (the user's line)."""
        return type(self)(self.message, op=self.op, site=site)


class ShapeError(BuildError, ValueError):
    """Shapes that do not fit the op (wrong rank, mismatched dims, bad axis)."""


class DTypeError(BuildError, TypeError):
    """A dtype the op does not accept, or two inputs whose dtypes disagree."""


class GraphError(BuildError):
    """A malformed graph: a cycle, a node from another graph, a missing name."""


class MemoryPlanError(BuildError, MemoryError):
    """A compiled step's buffers cannot exist: more bytes than the target's memory."""


class NotDifferentiableError(BuildError, NotImplementedError):
    """A gradient was asked for that does not exist or is not implemented."""


class RunError(GradCompilerError):
    """A problem found when a graph is run."""


class FeedError(RunError, ValueError):
    """A feed is missing, unexpected, or has the wrong shape, dtype or layout."""


class IndexOutOfRangeError(RunError, IndexError):
    """An index value lies outside the axis it indexes."""


class NonFiniteError(RunError, FloatingPointError):
    """Debug mode found NaN or Inf in a kernel's output."""


class OutOfBoundsWriteError(RunError, MemoryError):
    """The bounds check found a kernel's write outside its buffer (guard bytes overwritten)."""


class MemoryBudgetError(GradCompilerError, ValueError):
    """A memory budget below the smallest peak any plan of the step reaches; that peak in
    bytes is `smallest_peak`, so a caller (the benchmark's budget sweep) can report it or
    compile at it without reading the message."""

    def __init__(self, message: str, smallest_peak: int | None = None):
        super().__init__(message)
        self.smallest_peak = smallest_peak


class BackendUnavailableError(GradCompilerError, RuntimeError):
    """The requested target cannot run here (no GPU and no simulator, say)."""


class OnnxError(GradCompilerError, ValueError):
    """An ONNX model that cannot be imported or a graph that cannot be exported: a file that
    is not ONNX, a symbolic dimension without a size, a dtype this project lacks, an
    attribute value the importer does not implement. The message names the node or input."""


class UnsupportedOnnxOp(OnnxError, NotImplementedError):
    """An ONNX op type outside the op table (gradcompiler/onnx/op_table.py)."""


class OnnxValueRequired(OnnxError):
    """A graph input that sets a shape (a Reshape's target, a Slice's bounds) was not given a
    value at import time; `input_name` names it: pass `values={input_name: array}`."""

    def __init__(self, message: str, input_name: str):
        super().__init__(message)
        self.input_name = input_name


class ShardError(BuildError, ValueError):
    """A graph or batch that data-parallel training cannot split into shards: feeds that
    disagree on axis 0, more workers than samples, a node whose shape bakes the batch in."""


class WorkerLostError(RunError):
    """A data-parallel worker died; names the worker and the step it died in."""


class ReplicaDivergedError(RunError):
    """The replicas of a data-parallel trainer no longer hold the same parameters."""
