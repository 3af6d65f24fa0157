"""The admission webhook as a real process over real TLS, for tests, benches and the demo.

`serving([...])` starts `gpuwire webhook serve --port 0 ...`, reads the port it bound from its
log (no guessed free port to race for), and stops it by its process id on exit.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from testbed.host import stop

_RUNNING = re.compile(r"Uvicorn running on (https://[^ ]+)")


@dataclass
class WebhookProcess:
    process: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return "".join(self.log)


WEBHOOK = (sys.executable, "-m", "gpuwire.cli", "webhook", "serve", "--host", "127.0.0.1")


@contextmanager
def serving(
    args: Sequence[str], timeout: float = 30.0, command: Sequence[str] = WEBHOOK
) -> Iterator[WebhookProcess]:
    """`gpuwire webhook serve` on 127.0.0.1 with `args` (or another uvicorn `command`, such
    as a benchmark's baseline server), until the block ends."""
    process = subprocess.Popen(
        [*command, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = WebhookProcess(process)
    started = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            served.log.append(line)
            found = _RUNNING.search(line)
            if found:
                served.url = found.group(1)
                started.set()
        started.set()  # exited: wake the waiter

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not started.wait(timeout) or not served.url:
            raise RuntimeError(f"webhook did not start:\n{served.output()}")
        yield served
    finally:
        stop(process)
        reader.join(timeout=5)
