"""The mount and namespace system calls the node side needs, which Python 3.11's `os` lacks:
the injection's (`runtime_hook.injection`), and the node agent's for its MPS daemons (each in
a mount namespace whose `/dev/shm` is its GPU's, `deviceplugin.agent.mps`).

Mounts made from file descriptors (`open_tree`, `move_mount`, `mount_setattr`) and namespace
calls (`setns`, `unshare`), declared on `_ctypes` with `gpuwire.resolve`'s C types (which
holds `openat2`). The new-mount-API syscall numbers are the same on every
architecture (the kernel's common table), so nothing here is x86-specific. Every failure
raises `OSError` with the errno and the call that failed.
"""

from __future__ import annotations

import os
from _ctypes import Structure, byref, sizeof

from gpuwire.resolve import (
    c_char_p,
    c_int,
    c_size_t,
    c_uint,
    c_uint64,
    c_ulong,
    check,
    declare,
    syscall,
)

_setns = declare("setns")
_unshare = declare("unshare")
_mount = declare("mount")
_umount2 = declare("umount2")
_prctl = declare("prctl")

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442

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
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


class _MountAttr(Structure):
    _fields_ = (
        ("attr_set", c_uint64),
        ("attr_clr", c_uint64),
        ("propagation", c_uint64),
        ("userns_fd", c_uint64),
    )


def open_tree_clone(fd: int) -> int:
    """A detached bind mount of the file or directory `fd` refers to."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    result = syscall(SYS_OPEN_TREE, c_int(fd), c_char_p(b""), c_uint(flags))
    return check(result, "open_tree")


def mount_setattr(fd: int, attr_set: int, *, recursive: bool = False) -> None:
    """Set mount attributes (read-only, nosuid, ...) on the mount `fd` refers to, and with
    `recursive` on every mount beneath it."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    result = syscall(
        SYS_MOUNT_SETATTR,
        c_int(fd),
        c_char_p(b""),
        c_uint(AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)),
        byref(attr),
        c_size_t(sizeof(attr)),
    )
    check(result, "mount_setattr")


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount `from_fd` on top of the file or directory `to_fd`."""
    result = syscall(
        SYS_MOVE_MOUNT,
        c_int(from_fd),
        c_char_p(b""),
        c_int(to_fd),
        c_char_p(b""),
        c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    check(result, "move_mount")


def setns(fd: int, nstype: int) -> None:
    check(_setns(c_int(fd), c_int(nstype)), "setns")


def unshare(flags: int) -> None:
    check(_unshare(c_int(flags)), "unshare")


def make_private(path: str) -> None:
    """Stop mount events from propagating out of (or into) this mount namespace."""
    result = _mount(None, os.fsencode(path), None, c_ulong(MS_REC | MS_PRIVATE), None)
    check(result, "mount(MS_PRIVATE)", path)


def bind(source: str, target: str) -> None:
    """Bind `source` (and what is mounted beneath it) onto `target`; onto itself, it makes
    `source` a mount tree of its own, whose attributes change nothing around it."""
    result = _mount(os.fsencode(source), os.fsencode(target), None, c_ulong(MS_BIND | MS_REC), None)
    check(result, "mount(MS_BIND)", target)


def umount(path: str, flags: int = MNT_DETACH) -> None:
    check(_umount2(os.fsencode(path), c_int(flags)), "umount2", path)


def prctl(option: int, arg: int) -> None:
    result = _prctl(
        c_int(option),
        c_ulong(arg),
        c_ulong(0),
        c_ulong(0),
        c_ulong(0),
    )
    check(result, "prctl")
