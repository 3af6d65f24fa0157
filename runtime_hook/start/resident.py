"""The resident gpuwire: the node side imported once, forked for each GPU container start.

Every GPU start through a Python hook or shim pays ~7 ms for the interpreter's start and
~4.5 ms for the imports before gpuwire does anything (docs/runtime.md, "Cost"). The
resident pays them once. The launchers hand a call to `gpuwire-call` (runtime_hook/setup/call.c,
a static C program that starts in well under a millisecond), which sends its arguments,
environment, umask, stdin, stdout, stderr and working directory over a unix socket. The
resident forks; the child greets the caller, takes on all of that and runs exactly what
the Python launcher would run (`hook.main`, or the shim's `decide`), then answers the exit
status, or the runtime the caller is to exec (a runtime must stay the child of whoever
called it, so `gpuwire-call` execs it, not the resident). Nothing here decides anything:
it only saves the start.

It serves only the build the launchers were written for (their token is the directory
gpuwire is imported from, which names the version), only callers in its own mount, cgroup
and PID namespaces, and only root (the socket is root's, and the peer's credentials, as
the kernel gives them, are checked); it tells a caller it declines why. For anything else,
where no resident listens, or where it does not greet within 2 s, `gpuwire-call` runs the
Python launcher as before: the resident makes starts faster, never different. Where the
launchers have no Python to run (the image's install: the host has none), it is what
serves every GPU start, and `gpuwire-call` waits for it (runtime_hook/setup/call.c).

    python -I -m runtime_hook.start.resident [--socket PATH] [--enter PID]

Runs as root in the host's namespaces. The gpuwire-node DaemonSet (deploy/base/node.yaml)
starts it in its container, from the image's Python (hostPID, privileged), with `--enter 1`:
it imports all a call may import there (`preload`), then joins the mount, cgroup, IPC, UTS
and network namespaces of the host's init (`enter`: setns, which a mount namespace allows a
single-threaded process only) and imports nothing more, so every call is served with the
host's paths from what is in memory, and nothing of the host's is ever imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import select
import signal
import socket
import struct
import sys

import runtime_hook
from gpuwire import logs, syscalls
from runtime_hook.start import MODULES, STDLIB, hook, shim

DEFAULT_SOCKET = "/run/gpuwire/resident.sock"
KINDS = ("hook", "runtime")
REQUEST_MAX = 1 << 20  # what gpuwire-call sends at most (call.c)
PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid
NAMESPACES = ("mnt", "cgroup", "pid")  # what the hook and the shim resolve paths and pids in
# What `--enter` joins (pid: the DaemonSet's hostPID), setns's flag for each.
ENTERED = {
    "cgroup": syscalls.CLONE_NEWCGROUP,
    "ipc": syscalls.CLONE_NEWIPC,
    "uts": syscalls.CLONE_NEWUTS,
    "net": syscalls.CLONE_NEWNET,
    "mnt": syscalls.CLONE_NEWNS,
}
log = logging.getLogger(__name__)


def token() -> str:
    """What the launchers name to be served by this build: where gpuwire is imported from
    (links resolved: a resident started through `current` serves the version it reached)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(runtime_hook.__file__)))


def preload() -> None:
    """Import what a call may import (the start path's `STDLIB` and `MODULES`), so that
    children share it instead of each importing it anew."""
    for name in (*STDLIB, *MODULES):
        importlib.import_module(name)


def enter(pid: int) -> None:
    """Join `pid`'s namespaces of ENTERED, from its root directory on; then nothing more is
    imported (what a call may import is loaded; the files this process was loaded from are
    not there, and it imports nothing of the host's)."""
    fds = [(os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC), flag)
           for kind, flag in ENTERED.items()]  # fmt: skip
    try:
        for fd, flag in fds:
            syscalls.setns(fd, flag)
    finally:
        for fd, _ in fds:
            os.close(fd)
    os.chdir("/")
    sys.path.clear()
    sys.path_importer_cache.clear()


