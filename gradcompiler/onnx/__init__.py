"""ONNX in and out: `from_onnx` builds a Graph from a model with the frontend's calls, and
`to_onnx` writes a (differentiated) graph back as a model, both through the one op table of
`op_table.py`, so import and export never disagree. The `onnx` package is an optional
extra (`pip install gradcompiler[onnx]`); it is imported only when these run.
"""

from __future__ import annotations

from .exporter import to_onnx
from .importer import ImportedModel, from_onnx

__all__ = ["ImportedModel", "from_onnx", "to_onnx"]
