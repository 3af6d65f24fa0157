"""Memory sizes written the way Kubernetes writes them (`40Gi`, `80G`, `512Mi`).

A subset of the Kubernetes quantity grammar: a decimal number and a unit suffix. The unit is
required: a bare `40960` could mean bytes (Kubernetes) or MiB (HAMi, GFD labels), and guessing
wrong by a factor of a million is worse than asking.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

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


def parse_bytes(text: str) -> Decimal:
    """`40Gi` → bytes, exactly (`1.5Gi` is 1610612736)."""
    m = _QUANTITY.match(text.strip())
    if not m or m.group(2) not in UNITS:
        raise QuantityError(f"{text!r} is not a memory size; accepted: {ACCEPTED}")
    return Decimal(m.group(1)) * UNITS[m.group(2)]


def mib_at_least(text: str) -> int:
    """The smallest whole MiB holding `text` (for "at least this much" requests)."""
    return int((parse_bytes(text) / MIB).to_integral_value(ROUND_CEILING))


def mib_at_most(text: str) -> int:
    """The largest whole MiB within `text` (for limits: never grant more than asked)."""
    return int((parse_bytes(text) / MIB).to_integral_value(ROUND_FLOOR))
