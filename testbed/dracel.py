"""CEL device selectors evaluated as the kube-scheduler's DRA allocator evaluates them, on
cel-python.

The environment is k8s.io/dynamic-resource-allocation `cel/compile.go`'s: one variable,
`device`, with `driver` (string), `attributes` and `capacity` (domain → name → value; an
unprefixed name belongs to the device's driver's domain, a domain nobody published is an
empty map, a missing name is an error), and `allowMultipleAllocations` (bool). Attribute
values keep their type: int, bool, string, and version as a semver value; capacities are
quantities. Functions beyond standard CEL, from k8s.io/apiserver `pkg/cel/library` and cel-go's
ext strings, as far as gpuwire's selectors and the allocator tests' use them: `lowerAscii`,
`upperAscii`, `replace`, `quantity()` with `compareTo`, `isGreaterThan`, `isLessThan`,
`asInteger`, and `semver()` with the same comparisons. A result that is not a bool is an
error, as it is for the scheduler.

Left out: the cost limit and estimates, type checking at compile time (cel-python checks
at evaluation: an undeclared name fails when a device is tried, which the allocator reports
as the scheduler does), the other library functions (lists, sets, regex `find`, IP/CIDR,
optionals), and list-typed attributes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import celpy
import celpy.celtypes as ct
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from gpuwire.quantity import QuantityError, api_value

_SEMVER = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z.-]+))?$")


class CelError(ValueError):
    """A selector that does not compile, fails on a device, or is not a bool."""


@functools.total_ordering
class _Ordered:
    """A value CEL compares by its key, equal only to a value of its own kind."""

    key: Any

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.key == other.key

    def __lt__(self, other: _Ordered) -> bool:
        return bool(self.key < other.key)

    def __hash__(self) -> int:
        return hash(self.key)


class Quantity(_Ordered):
    """A resource.Quantity: its exact value."""

    def __init__(self, text: str) -> None:
        try:
            numerator, denominator = api_value(text)
        except QuantityError as exc:
            raise CelError(str(exc)) from None
        self.value = self.key = Fraction(numerator, denominator)
        self.text = text

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


class Semver(_Ordered):
    """A semantic version (semver 2.0.0; a pre-release orders before its release)."""

    def __init__(self, text: str) -> None:
        m = _SEMVER.match(text)
        if not m:
            raise CelError(f"{text!r} is not a semantic version")
        self.key = (int(m[1]), int(m[2]), int(m[3]), m[4] is None, m[4] or "")
        self.text = text


def _compare(a: Any, b: Any) -> ct.IntType:
    if type(a) is not type(b) or not isinstance(a, Quantity | Semver):
        raise CelError(f"compareTo: {a!r} and {b!r} are not two quantities or two versions")
    return ct.IntType(0 if a == b else -1 if a < b else 1)


def _as_integer(q: Quantity) -> ct.IntType:
    if q.value.denominator != 1:
        raise CelError(f"{q!r} is not an integer")
    return ct.IntType(q.value.numerator)


_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lowerAscii": lambda s: ct.StringType(s.translate(_LOWER)),
    "upperAscii": lambda s: ct.StringType(s.translate(_UPPER)),
    "replace": lambda s, old, new: ct.StringType(s.replace(old, new)),
    "quantity": lambda s: Quantity(str(s)),
    "semver": lambda s: Semver(str(s)),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: ct.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: ct.BoolType(_compare(a, b) < 0),
    "asInteger": _as_integer,
}


class _Domains(ct.MapType):
    """domain → its map; a domain no attribute names is an empty map, not an error."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return ct.MapType()


def _value(attribute: Mapping[str, Any]) -> Any:
    kind, value = next(iter(attribute.items()))
    if kind == "int":
        return ct.IntType(value)
    if kind == "bool":
        return ct.BoolType(value)
    if kind == "string":
        return ct.StringType(value)
    if kind == "version":
        return Semver(value)
    raise CelError(f"unsupported attribute value {attribute!r}")


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return domain or driver, short


def device(entry: Mapping[str, Any], driver: str) -> ct.MapType:
    """The `device` variable for a slice's device entry of `driver`."""
    attributes: dict[str, dict[Any, Any]] = {}
    for name, value in (entry.get("attributes") or {}).items():
        domain, short = _split(name, driver)
        attributes.setdefault(domain, {})[ct.StringType(short)] = _value(value)
    capacity: dict[str, dict[Any, Any]] = {}
    for name, value in (entry.get("capacity") or {}).items():
        domain, short = _split(name, driver)
        capacity.setdefault(domain, {})[ct.StringType(short)] = Quantity(str(value["value"]))
    return ct.MapType(
        {
            ct.StringType("driver"): ct.StringType(driver),
            ct.StringType("attributes"): _Domains(
                {ct.StringType(d): ct.MapType(v) for d, v in attributes.items()}
            ),
            ct.StringType("capacity"): _Domains(
                {ct.StringType(d): ct.MapType(v) for d, v in capacity.items()}
            ),
            ct.StringType("allowMultipleAllocations"): ct.BoolType(
                entry.get("allowMultipleAllocations") is True
            ),
        }
    )


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Any:
    """A program for `expression`; CelError if it does not parse."""
    env = celpy.Environment()
    try:
        return env.program(env.compile(expression), functions=FUNCTIONS)
    except CELParseError as exc:
        raise CelError(f"{expression}: {exc}") from None


def _reason(error: Exception) -> str:
    """cel-python's message without the activation it dumps after it."""
    text = str(error.args[0] if error.args else error)
    return text.split(" (in activation")[0]


def matches(expression: str, variable: ct.MapType) -> bool:
    """Whether the selector selects the device; CelError as the scheduler would fail."""
    try:
        result = compile_selector(expression).evaluate({"device": variable})
    except (CELEvalError, TypeError, KeyError) as exc:
        raise CelError(f"{expression}: {_reason(exc)}") from None
    if isinstance(result, CELEvalError):
        raise CelError(f"{expression}: {_reason(result)}")
    if not isinstance(result, ct.BoolType):
        raise CelError(f"{expression}: the result is {type(result).__name__}, not a bool")
    return bool(result)
