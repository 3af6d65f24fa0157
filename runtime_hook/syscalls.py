"""The Linux system calls Python 3.11's `os` lacks, through ctypes.

Injection into a created container needs fd-relative path resolution (`openat2`), mounts
made from file descriptors (`open_tree`, `move_mount`, `mount_setattr`) and namespace calls
(`setns`, `unshare`). The new-mount-API syscall numbers are the same on every architecture
(the kernel's common table), so nothing here is x86-specific. Every failure raises `OSError`
with the errno and the call that failed. Imported only where a container is actually
changed: ctypes costs milliseconds at start-up.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_OPENAT2 = 437
SYS_MOUNT_SETATTR = 442

# openat2 resolve flags
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 0x1
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, call: str, path: str | None = None) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}", path)
    return result


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """open `path` relative to `dirfd` under the `resolve` rules; O_CLOEXEC always added."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(
        SYS_OPENAT2,
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    return _check(fd, "openat2", path)


def open_tree_clone(fd: int) -> int:
    """A detached bind mount of the file or directory `fd` refers to."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    result = _libc.syscall(
        SYS_OPEN_TREE, ctypes.c_int(fd), ctypes.c_char_p(b""), ctypes.c_uint(flags)
    )
    return _check(result, "open_tree")


def mount_setattr(fd: int, attr_set: int) -> None:
    """Set mount attributes (read-only, nosuid, ...) on the mount `fd` refers to."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    result = _libc.syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(fd),
        ctypes.c_char_p(b""),
        ctypes.c_uint(AT_EMPTY_PATH),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(result, "mount_setattr")


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount `from_fd` on top of the file or directory `to_fd`."""
    result = _libc.syscall(
        SYS_MOVE_MOUNT,
        ctypes.c_int(from_fd),
        ctypes.c_char_p(b""),
        ctypes.c_int(to_fd),
        ctypes.c_char_p(b""),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    _check(result, "move_mount")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def make_private(path: str) -> None:
    """Stop mount events from propagating out of (or into) this mount namespace."""
    result = _libc.mount(None, os.fsencode(path), None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None)
    _check(result, "mount(MS_PRIVATE)", path)


def umount(path: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(os.fsencode(path), ctypes.c_int(flags)), "umount2", path)


def prctl(option: int, arg: int) -> None:
    result = _libc.prctl(
        ctypes.c_int(option),
        ctypes.c_ulong(arg),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    _check(result, "prctl")
