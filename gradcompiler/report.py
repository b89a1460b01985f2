"""The text of `step.report()`: what the compiler did to a graph, in words.

    format_report(executable) -> str
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(nbytes: int) -> str:
    """`1536` → `1.5 KiB`: binary units, exact below one KiB."""
    value = float(nbytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
