"""`python -m deviceplugin.agent.shmns SHM PROGRAM [ARG]...`: PROGRAM run in a mount namespace
of its own whose `/dev/shm` is SHM: how the node agent starts each GPU's MPS control daemon
(`mps.py`), so that its servers and clients share that directory and no other GPU's.

A process of its own rather than a `preexec_fn`: the agent runs threads (gRPC's among them),
and CPython runs every library's fork handlers in a child it forks for a `preexec_fn`, where
gRPC's can deadlock before the exec (grpc/grpc#22624): the agent's Popen then waits forever
and the GPU never gets its daemon. Here the unshare happens single-threaded, then PROGRAM is
exec'd with the environment this was given, under the same process id.
"""

from __future__ import annotations

import os
import sys

from gpuwire import mps, syscalls


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: python -m deviceplugin.agent.shmns SHM PROGRAM [ARG]...\n")
        return 2
    shm, program = argv[0], argv[1:]
    try:
        syscalls.unshare(syscalls.CLONE_NEWNS)
        syscalls.make_private("/")
        syscalls.bind(shm, mps.CONTAINER_SHM)
        os.execv(program[0], program)  # noqa: S606 - the program as given, no shell
    except OSError as exc:
        sys.stderr.write(f"{program[0]} not started with {shm} as its /dev/shm: {exc}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