class Request:
    """One call, as gpuwire-call sent it."""

    __slots__ = ("argv", "env", "fds", "kind", "token", "umask")

    def __init__(self, data: bytes, fds: list[int]) -> None:
        fields = data.split(b"\0")
        if len(fds) != 4 or len(fields) < 5 or fields.pop() != b"":
            raise ValueError("malformed request")
        self.fds = fds
        self.token = os.fsdecode(fields[0])
        self.kind = os.fsdecode(fields[1])
        self.umask = int(fields[2], 8)
        count = int(fields[3])
        if count < 1 or len(fields) < 4 + count:
            raise ValueError("malformed request")
        self.argv = [os.fsdecode(a) for a in fields[4 : 4 + count]]
        self.env = {}
        for entry in fields[4 + count :]:
            name, eq, value = entry.partition(b"=")
            if eq and name:  # as Python's own start skips what it cannot hold
                self.env[os.fsdecode(name)] = os.fsdecode(value)


def namespaces(pid: str) -> list[tuple[int, int]] | None:
    """Which of NAMESPACES a process is in; None where its /proc entry cannot be read."""
    try:
        return [
            (info.st_dev, info.st_ino)
            for info in (os.stat(f"/proc/{pid}/ns/{kind}") for kind in NAMESPACES)
        ]
    except OSError:
        return None


class Served:
    """Whom this resident serves: launchers of its build (`build`, the token of the gpuwire
    it imported), root callers in its namespaces."""

    __slots__ = ("namespaces", "token")

    def __init__(self, build: str | None = None) -> None:
        self.token = build or token()
        self.namespaces = namespaces("self")

    def refusal(self, request: Request, pid: int, uid: int) -> str | None:
        """Why the call is not served; None: it is. The caller's pid is 0 where it is not in
        our PID namespace."""
        if uid != 0:
            return f"the caller runs as uid {uid}, not root"
        if request.kind not in KINDS:
            return f"no such kind of call: {request.kind!r}"
        if request.token != self.token:
            return f"it serves the launchers of {self.token}, not of {request.token}"
        if pid <= 0 or namespaces(str(pid)) != self.namespaces:
            return "the caller is in other namespaces than the resident's"
        return None


def take_on(request: Request) -> None:
    """Become the caller: its stdio, working directory, umask, arguments and environment.
    `sys.std*` are over descriptors 0-2 already (`own_stdio`), so dup2 makes them the
    caller's; the environment starts empty (`serve` cleared the resident's own)."""
    for target, fd in enumerate(request.fds[:3]):
        os.dup2(fd, target)
    os.fchdir(request.fds[3])
    for fd in request.fds:
        os.close(fd)
    os.umask(request.umask)
    os.environ.update(request.env)
    sys.argv = request.argv


def own_stdio() -> None:
    """Streams over descriptors 0-2 with nothing buffered, made once for every child
    (three streams made per call took ~0.25 ms and ~100 copied pages of its start)."""
    for fd in (0, 1, 2):  # a caller's descriptors must not arrive as 0-2 (take_on dup2s)
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - over whatever fd 0 is, for good
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115


def run(request: Request) -> bytes:
    """Run the call as the Python launcher would; the answer for gpuwire-call."""
    args = request.argv[1:]
    if request.kind == "hook":
        return b"x%d" % hook.main(args)
    status, runtime = shim.decide(args)
    return b"e" + os.fsencode(runtime) if runtime is not None else b"x%d" % status


def call(request: Request) -> bytes:
    """`run`; where it raises, the caller's stderr gets one line saying so (the hook and the
    shim say what they refuse themselves, so what escapes them is a bug: its traceback is
    logged at debug level) and the status a Python launcher ends with then."""
    try:
        return run(request)
    except BaseException as exc:
        log.error(
            "%s call failed: %s: %s (a bug; --log-level debug shows where)",
            request.kind,
            type(exc).__name__,
            exc,
        )
        log.debug("where the %s call failed", request.kind, exc_info=True)
        return b"x1"


def answer(conn: socket.socket, served: Served) -> int:
    """In the forked child: greet, read the request, serve it or decline it, answer."""
    pid, uid, _ = PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size))
    try:
        conn.send(b"r")  # gpuwire-call sends nothing to a resident that has not greeted it
    except OSError:  # it gave up waiting and ran the fallback
        return 0
    data, fds, _, _ = socket.recv_fds(conn, REQUEST_MAX, 4)
    if not data:
        return 0
    try:
        request = Request(data, fds)
        refusal = served.refusal(request, pid, uid)
    except ValueError:
        refusal = "a malformed request"
    if refusal is not None:
        for fd in fds:  # the caller's stdio: a runtime reads a hook's pipes until all close
            os.close(fd)
        conn.send(b"f" + os.fsencode(refusal))
        return 0
    take_on(request)
    reply = call(request)
    sys.stdout.flush()
    sys.stderr.flush()
    let_go()
    conn.send(reply)
    return 0


