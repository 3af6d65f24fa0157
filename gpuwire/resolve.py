"""Paths opened as a root filesystem would resolve them, never leaving it: `openat2(2)`.

A root belongs to whoever built it: any component of a path in a container image (or a
driver container's files) may be a symlink to a host directory or a `..` chain.
`RESOLVE_IN_ROOT` resolves such links as they would resolve inside the root, so a lookup
here reaches what the root's own programs would reach, or nothing.

Python 3.11's `os` has no `openat2`, and `import ctypes` costs ~3.5 ms of CPU on every GPU
container start (its module body, `types`, and a libffi closure it makes at import); the C
types and function pointers below are the few lines of it gpuwire uses, declared on
`_ctypes`, the C module ctypes itself is built on, as ctypes declares them (~0.4 ms). The
mount and namespace calls (`gpuwire.syscalls`: the injection's, the node agent's) are declared with
them too. Every failure raises `OSError` with the errno and the call that failed.
"""

from __future__ import annotations

import _ctypes
import os
import stat
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


def declare(name: str, restype: type[_Int] = c_int) -> _Function:
    """The libc function `name`, returning `restype`."""
    function = _Function(_ctypes.dlsym(_LIBC, name))
    function.restype = restype
    return function


syscall = declare("syscall", c_long)


def check(result: int, call: str, path: str | None = None) -> int:
    """`result`, or OSError with the errno where the call failed (a negative result)."""
    if result < 0:
        err = get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}", path)
    return result


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


KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class NotAFile(OSError):
    """A path that is something other than a regular file; the message says what."""


def open_file(root_fd: int, path: str) -> int:
    """`path` in the root, open read-only, where it is a regular file (following the root's
    links as the root would); FileNotFoundError where nothing is there, NotAFile where it is
    anything else. The lookup is `O_PATH`, which runs no open of the file's own (no driver's,
    no FIFO's); its type is read from that descriptor, and only a regular file is then opened
    through it (`/proc/self/fd`): the same inode, whatever the root holds by then."""
    fd = lookup(root_fd, path)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in KINDS if test(mode)), "something else")
            raise NotAFile(f"{path} in the container is {kind}, not a regular file")
        try:
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # not "nothing there"
            raise OSError(f"{path} in the container: reopening it: {exc.strerror}") from None
    finally:
        os.close(fd)
