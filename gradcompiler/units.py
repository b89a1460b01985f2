"""Byte sizes and counts as people read them, for every text the compiler shows.

    format_bytes(1536) -> "1.5 KiB"; format_count(1_250_000) -> "1.25 M"

One module so that the pass stats, the report and the DOT dump print the same
figure the same way. It imports nothing of the compiler, so any layer
(passes included) may use it.
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_COUNT_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_bytes(nbytes: int) -> str:
    """`1536` → `1.5 KiB`: binary units, exact below one KiB."""
    value = float(nbytes)
    for unit in _UNITS[:-1]:
        if abs(value) < 1024:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {_UNITS[-1]}"


def format_count(count: float) -> str:
    """`1_250_000` → `1.25 M`: decimal prefixes, exact below a thousand."""
    for scale, prefix in _COUNT_PREFIXES:
        if abs(count) >= scale:
            return f"{count / scale:.3g} {prefix}"
    return f"{int(count)}"
