"""Files replaced whole: a reader sees the old content or the new, never half of either, and
after a crash or a power cut too.

One way for every file gpuwire owns outright (container records, allocation and claim
tokens, the DRA plugin's checkpoint and health state, CDI specs, the OCI `config.json`, the
config cache, the launchers, containerd's config). On the container-start path: `os` and
`_thread` (built in) only.
"""

from __future__ import annotations

import _thread
import os


def replace(path: str, data: bytes, mode: int, durable: bool = True, entry: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, with `mode` whatever the umask, and
    rename it over `path`. The temporary file (`.NAME.PID.THREAD.tmp`, hidden from readers that
    skip dot files, and the thread's too: two threads of a process may replace one file at
    once) does not outlive a failure; only a killed process leaves one.

    `durable`: the data is on the disk before the rename (fsync of the file) and the rename
    before this returns (fsync of the directory; fsync(2): the file's own fsync "does not
    necessarily ensure that the entry in the directory containing the file has also reached
    disk"), so a crash leaves the old file or the new, never an empty or torn one. Off only
    for what lives no longer than the container it belongs to (its `config.json`, its
    record): a crash that loses the one loses the other.

    `entry` (with `durable`): the directory fsync'd too. Off only where a later durable write
    is the commit point and a crash that loses the rename leaves a file found missing and
    written again (a new DRA claim's spec and token: `deviceplugin.dra.cdi`); the data is
    fsync'd before the rename all the same, so the file is whole or absent, never empty."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{_thread.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if durable and entry:
        sync_directory(directory or ".")


def sync_directory(directory: str) -> None:
    """Make the directory's entries (a rename, a new or removed file) reach the disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
