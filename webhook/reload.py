"""Values loaded from files and reloaded when the files change: policy, grant keys, TLS.

Kubernetes updates a mounted ConfigMap or Secret by swapping a `..data` symlink, so a file's
path stays the same while what it resolves to changes. The stamp is therefore taken through
symlinks: device, inode, size and mtime of every file (and, for a directory, of every entry).
The server checks stamps on a timer, never per admission. A reload that fails (a half-written
file, a bad policy) keeps the previous value and is logged and counted; the next change is
tried again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Stamp = tuple[tuple[str, tuple[int, int, int, int] | None], ...]


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def stamp(paths: Sequence[Path]) -> Stamp:
    """What changes when any of `paths`, or any entry of a directory among them, changes."""
    entries: list[tuple[str, tuple[int, int, int, int] | None]] = []
    for path in paths:
        entries.append((str(path), _stat(path)))
        if path.is_dir():
            for name in sorted(os.listdir(path)):
                entries.append((str(path / name), _stat(path / name)))
    return tuple(entries)


class Reloadable(Protocol):
    failures: int

    def refresh(self) -> bool: ...


class Watched(Generic[T]):
    """The latest good value `load` made from `paths`."""

    def __init__(self, name: str, paths: Sequence[Path], load: Callable[[], T]) -> None:
        self.name = name
        self.paths = list(paths)
        self._load = load
        self._stamp = stamp(self.paths)
        self.value: T = load()  # at start-up a bad file is an error, not a fallback
        self.reloads = 0
        self.failures = 0

    def refresh(self) -> bool:
        """Reload if the files changed; True when a new value took effect."""
        current = stamp(self.paths)
        if current == self._stamp:
            return False
        self._stamp = current
        try:
            self.value = self._load()
        except (OSError, ValueError) as exc:
            self.failures += 1
            log.error("%s changed but did not load, keeping the previous one: %s", self.name, exc)
            return False
        self.reloads += 1
        log.info("%s reloaded", self.name)
        return True
