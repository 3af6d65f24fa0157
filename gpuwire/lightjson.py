"""JSON on the container-start path without importing the `json` package.

`import json` compiles its regular expressions at import (`re`, which imports `enum`):
about 10 ms on a small node, on every container start, to read a few small documents
(the OCI spec and state, allocation tokens). The
work itself is done by the C scanner and encoder `json` wraps (`_json`); this module
drives them directly with `json`'s defaults (strict strings, ASCII output) and refuses
NaN and Infinity, which are not JSON. Same parser, same output as `json.loads`/`dumps`.
"""

from __future__ import annotations

import _json


class _Context:
    """What `_json.make_scanner` reads from a json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")


def _unserialisable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_scan = _json.make_scanner(_Context)  # type: ignore[arg-type] # typeshed wants a scanner
# markers, default, encoder, indent, key separator, item separator, sort_keys, skipkeys,
# allow_nan: json.dumps' defaults, as json.encoder passes them.
_encode = _json.make_encoder(
    None, _unserialisable, _json.encode_basestring_ascii, None, ": ", ", ", False, False, False
)


def loads(text: str | bytes) -> object:
    """The value of one JSON document; ValueError says where it is not JSON."""
    body = (text.decode() if isinstance(text, bytes) else text).strip(" \t\n\r")
    try:
        value, end = _scan(body, 0)
    except StopIteration as exc:
        raise ValueError(f"not JSON at character {exc.value}") from None
    if end != len(body):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


def dumps(value: object) -> str:
    return "".join(_encode(value, 0))
