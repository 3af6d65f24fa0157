"""A resident gpuwire (runtime_hook.start.resident) on a private socket, for tests and benches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from runtime_hook.setup import launcher
from runtime_hook.start import resident
from testbed.host import Closing, LabError, stop


def command(python: str, socket: str) -> list[str]:
    """The resident as an admin starts it; for another interpreter (the bench's `--python`),
    as the launchers start one: `-IS`, with gpuwire's directory written in."""
    if python == sys.executable:
        return [python, "-I", "-m", "runtime_hook.start.resident", "--socket", socket]
    code = launcher.python_code(resident.token(), "runtime_hook.start.resident")
    return [python, "-IS", "-c", code, "gpuwire-resident", "--socket", socket]


class Resident(Closing):
    def __init__(
        self,
        socket: str,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        process_group: bool = False,
    ) -> None:
        """`process_group`: in a process group of its own, which a test may signal whole."""
        self.socket = socket
        self.process = subprocess.Popen(
            command(python, socket),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            process_group=0 if process_group else None,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()  # printed once it listens
        if not ready.startswith("gpuwire resident: serving"):
            stop(self.process)
            raise LabError(f"resident did not start: {self.process.stderr.read()}")  # type: ignore[union-attr]

    def close(self) -> None:
        stop(self.process)
