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
