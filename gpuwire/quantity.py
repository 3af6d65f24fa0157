"""Memory sizes written the way Kubernetes writes them (`40Gi`, `80G`, `512Mi`).

A subset of the Kubernetes quantity grammar: a decimal number and a unit suffix. The unit is
required: a bare `40960` could mean bytes (Kubernetes) or MiB (HAMi, GFD labels), and guessing
wrong by a factor of a million is worse than asking.
"""

from __future__ import annotations

import re

MIB = 1 << 20

UNITS: dict[str, int] = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
ACCEPTED = "a size with a unit (Ki, Mi, Gi, Ti, k, M, G, T), e.g. 40Gi or 512Mi"

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]+)$")


class QuantityError(ValueError):
    """Text that is not a memory size."""


def _size(text: str) -> tuple[int, int]:
    """`40Gi` → bytes as an exact fraction (numerator, denominator): `1.5Gi` is (15 Gi, 10)."""
    m = _QUANTITY.match(text.strip())
    if not m or m.group(2) not in UNITS:
        raise QuantityError(f"{text!r} is not a memory size; accepted: {ACCEPTED}")
    whole, _, fraction = m.group(1).partition(".")
    return int(whole + fraction) * UNITS[m.group(2)], 10 ** len(fraction)


def mib_at_least(text: str) -> int:
    """The smallest whole MiB holding `text` (for "at least this much" requests)."""
    size, scale = _size(text)
    return -(-size // (scale * MIB))


def mib_at_most(text: str) -> int:
    """The largest whole MiB within `text` (for limits: never grant more than asked)."""
    size, scale = _size(text)
    return size // (scale * MIB)


# Quantities as the API server writes them (a bare number is in base units: bytes, or a count).

_API_SUFFIXES = {"": 1, "m": None, **UNITS, "Pi": 1 << 50, "Ei": 1 << 60, "P": 10**15, "E": 10**18}
_API = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|([A-Za-z]*))$")


def api_value(text: str) -> tuple[int, int]:
    """A Kubernetes Quantity (`20Gi`, `21474836480`, `1.5G`, `2e9`, `500m`) as an exact
    fraction (numerator, denominator) of its base unit; QuantityError if it is none."""
    m = _API.match(text.strip())
    suffix = m and (m.group(3) or "")
    if not m or suffix not in _API_SUFFIXES:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 20Gi, 30, 1.5G)")
    whole, _, fraction = m.group(1).lstrip("+").partition(".")
    numerator, denominator = int((whole or "0") + fraction), 10 ** len(fraction)
    if m.group(2):
        exponent = int(m.group(2)[1:])
        if exponent >= 0:
            numerator *= 10**exponent
        else:
            denominator *= 10**-exponent
    elif suffix == "m":
        denominator *= 1000
    else:
        numerator *= _API_SUFFIXES[suffix] or 1
    return numerator, denominator


def api_mib(text: str) -> int:
    """The whole MiB within a Quantity as the API server writes it; QuantityError if none."""
    numerator, denominator = api_value(text)
    return numerator // (denominator * MIB)


def canonical_mib(mib: int) -> str:
    """Whole MiB as the API server writes the quantity: the largest binary suffix that keeps
    it whole (81920 → `80Gi`, 81559 → `81559Mi`), so what gpuwire publishes reads back equal."""
    if mib == 0:
        return "0"
    for suffix, factor in (("Ei", 1 << 40), ("Pi", 1 << 30), ("Ti", 1 << 20), ("Gi", 1 << 10)):
        if mib % factor == 0:
            return f"{mib // factor}{suffix}"
    return f"{mib}Mi"
