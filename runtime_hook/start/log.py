"""One line per decision, where the node's `log` setting says: a file, or stderr.

A runtime hook's stderr is shown only when it fails, so refusals and grants go to a file
(default /var/log/gpuwire.log) that an admin can read or ship. A log that cannot be written
never fails a container start: the line goes to stderr instead.
"""

from __future__ import annotations

import os
import sys
import time


def line(program: str, container: str, message: str) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"{stamp} {program} {container}: {message}\n"


def write(destination: str, program: str, container: str, message: str) -> None:
    text = line(program, container, message)
    if destination != "stderr":
        try:
            fd = os.open(destination, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
            return
        except OSError as exc:
            text = f"{text.rstrip()} (cannot write {destination}: {exc.strerror})\n"
    sys.stderr.write(text)
