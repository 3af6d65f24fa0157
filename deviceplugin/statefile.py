"""The node processes' state on disk: one versioned JSON file each (the DRA plugin's prepared
claims, the node's device health), written whole and crash-safe (`gpuwire.atomicfile`),
read back only when it is whole and what was written.

Each file carries the SHA-256 of its body: a file cut short, or changed under the process (a
disk error, a hand edit), is detected and reported as a StateError naming the file, never
taken for the state. What a caller then does is its own: rebuild from what the kubelet and
the API server hold, having set the bad file aside (`set_aside`) for a person to look at.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from gpuwire import atomicfile

log = logging.getLogger(__name__)

T = TypeVar("T")
DIGEST = "sha256"


class StateError(RuntimeError):
    """A state file that cannot be read, or is not what was written; the message names it
    and why."""


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read(path: Path, version: int, what: str, lost: str, decode: Callable[[Any], T]) -> T | None:
    """`decode` of the JSON file at `path` (written at `version`); None where there is none.
    A file that cannot be read, is not whole, or does not decode is a StateError naming `what`
    it is, its path, why, and what starting without it would lose (`lost`). A file of an
    earlier gpuwire has no digest, and is taken as it is."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{what} {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        digest = raw.pop(DIGEST, None)
        if digest is not None and digest != _digest(raw):
            raise ValueError("its content is not what was written (digest mismatch)")
        if raw.get("version") != version:
            raise ValueError(f"version {raw.get('version')!r}, expected {version}")
        return decode(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StateError(f"{what} {path} is unreadable ({exc}): {lost}") from None


def write(directory: str | os.PathLike[str], name: str, body: Mapping[str, Any]) -> None:
    """`body` as `<directory>/<name>`, whole, crash-safe, root's alone, with its digest."""
    os.makedirs(directory, mode=0o750, exist_ok=True)
    # not indented: that takes json's pure-Python encoder, several times slower
    text = json.dumps({**body, DIGEST: _digest(body)})
    atomicfile.replace(os.path.join(directory, name), text.encode(), 0o600)


def set_aside(path: Path) -> Path:
    """Move a bad state file out of the way (`<name>.bad-<unix time>`), kept for a person to
    look at; the caller then rebuilds what it held."""
    kept = path.with_name(f"{path.name}.bad-{int(time.time())}")
    os.replace(path, kept)
    log.error("state file %s set aside as %s", path, kept.name)
    return kept
