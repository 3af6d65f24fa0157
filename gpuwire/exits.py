"""Exit codes of every `gpuwire` command, and the error a command raises to use one.

A command that cannot do what it was asked says, in one line on stderr, what was wrong
(the flag, path or value), and what to do, and exits with the code of that kind of
failure, so a script can tell them apart (README.md, "Exit codes"):

- 0: done;
- 1: done, and the answer is no: a pod denied (`mutate`), a grant that does not hold
  (`grant verify`), a check that failed (`certs ensure`), a server that stopped on an error;
- 2: a flag or value the command does not take (argparse's usage error);
- 3: a file it reads (named or its default), the driver or the simulated node: missing,
  unreadable, or not what it should be;
- 4: no cluster: no kubeconfig or service account to talk with, or one that cannot be used;
- 5: the cluster: its API server unreachable, or refusing (RBAC, a missing object);
- 70: a bug: gpuwire failed where it should not (the line says how to get the traceback).

Any exception with an integer `exit_code` attribute is such an error (`CommandError`, and
`kubeclient`'s, 4 and 5); `gpuwire.cli` prints them.
"""

from __future__ import annotations

OK = 0
NO = 1
USAGE = 2
INPUT = 3
NO_CLUSTER = 4
CLUSTER = 5
INTERNAL = 70
DEBUG_ENV = "GPUWIRE_DEBUG"  # set: a bug's traceback is shown


class CommandError(Exception):
    """What a command tells its user before it exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def code_of(exc: BaseException) -> int | None:
    """The exit code an error carries, None for any other exception."""
    code = getattr(exc, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None
