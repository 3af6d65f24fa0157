"""C declarations for the system calls Python 3.11's `os` lacks, made on `_ctypes`.

The node side calls `openat2` (`gpuwire.resolve`), and the injection the new mount API and
the namespace calls (`runtime_hook.injection.syscalls`), on every GPU container start, and
`import ctypes` costs ~3.5 ms of CPU there (its module body, `types`, and a libffi closure
it makes at import); the C types and function pointers below are the few lines of it
gpuwire uses, declared on `_ctypes`, the C module ctypes itself is built on, as ctypes
declares them (~0.4 ms). Every failure raises `OSError` with the errno and the call that
failed.
"""

from __future__ import annotations

import _ctypes
import os
from _ctypes import CFuncPtr, _SimpleCData, get_errno

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
