"""JSON Patch (RFC 6902) operations that touch only what changes.

Kubernetes webhook good practice: add rather than replace, and never overwrite a keyed list
such as `env` (another webhook, or the user, owns the other entries). Paths escape `~` and
`/` (`nvidia.com/gpu` → `nvidia.com~1gpu`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.pod import Container

Op = dict[str, Any]


def escape(segment: str | int) -> str:
    text = str(segment)
    return text.replace("~", "~0").replace("/", "~1") if "~" in text or "/" in text else text


def pointer(base: str, *segments: str | int) -> str:
    return "/".join((base, *map(escape, segments)))


@dataclass(frozen=True)
class Change:
    """An env entry the patch replaced or removed: the user wrote something else."""

    container: str
    name: str
    old: str | None  # None: it came from valueFrom
    new: str | None  # None: removed


def env_ops(
    container: Container, desired: Mapping[str, str | None]
) -> tuple[list[Op], list[Change]]:
    """Ops making `container`'s env hold `desired` (None: absent), and what they overwrote.

    Entries that already match are left alone, so a second run yields nothing. Replacements
    and removals come first, removals from the highest index down, so every index an op
    names is still valid when it runs; new entries are appended last.
    """
    env = container.path + "/env"  # nothing in it to escape
    replaces: list[Op] = []
    removes: list[Op] = []
    appends: list[dict[str, str]] = []
    changes: list[Change] = []
    for name, value in desired.items():
        positions = container.named.get(name, ())
        if value is None:
            for i in positions:
                removes.append({"op": "remove", "path": f"{env}/{i}"})
                changes.append(Change(container.name, name, container.at(i), None))
            continue
        if not positions:
            appends.append({"name": name, "value": value})
        for i in positions:
            old = container.at(i)
            if old != value:
                entry = {"name": name, "value": value}
                replaces.append({"op": "replace", "path": f"{env}/{i}", "value": entry})
                changes.append(Change(container.name, name, old, value))
    removes.sort(key=lambda op: int(op["path"].rsplit("/", 1)[1]), reverse=True)
    ops = replaces + removes
    if appends and container.has_env:
        ops += [{"op": "add", "path": env + "/-", "value": a} for a in appends]
    elif appends:
        ops.append({"op": "add", "path": env, "value": appends})
    return ops, changes


def set_path(
    document: Mapping[str, Any], base: str, keys: tuple[str, ...], value: Any
) -> Op | None:
    """The op that makes `keys` hold `value`: one `add` of the first missing level, a
    `replace` of a different value, or None when it already holds `value`.

    `set_path(container, "/spec/containers/0", ("resources", "limits", "nvidia.com/gpu"), "2")`
    adds only as much of the nesting as is missing.
    """
    node: Any = document
    for depth, key in enumerate(keys):
        if not isinstance(node, dict) or node.get(key) is None:  # decoded JSON: dicts
            nested: Any = value
            for inner in reversed(keys[depth + 1 :]):
                nested = {inner: nested}
            return {"op": "add", "path": pointer(base, *keys[: depth + 1]), "value": nested}
        node = node[key]
    return (
        None if node == value else {"op": "replace", "path": pointer(base, *keys), "value": value}
    )
