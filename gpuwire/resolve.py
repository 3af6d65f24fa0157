"""Paths opened as a root filesystem would resolve them, never leaving it: `openat2(2)`.

A root belongs to whoever built it: any component of a path in a container image (or a
driver container's files) may be a symlink to a host directory or a `..` chain.
`RESOLVE_IN_ROOT` resolves such links as they would resolve inside the root, so a lookup
here reaches what the root's own programs would reach, or nothing.
"""

from __future__ import annotations

import os
from _ctypes import Structure, byref, sizeof

from gpuwire.libc import c_char_p, c_int, c_size_t, c_uint64, check, syscall

SYS_OPENAT2 = 437  # the kernel's common syscall table: the same on every architecture

# openat2 resolve flags
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

IN_ROOT = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
# For names just created in a directory the caller holds: no link may intervene.
EXACT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS


class _OpenHow(Structure):
    _fields_ = (("flags", c_uint64), ("mode", c_uint64), ("resolve", c_uint64))


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """open `path` relative to `dirfd` under the `resolve` rules; O_CLOEXEC always added."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = syscall(
        SYS_OPENAT2,
        c_int(dirfd),
        c_char_p(os.fsencode(path)),
        byref(how),
        c_size_t(sizeof(how)),
    )
    return check(fd, "openat2", path)


def open_root(path: str) -> int:
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def lookup(root_fd: int, path: str, flags: int = os.O_PATH) -> int:
    """Open `path` as the root would see it (absolute links stay in the root)."""
    return openat2(root_fd, path.lstrip("/") or ".", flags, IN_ROOT)
