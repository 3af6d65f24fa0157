"""Directory change notification through Linux inotify (ctypes; the stdlib has no binding).

The plugin must notice within a second when the kubelet deletes its socket or recreates
`kubelet.sock`, and the simulated node's fault file when a fault is appended. inotify wakes
the waiting thread within milliseconds and costs nothing while nothing happens; a stat poll
would trade latency against a busy loop. Callers still re-check the state they care about on
every wake-up (and at least once per timeout), so a missed or overflowed event only delays
them by one timeout, never forever.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Event:
    mask: int
    name: str  # the entry in the watched directory; empty for the directory itself


class Watch:
    """An inotify watch on one directory."""

    def __init__(self, directory: str | os.PathLike[str], mask: int) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise _os_error("inotify_init1", directory)
        self.fd: int = fd
        if _libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            err = _os_error("inotify_add_watch", directory)
            os.close(fd)
            raise err

    def read(self, timeout: float) -> list[Event]:
        """Events that arrive within `timeout` seconds (empty when none did)."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            return []
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events = []
        offset = 0
        while offset < len(data):
            _, mask, _, length = _HEADER.unpack_from(data, offset)
            start = offset + _HEADER.size
            name = data[start : start + length].rstrip(b"\0")
            events.append(Event(mask, os.fsdecode(name)))
            offset = start + length
        return events

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _os_error(call: str, path: str | os.PathLike[str]) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{call}: {os.strerror(errno)}", str(path))
