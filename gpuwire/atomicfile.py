"""Files replaced whole: a reader sees the old content or the new, never half of either.

One way for every file gpuwire owns outright (container records, allocation tokens, the
OCI `config.json`, the config cache, the launchers, containerd's config). On the
container-start path: `os` only.
"""

from __future__ import annotations

import os


def replace(path: str, data: bytes, mode: int) -> None:
    """Write `data` to a temporary file beside `path`, with `mode` whatever the umask, and
    rename it over `path`. The temporary file (`.NAME.PID.tmp`, hidden from readers that
    skip dot files) does not outlive a failure; only a killed process leaves one."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
