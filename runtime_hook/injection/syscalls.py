"""The Linux system calls Python 3.11's `os` lacks, called through `_ctypes`.

Injection into a created container needs fd-relative path resolution (`openat2`), mounts
made from file descriptors (`open_tree`, `move_mount`, `mount_setattr`) and namespace calls
(`setns`, `unshare`). The new-mount-API syscall numbers are the same on every architecture
(the kernel's common table), so nothing here is x86-specific. Every failure raises `OSError`
with the errno and the call that failed.

This runs on every GPU container start, and `import ctypes` costs ~3.5 ms of CPU there
(its module body, `types`, and a libffi closure it makes at import); the C types and
function pointers below are the few lines of it gpuwire uses, declared on `_ctypes`, the C
module ctypes itself is built on, as ctypes declares them (~0.4 ms).
"""

from __future__ import annotations

import _ctypes
import os
from _ctypes import CFuncPtr, Structure, _SimpleCData, byref, get_errno, sizeof

TYPE_CHECKING = False
if TYPE_CHECKING:  # generic in the stubs only
    _Int = _SimpleCData[int]
    _Bytes = _SimpleCData[bytes | None]
else:
    _Int = _Bytes = _SimpleCData


class c_int(_Int):
    _type_ = "i"


class c_uint(_Int):
    _type_ = "I"


class c_long(_Int):
    _type_ = "l"


class c_ulong(_Int):
    _type_ = "L"


class c_uint64(_Int):
    _type_ = "Q"


class c_char_p(_Bytes):
    _type_ = "z"


c_size_t = c_ulong  # Linux's LP64 and ILP32 ABIs alike


class _Function(CFuncPtr):
    """A libc function returning int, with errno kept for `get_errno` (CDLL's use_errno)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = c_int


# dlopen(NULL): this program and the libraries it loaded, as ctypes.CDLL(None).
_LIBC = _ctypes.dlopen(None)  # type: ignore[arg-type] # the stub wants a path


def _function(name: str, restype: type[_Int] = c_int) -> _Function:
    function = _Function(_ctypes.dlsym(_LIBC, name))
    function.restype = restype
    return function


_syscall = _function("syscall", c_long)
_setns = _function("setns")
_unshare = _function("unshare")
_mount = _function("mount")
_umount2 = _function("umount2")
_prctl = _function("prctl")

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


class _OpenHow(Structure):
    _fields_ = (("flags", c_uint64), ("mode", c_uint64), ("resolve", c_uint64))


class _MountAttr(Structure):
    _fields_ = (
        ("attr_set", c_uint64),
        ("attr_clr", c_uint64),
        ("propagation", c_uint64),
        ("userns_fd", c_uint64),
    )


def _check(result: int, call: str, path: str | None = None) -> int:
    if result < 0:
        err = get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}", path)
    return result


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """open `path` relative to `dirfd` under the `resolve` rules; O_CLOEXEC always added."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _syscall(
        SYS_OPENAT2,
        c_int(dirfd),
        c_char_p(os.fsencode(path)),
        byref(how),
        c_size_t(sizeof(how)),
    )
    return _check(fd, "openat2", path)


def open_tree_clone(fd: int) -> int:
    """A detached bind mount of the file or directory `fd` refers to."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    result = _syscall(SYS_OPEN_TREE, c_int(fd), c_char_p(b""), c_uint(flags))
    return _check(result, "open_tree")


def mount_setattr(fd: int, attr_set: int) -> None:
    """Set mount attributes (read-only, nosuid, ...) on the mount `fd` refers to."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    result = _syscall(
        SYS_MOUNT_SETATTR,
        c_int(fd),
        c_char_p(b""),
        c_uint(AT_EMPTY_PATH),
        byref(attr),
        c_size_t(sizeof(attr)),
    )
    _check(result, "mount_setattr")


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount `from_fd` on top of the file or directory `to_fd`."""
    result = _syscall(
        SYS_MOVE_MOUNT,
        c_int(from_fd),
        c_char_p(b""),
        c_int(to_fd),
        c_char_p(b""),
        c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    _check(result, "move_mount")


def setns(fd: int, nstype: int) -> None:
    _check(_setns(c_int(fd), c_int(nstype)), "setns")


def unshare(flags: int) -> None:
    _check(_unshare(c_int(flags)), "unshare")


def make_private(path: str) -> None:
    """Stop mount events from propagating out of (or into) this mount namespace."""
    result = _mount(None, os.fsencode(path), None, c_ulong(MS_REC | MS_PRIVATE), None)
    _check(result, "mount(MS_PRIVATE)", path)


def umount(path: str, flags: int = MNT_DETACH) -> None:
    _check(_umount2(os.fsencode(path), c_int(flags)), "umount2", path)


def prctl(option: int, arg: int) -> None:
    result = _prctl(
        c_int(option),
        c_ulong(arg),
        c_ulong(0),
        c_ulong(0),
        c_ulong(0),
    )
    _check(result, "prctl")
