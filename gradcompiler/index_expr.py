"""Integer index expressions over a kernel's loop indices.

A fused kernel reads every input through an *index map*: the flat offset
into that input's buffer, as an expression of the loop indices `i0, i1, ...`
of the kernel's iteration domain. Broadcasting zeroes an index, a transpose
permutes them, a reshape ravels and unravels them, a pixel shuffle splits
one index into a quotient and a remainder. This module is the small algebra
those maps are written in, and it simplifies as it builds, so that
`reshape(transpose(transpose(x)))` reads `x[i0 * 32 + i1]` rather than a
tower of `//` and `%`.

An `Index` is an affine combination `Σ coeff·atom + const`. An atom is a
loop index (`Axis(k)`) or a *digit* `Digit(e, div, mod) = (e // div) % mod`
(`mod=None`: no modulo), which covers every floor division and remainder a
view can produce. Simplification needs the range of each loop index, so the
operations that divide (`floordiv`, `mod`, `unravel`) take the domain's
extents. Three rules do all the work:

* split: `e = div·q + r` with `0 <= r < div` over the whole domain gives
  `e // div = q` and `e % div = r`;
* nesting: `(e // a) // b = e // (a·b)`, and a digit of a digit is one digit
  where the moduli divide;
* recombination: `k·Digit(e, d, m) + k·m·Digit(e, d·m, M) = k·Digit(e, d, m·M)`
  and `Digit(e, 1, None) = e`, which undoes an unravel followed by a ravel.

Everything here is target-neutral: `render` writes Python/Numba integer
arithmetic; the CUDA backend renders the same expressions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    """The loop index of domain axis `k`."""

    k: int


@dataclass(frozen=True)
class Digit:
    """`(expr // div) % mod`, or `expr // div` when `mod` is None."""

    expr: Index
    div: int
    mod: int | None


Atom = Axis | Digit


def _atom_key(atom: Atom) -> tuple:
    """A total order on atoms: loop indices first, by axis; digits after, by structure."""
    if isinstance(atom, Axis):
        return (0, atom.k)
    return (1, atom.expr.terms_key(), atom.expr.const, atom.div, atom.mod or 0)


@dataclass(frozen=True)
class Index:
    """`Σ coeff·atom + const`, terms sorted, coefficients non-zero."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # -- construction -------------------------------------------------------------
    @staticmethod
    def axis(k: int) -> Index:
        return Index(((Axis(k), 1),))

    @staticmethod
    def lit(value: int) -> Index:
        return Index((), int(value))

    @staticmethod
    def of(terms: dict, const: int) -> Index:
        """Normalise a term dict: drop zeros, recombine digits, sort."""
        terms = {a: c for a, c in terms.items() if c}
        changed = True
        while changed:
            changed = _recombine_once(terms)
        if any(isinstance(a, Digit) and a.div == 1 and a.mod is None for a in terms):
            expanded: dict = {}
            for atom, coeff in terms.items():
                if isinstance(atom, Digit) and atom.div == 1 and atom.mod is None:
                    for inner, c in atom.expr.terms:
                        expanded[inner] = expanded.get(inner, 0) + c * coeff
                    const += atom.expr.const * coeff
                else:
                    expanded[atom] = expanded.get(atom, 0) + coeff
            return Index.of(expanded, const)
        return Index(tuple(sorted(terms.items(), key=lambda t: _atom_key(t[0]))), int(const))

    def terms_key(self) -> tuple:
        return tuple((_atom_key(a), c) for a, c in self.terms)

    def __add__(self, other: Index | int) -> Index:
        other = other if isinstance(other, Index) else Index.lit(other)
        terms = dict(self.terms)
        for atom, coeff in other.terms:
            terms[atom] = terms.get(atom, 0) + coeff
        return Index.of(terms, self.const + other.const)

    def __mul__(self, factor: int) -> Index:
        factor = int(factor)
        return Index.of({a: c * factor for a, c in self.terms}, self.const * factor)

    # -- queries ----------------------------------------------------------------------
    def is_constant(self) -> bool:
        return not self.terms

    def axes(self) -> set[int]:
        """The loop indices this expression depends on."""
        found: set[int] = set()
        for atom, _ in self.terms:
            found |= {atom.k} if isinstance(atom, Axis) else atom.expr.axes()
        return found

    def bounds(self, extents: Sequence[int]) -> tuple[int, int]:
        """Smallest and largest value over the domain `extents` (each extent >= 1)."""
        lo = hi = self.const
        for atom, coeff in self.terms:
            a_lo, a_hi = _atom_bounds(atom, extents)
            lo += min(coeff * a_lo, coeff * a_hi)
            hi += max(coeff * a_lo, coeff * a_hi)
        return lo, hi

    def render(self, names: Sequence[str]) -> str:
        """Integer arithmetic in Python syntax; `names[k]` is loop index k's variable."""
        parts = []
        for atom, coeff in self.terms:
            text = _render_atom(atom, names)
            parts.append(text if coeff == 1 else f"{text} * {coeff}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


def _atom_bounds(atom: Atom, extents: Sequence[int]) -> tuple[int, int]:
    if isinstance(atom, Axis):
        return 0, max(extents[atom.k] - 1, 0)
    lo, hi = atom.expr.bounds(extents)
    lo, hi = lo // atom.div, hi // atom.div
    if atom.mod is not None and not (0 <= lo and hi < atom.mod):
        return 0, atom.mod - 1
    return lo, hi


def _render_atom(atom: Atom, names: Sequence[str]) -> str:
    if isinstance(atom, Axis):
        return names[atom.k]
    inner = atom.expr.render(names)
    inner = inner if not atom.expr.const and len(atom.expr.terms) == 1 and atom.expr.terms[0][1] == 1 else f"({inner})"
    text = f"({inner} // {atom.div})" if atom.div != 1 else inner
    return f"({text} % {atom.mod})" if atom.mod is not None else text


def _recombine_once(terms: dict) -> bool:
    """Merge one pair `k·Digit(e,d,m) + k·m·Digit(e,d·m,M)` into `k·Digit(e,d,m·M)`."""
    digits = [(a, c) for a, c in terms.items() if isinstance(a, Digit) and a.mod is not None]
    for low, k in digits:
        for high, c in list(terms.items()):
            if (
                isinstance(high, Digit)
                and high.expr == low.expr
                and high.div == low.div * low.mod
                and c == k * low.mod
            ):
                del terms[low], terms[high]
                merged = Digit(low.expr, low.div, None if high.mod is None else low.mod * high.mod)
                terms[merged] = terms.get(merged, 0) + k
                return True
    return False


def _split(e: Index, div: int) -> tuple[Index, Index]:
    """`e = div·q + r`, putting every term whose coefficient `div` divides into q."""
    q_terms, r_terms = {}, {}
    for atom, coeff in e.terms:
        if coeff % div == 0:
            q_terms[atom] = coeff // div
        else:
            r_terms[atom] = coeff
    return Index.of(q_terms, e.const // div), Index.of(r_terms, e.const % div)


def floordiv(e: Index, div: int, extents: Sequence[int]) -> Index:
    """`e // div` (floor), simplified over the domain `extents`."""
    return digit(e, div, None, extents)


def mod(e: Index, modulus: int, extents: Sequence[int]) -> Index:
    """`e % modulus` (non-negative), simplified over the domain `extents`."""
    return digit(e, 1, modulus, extents)


def digit(e: Index, div: int, modulus: int | None, extents: Sequence[int]) -> Index:
    """`(e // div) % modulus`, simplified; `modulus=None` means no remainder.

    Digits are kept canonical (a digit never wraps a lone digit of the same
    expression), so that recombination can match them.
    """
    if div != 1:
        e = _divide(e, div, extents)
    if modulus is None:
        return e
    _, r = _split(e, modulus)
    lo, hi = r.bounds(extents)
    if 0 <= lo and hi < modulus:
        return r
    inner = _lone_digit(r)
    if inner is not None and (inner.mod is None or inner.mod % modulus == 0):
        return Index.of({Digit(inner.expr, inner.div, modulus): 1}, 0)
    for g in _divisors(modulus):
        high, low = _split(r, g)
        lo, hi = low.bounds(extents)
        if 0 <= lo and hi < g and not high.is_constant():
            return digit(high, 1, modulus // g, extents) * g + low
    return Index.of({Digit(r, 1, modulus): 1}, 0)


def _divide(e: Index, div: int, extents: Sequence[int]) -> Index:
    """`e // div`, simplified: exact parts come out, then staged division by divisors of div."""
    q, r = _split(e, div)
    lo, hi = r.bounds(extents)
    if 0 <= lo and hi < div:
        return q
    if not q.is_constant() or q.const:
        return q + _divide(r, div, extents)
    inner = _lone_digit(e)
    if inner is not None and inner.mod is None:
        return _divide(inner.expr, inner.div * div, extents)
    if inner is not None and inner.mod % div == 0:
        return digit(inner.expr, inner.div * div, inner.mod // div, extents)
    for g in _divisors(div):
        high, low = _split(e, g)
        lo, hi = low.bounds(extents)
        if 0 <= lo and hi < g and not high.is_constant():
            return _divide(high, div // g, extents)
    return Index.of({Digit(e, div, None): 1}, 0)


def _divisors(n: int) -> list[int]:
    """Divisors of n strictly between 1 and n, largest first."""
    return [g for g in range(n - 1, 1, -1) if n % g == 0]


def _lone_digit(e: Index) -> Digit | None:
    """The digit `e` consists of, if `e` is exactly one digit with coefficient 1."""
    if len(e.terms) == 1 and not e.const and e.terms[0][1] == 1 and isinstance(e.terms[0][0], Digit):
        return e.terms[0][0]
    return None


def substitute(e: Index, mapping: dict[int, Index], extents: Sequence[int]) -> Index:
    """`e` with loop index k replaced by `mapping[k]` (an expression over a new domain `extents`)."""
    total = Index.lit(e.const)
    for atom, coeff in e.terms:
        if isinstance(atom, Axis):
            part = mapping.get(atom.k, Index.axis(atom.k))
        else:
            part = digit(substitute(atom.expr, mapping, extents), atom.div, atom.mod, extents)
        total = total + part * coeff
    return total


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of `shape`."""
    result, step = [], 1
    for d in reversed(tuple(shape)):
        result.append(step)
        step *= d
    return tuple(reversed(result))


def ravel(index: Sequence[Index], shape: Sequence[int]) -> Index:
    """The row-major flat offset of multi-index `index` in `shape`."""
    total = Index.lit(0)
    for i, stride, d in zip(index, strides(shape), shape):
        if d != 1:
            total = total + i * stride
    return total


def unravel(flat: Index, shape: Sequence[int], extents: Sequence[int]) -> tuple[Index, ...]:
    """The multi-index in `shape` of row-major flat offset `flat`."""
    result = []
    for k, (stride, d) in enumerate(zip(strides(shape), shape)):
        if d == 1:
            result.append(Index.lit(0))
        else:
            result.append(digit(flat, stride, None if k == 0 else d, extents))
    return tuple(result)