def let_go() -> None:
    """Give the caller's stdio back before answering: a runtime reads a hook's output until
    every copy of its pipes is closed, which would otherwise wait for this child's exit
    (tearing down a forked copy of the resident, ~0.5 ms) after gpuwire-call has ended."""
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.close(null)


def listen(path: str) -> socket.socket:
    """A root-only socket at `path`, replacing a stale one from an earlier resident."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    staging = f"{path}.{os.getpid()}"
    old = os.umask(0o177)
    try:
        listener.bind(staging)  # 0600 from the start: never connectable by another user
    finally:
        os.umask(old)
    os.rename(staging, path)
    listener.listen(64)
    return listener


# What stops a resident (systemd's KillMode=control-group sends SIGTERM to every process of
# the unit, a shell's ^C SIGINT to its process group): the children get it too, and a child
# that has taken a call finishes it (its caller would fail the start otherwise), so they
# ignore these from their fork on; only the parent stops, and the child waiting for a call
# learns it from `stopping` (end of file), never by a signal that could land just after
# accept.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def serve(listener: socket.socket, served: Served) -> None:
    """Keep one child forked ahead, waiting for a call: a call never waits for the fork."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    os.environ.clear()  # a call's environment is the caller's alone: none of it is ours
    sys.stdout.flush()  # nothing of ours may be left in a buffer a child writes to
    sys.stderr.flush()
    stopping, serving = os.pipe()  # end of file on `stopping`: this resident has stopped
    gc.collect()
    gc.freeze()  # what is loaded now stays shared with every child
    while True:
        accepted, tell = os.pipe()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)  # none lands before the child's
        waiting = os.fork()  # handlers are set: pending ones are dropped by SIG_IGN
        if waiting == 0:
            status = 1
            try:
                for sig in STOPPING:
                    signal.signal(sig, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the call waits for its own
                os.close(accepted)
                os.close(serving)
                gc.disable()
                conn = next_call(listener, stopping)
                listener.close()
                os.close(tell)  # the parent forks the next one now
                status = 0 if conn is None else answer(conn, served)
            finally:
                os._exit(status)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
        os.close(tell)
        try:
            os.read(accepted, 1)  # end of file: the child has a call (or has died)
        except BaseException:  # stopping: the child forked ahead takes no call and goes too
            os.close(serving)
            with contextlib.suppress(ChildProcessError):  # reaped already (SIGCHLD ignored)
                os.waitpid(waiting, 0)
            raise
        finally:
            os.close(accepted)


def next_call(listener: socket.socket, stopping: int) -> socket.socket | None:
    """The next caller's connection; None once the resident has stopped (a connection still
    queued is then reset as the listener closes, and its caller runs the fallback: it is
    greeted by nobody, so it has sent nothing)."""
    ready, _, _ = select.select([listener.fileno(), stopping], [], [])
    return None if stopping in ready else listener.accept()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime_hook.start.resident",
        description="Serve gpuwire-hook and gpuwire-runtime calls from a process that has "
        "gpuwire loaded already (gpuwire-call is its client).",
    )
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help=f"default {DEFAULT_SOCKET}")
    parser.add_argument(
        "--enter",
        type=int,
        metavar="PID",
        help="once loaded, join PID's mount, cgroup, IPC, UTS and network namespaces (the "
        "host's init, 1, from a container with the host's PID namespace)",
    )
    logs.add_flags(parser)
    args = parser.parse_args(argv)
    logs.from_args("resident", args)
    own_stdio()
    preload()
    build = token()  # where this gpuwire was loaded from, resolved before that is left
    if args.enter is not None:
        try:
            enter(args.enter)
        except OSError as exc:
            log.error("cannot enter pid %d's namespaces: %s", args.enter, exc)
            return 1
    listener = listen(args.socket)
    ours = os.stat(args.socket).st_ino
    log.info("serving %s on %s", build, args.socket)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(listener, Served(build))
    finally:  # unless a newer resident has taken the path over
        with contextlib.suppress(OSError):
            if os.stat(args.socket).st_ino == ours:
                os.unlink(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
