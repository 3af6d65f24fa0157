"""Work done in a forked child, because it changes the process's namespaces (setns,
unshare) and the caller must stay where it is. The child's error comes back as the
parent's exception."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class ChildError(RuntimeError):
    """The work failed in the child; the message is the child's error."""


def run(work: Callable[[], None]) -> None:
    """Run `work` in a forked child and wait for it; raise ChildError if it failed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - ends in _exit
        os.close(read_end)
        status = 0
        try:
            work()
        except BaseException as exc:
            os.write(write_end, str(exc).encode())
            status = 1
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        error = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise ChildError(error or f"child failed with status {status}")
