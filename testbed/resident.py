"""A resident gpuwire (runtime_hook.start.resident) on a private socket, for tests and benches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from runtime_hook.setup import launcher
from runtime_hook.start import resident
from testbed.host import Closing, LabError, stop


def command(python: str, socket: str, enter: int | None = None) -> list[str]:
    """The resident as an admin starts it; for another interpreter (the bench's `--python`),
    as the launchers start one: `-IS`, with gpuwire's directory written in. `enter`: the
    process whose namespaces it joins once loaded (a testbed.hostroot.HostRoot's)."""
    options = ["--socket", socket, *(["--enter", str(enter)] if enter is not None else [])]
    if python == sys.executable:
        return [python, "-I", "-m", "runtime_hook.start.resident", *options]
    code = launcher.python_code(resident.token(), "runtime_hook.start.resident")
    return [python, "-IS", "-c", code, "gpuwire-resident", *options]


class Resident(Closing):
    def __init__(
        self,
        socket: str,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        process_group: bool = False,
        enter: int | None = None,
    ) -> None:
        """`process_group`: in a process group of its own, which a test may signal whole;
        `enter`: listening on `socket` in the namespaces of that process (its host's path)."""
        self.socket = socket
        self.process = subprocess.Popen(
            command(python, socket, enter),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            process_group=0 if process_group else None,
        )
        assert self.process.stderr is not None
        ready = self.process.stderr.readline()  # logged once it listens
        if " INFO resident: serving " not in ready:
            stop(self.process)
            raise LabError(f"resident did not start: {ready}{self.process.stderr.read()}")

    def close(self) -> None:
        stop(self.process)
