"""Byte sizes as people read them: one formatter for binary units (KiB = 1024 B) and one for decimal (kB = 1000 B);
and `format_fixed`, a measured number with fixed decimals (or "—" where it is unknown); `format_ms`, seconds in ms.

Rounding is half-up on the exact value (1,152 B = 1.125 KiB → "1.13 KiB", not float's "1.12"); thousands are
grouped ("1,000 B", "13,878.00 PiB"), and the units run up to PiB (PB), past which the number grows.
"""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def _round_half_up(value: Fraction, places: int) -> Decimal:
    quantum = Decimal(1).scaleb(-places)
    exact = Decimal(value.numerator) / Decimal(value.denominator)  # 28 significant digits: ample for bytes
    return exact.quantize(quantum, rounding=ROUND_HALF_UP)


def _unit_index(value: Fraction, step: int, units: tuple[str, ...]) -> int:
    """The largest unit the exact value reaches."""
    index = 0
    while index < len(units) - 1 and value >= step ** (index + 1):
        index += 1
    return index


def binary_unit(n_bytes: float) -> tuple[str, int]:
    """The binary unit a size reads best in, and its size in bytes: 2.5 TiB → ("TiB", 2**40); a chart's axis
    of several sizes takes the largest's."""
    index = _unit_index(abs(Fraction(n_bytes)), 1024, BINARY_UNITS)
    return BINARY_UNITS[index], 1024**index


def _format(n_bytes: float, step: int, units: tuple[str, ...]) -> str:
    value = Fraction(n_bytes)  # exact for every int and float
    sign = "-" if value < 0 else ""
    value = abs(value)
    index = _unit_index(value, step, units)
    value /= step**index
    if index == 0:  # whole bytes; a fractional byte (int4's half a byte per value) keeps its fraction
        text = f"{int(value):,}" if value.denominator == 1 else f"{_round_half_up(value, 2).normalize():,f}"
    else:
        text = f"{_round_half_up(value, 2):,.2f}"
    return f"{sign}{text} {units[index]}"


def format_binary(n_bytes: float) -> str:
    """Binary units, labelled as such (KiB = 1024 B): the usual calculator mistake is GiB printed as GB."""
    return _format(n_bytes, 1024, BINARY_UNITS)


def format_exact(n_bytes: int) -> str:
    """Exact bytes, with the binary size beside them once that says something more: "768 B", "12,288 B (12.00 KiB)"."""
    exact = f"{n_bytes:,} B"
    human = format_binary(n_bytes)
    return exact if human == exact else f"{exact} ({human})"


def format_decimal(n_bytes: float) -> str:
    """Decimal units (kB = 1000 B, GB = 10⁹ B), only for comparison with marketed sizes; shown beside binary."""
    return _format(n_bytes, 1000, DECIMAL_UNITS)



UNKNOWN = "—"  # what a table or a sentence shows for a number nobody measured


def format_fixed(value: float | None, digits: int = 1, *, scale: float = 1.0, unit: str = "") -> str:
    """`value · scale` with `digits` decimals and the unit after a space: format_fixed(0.01234, scale=1e3, unit="ms")
    is "12.3 ms"; None (not measured) is "—", never 0."""
    if value is None:
        return UNKNOWN
    text = f"{value * scale:.{digits}f}"
    return f"{text} {unit}" if unit else text


def format_ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds as milliseconds with `digits` decimals: format_ms(0.0125) is "12.50 ms"; None is "—"."""
    return format_fixed(seconds, digits, scale=1e3, unit="ms")
