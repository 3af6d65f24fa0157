"""Immutable value types for the modules a container start imports, without `dataclasses`.

`gpuwire-hook` and `gpuwire-runtime` import those modules (`runtime_hook.start.MODULES`) on
every container start. `dataclasses` pulls in `inspect`, `re` and `enum`, and `enum` alone
costs more than the rest of a hook's imports (`python -X importtime`), so their types are
written out: a `Value` subclass lists its fields in constructor order as
`__slots__ = _fields = (...)`, sets them in a typed `__init__` through `_set`, and gets what
the contract used from dataclasses: equality, hashing, a repr, immutability, `as_dict`
(for `dataclasses.asdict`), copying and pickling. Everywhere else a value type is a
`@dataclass(frozen=True)`: one idiom on each side, which scripts/layers.py checks.
"""

from __future__ import annotations


class Value:
    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _set(self, **fields: object) -> None:
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of {type(self).__name__}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), self._values()

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._fields}


class Choice:
    """A named constant of a closed set (what the contract used `enum.Enum` for).

    Members are made once, as class attributes of a subclass, and compared with `is`.
    """

    __slots__ = ("name", "value")
    name: str
    value: str

    def __init__(self, name: str, value: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "value", value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to {name!r} of {type(self).__name__}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value!r}>"

    def __reduce__(self) -> str:
        return f"{type(self).__name__}.{self.name}"
