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
    return str(segment).replace("~", "~0").replace("/", "~1")


def pointer(base: str, *segments: str | int) -> str:
    return base + "".join("/" + escape(s) for s in segments)


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
    replaces: list[Op] = []
    removes: list[tuple[int, Op]] = []
    appends: list[dict[str, str]] = []
    changes: list[Change] = []
    for name, value in desired.items():
        entries = [e for e in container.env if e.name == name]
        if value is None:
            for e in entries:
                removes.append(
                    (e.index, {"op": "remove", "path": pointer(container.path, "env", e.index)})
                )
                changes.append(Change(container.name, name, e.value, None))
            continue
        if not entries:
            appends.append({"name": name, "value": value})
        for e in entries:
            if e.value != value:
                path = pointer(container.path, "env", e.index)
                replaces.append(
                    {"op": "replace", "path": path, "value": {"name": name, "value": value}}
                )
                changes.append(Change(container.name, name, e.value, value))
    ops = replaces + [op for _, op in sorted(removes, key=lambda r: r[0], reverse=True)]
    if appends and container.has_env:
        ops += [
            {"op": "add", "path": pointer(container.path, "env", "-"), "value": a} for a in appends
        ]
    elif appends:
        ops.append({"op": "add", "path": pointer(container.path, "env"), "value": appends})
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
        if not isinstance(node, Mapping) or node.get(key) is None:
            nested: Any = value
            for inner in reversed(keys[depth + 1 :]):
                nested = {inner: nested}
            return {"op": "add", "path": pointer(base, *keys[: depth + 1]), "value": nested}
        node = node[key]
    return (
        None if node == value else {"op": "replace", "path": pointer(base, *keys), "value": value}
    )
