"""A stand-in for NVIDIA's `nvidia-cuda-mps-control`, as a simulated node's driver binary.

It speaks what gpuwire uses of the real program (`nvidia-cuda-mps-control(1)`,
docs.nvidia.com/deploy/mps): `-d` starts a control daemon in the background and `-f` in the
foreground, in `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`), logging to
`$CUDA_MPS_LOG_DIRECTORY/control.log` (default `/var/log/nvidia-mps`) and writing
`nvidia-cuda-mps-control.pid` into the pipe directory; run without either, it is the client:
it sends each line of its standard input to the daemon of that pipe directory and prints the
answers, failing when no daemon runs there. The daemon answers the Legacy MPS v2 commands
(docs.nvidia.com/deploy/mps/latest/mpsv2-interface.html) `set_default_active_thread_percentage`,
`get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`,
`get_default_device_pinned_mem_limit`, `get_server_list` (one pid a line),
`set_active_thread_percentage <PID>`, `get_active_thread_percentage <PID>`,
`set_device_pinned_mem_limit <PID> <dev>`, `get_device_pinned_mem_limit <PID> <dev>` and
`quit` (which ends its servers too), and records every command in `control.log`
("CMD: ...").

The getters answer as the setters left them (`25.0`, `20480M`; `100.0` and `0` before any
was set). Servers, as the man page has them: "When CUDA is first initialized in a program,
the CUDA driver attempts to connect to the MPS control daemon ... requests the daemon to
start an MPS server on its behalf", one per user: a client of the user whose server runs is
given it, any other gets a new server of its own user, started with the daemon's defaults of
that moment and keeping them (a later `set_default_*` changes only the next server, a
`set_*` on a server only what it holds). Here a client says `cuda_init` on the socket, the
daemon takes its user from the kernel (`SO_PEERCRED`), and answers its server's pid; the
server is a real child process of the daemon, of that user where the daemon is root, that
ends when the daemon ends it (`quit`, `SIGTERM`, a client of another user) or dies.
`cuda_init` here does that from Python as any user; `tenant` builds a static client of the
socket to put into an image. The daemon takes commands from anyone who reaches its socket,
as NVIDIA's does (its CUDA clients and its command client share the one `control` socket,
which is writable by every user, since clients of every user connect), so a test can have a
container connect through its read-only pipe directory and, as a tenant would, set the
daemon's defaults and then be given a server that keeps them.

Left out: the real client/daemon protocol (this one is a line protocol on a unix socket
`control` in the pipe directory, `cuda_init` its own word), the server program and its
connection to its clients (a server here only lives), clients themselves (nothing counts
them: a client of another user is given its server at once, where the real daemon has it
wait until the running server's clients are done), the wording of the real daemon's errors,
GPUs, compute modes, and the limits themselves (nothing here runs a kernel). Standard
library only: `install` copies this file into a simulated node, with this Python as its
interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

PIPE_DEFAULT, LOG_DEFAULT = "/tmp/nvidia-mps", "/var/log/nvidia-mps"
PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"


def install(root: str | os.PathLike[str], python: str = sys.executable) -> Path:
    """Put this stand-in into the simulated node `root` as its `nvidia-cuda-mps-control`."""
    target = Path(root, "usr/bin/nvidia-cuda-mps-control")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    target.write_text(f"#!{python} -I\n" + Path(__file__).read_text())
    target.chmod(0o755)
    return target


TENANT_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* tenant [COMMAND]...: each COMMAND as a line to $CUDA_MPS_PIPE_DIRECTORY/control (default
 * /tmp/nvidia-mps/control), the answer on stdout: what a process that reaches an MPS
 * daemon's socket can send it */
int main(int argc, char **argv)
{
	const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	char buf[4096];
	ssize_t n;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/control", dir ? dir : "/tmp/nvidia-mps");
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		perror(addr.sun_path);
		return 1;
	}
	for (int i = 1; i < argc; i++)
		if (write(fd, argv[i], strlen(argv[i])) < 0 || write(fd, "\n", 1) < 0)
			return 1;
	shutdown(fd, SHUT_WR);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		fwrite(buf, 1, (size_t)n, stdout);
	return 0;
}
"""


def tenant(target: str | os.PathLike[str]) -> Path:
    """A static client of the daemon's socket at `target` (for an image: no libraries)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "tenant.c")
        source.write_text(TENANT_SOURCE)
        subprocess.run(
            ["cc", "-O2", "-static", "-o", str(target), str(source)],
            check=True,
            capture_output=True,
        )
    return Path(target)


def _dirs() -> tuple[Path, Path]:
    return (
        Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or PIPE_DEFAULT),
        Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or LOG_DEFAULT),
    )


CUDA_INIT = "cuda_init"  # what a CUDA client says first, here (the real protocol is NVIDIA's)


def cuda_init(pipe: str | os.PathLike[str], uid: int = 0) -> int:
    """Connect to the daemon of `pipe` as CUDA does when it starts in a program of user `uid`
    (another than this process's needs root): the pid of the server it is given. The socket
    is named from the pipe directory itself, so `uid` needs no way through its parents."""
    readable, writable = os.pipe()
    child = os.fork()
    if child == 0:  # the client, as user `uid`
        os.close(readable)
        answer = b""
        try:
            os.chdir(pipe)
            if uid != os.getuid():
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(SOCKET)
                conn.sendall(f"{CUDA_INIT}\n".encode())
                conn.shutdown(socket.SHUT_WR)
                answer = conn.makefile("rb").read()
        except OSError as exc:
            answer = str(exc).encode()
        finally:
            os.write(writable, answer)
            os._exit(0)
    os.close(writable)
    with open(readable, "rb") as answered:
        given = answered.read().decode().strip()
    os.waitpid(child, 0)
    if not given.isdigit():
        raise RuntimeError(f"{CUDA_INIT} as user {uid} in {pipe}: {given}")
    return int(given)


class Server:
    """A server the daemon started: a child process that lives until the daemon closes
    `release` (or itself ends), and the limits it was started with or was set to."""

    __slots__ = ("memory", "pid", "release", "threads", "uid")

    def __init__(
        self, pid: int, uid: int, release: int, threads: str, memory: dict[str, str]
    ) -> None:
        self.pid, self.uid, self.release = pid, uid, release
        self.threads, self.memory = threads, memory

    def alive(self) -> bool:
        return os.waitpid(self.pid, os.WNOHANG) == (0, 0)

    def end(self) -> None:
        os.close(self.release)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.threads = "100.0"
        self.memory: dict[str, str] = {}
        self.servers: dict[int, Server] = {}

    def record(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log / "control.log", "a") as f:
            f.write(f"[{stamp} Control {os.getpid()}] {message}\n")

    def answer(self, command: str, peer: tuple[int, int]) -> tuple[str, bool]:
        """(the reply, whether to stop); `peer`: the sender's user and group."""
        self.record(f"CMD: {command}")
        verb, *args = command.split()
        try:
            return self.command(verb, args, peer), verb == "quit" and not args
        except ValueError:
            return f"Invalid arguments: {command}", False
        except LookupError:
            return f"No server with pid {args[0]}", False

    def command(self, verb: str, args: list[str], peer: tuple[int, int]) -> str:
        """The reply to one command; ValueError for arguments it cannot read, LookupError
        for a server pid that names none."""
        match verb, len(args):
            case "quit", 0:
                return ""
            case "set_default_active_thread_percentage", 1:
                self.threads = f"{float(args[0]):.1f}"
                return self.threads
            case "get_default_active_thread_percentage", 0:
                return self.threads
            case "set_default_device_pinned_mem_limit", 2:
                self.memory[args[0]] = args[1]
                return ""
            case "get_default_device_pinned_mem_limit", 1:
                return self.memory.get(args[0], "0")
            case "get_server_list", 0:
                return "\n".join(str(pid) for pid in self.live())
            case "set_active_thread_percentage", 2:
                server = self.live()[int(args[0])]
                server.threads = f"{float(args[1]):.1f}"
                return server.threads
            case "get_active_thread_percentage", 1:
                return self.live()[int(args[0])].threads
            case "set_device_pinned_mem_limit", 3:
                self.live()[int(args[0])].memory[args[1]] = args[2]
                return ""
            case "get_device_pinned_mem_limit", 2:
                return self.live()[int(args[0])].memory.get(args[1], "0")
            case "cuda_init", 0:
                return str(self.serve_client(*peer))
        return f"Unrecognized command: {' '.join([verb, *args])}"

    def live(self) -> dict[int, Server]:
        """The servers still running (one that ended is reaped and forgotten)."""
        for pid in [pid for pid, server in self.servers.items() if not server.alive()]:
            os.close(self.servers.pop(pid).release)
        return self.servers

    def serve_client(self, uid: int, gid: int) -> int:
        """The pid of user `uid`'s server: the running one, or a new one with the defaults
        of now (any other user's ended first: one server at a time)."""
        for pid, server in list(self.live().items()):
            if server.uid == uid:
                return pid
            self.record(f"Server {pid} of user {server.uid} ends: a client of user {uid} came")
            self.servers.pop(pid).end()
        waiting, release = os.pipe()
        pid = os.fork()
        if pid == 0:  # the server: nothing of the daemon's but `waiting`
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.closerange(3, waiting)
                os.closerange(waiting + 1, os.sysconf("SC_OPEN_MAX"))
                if os.getuid() == 0 and uid != 0:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)
                os.read(waiting, 1)  # until the daemon closes `release` or ends
            finally:
                os._exit(0)
        os.close(waiting)
        self.servers[pid] = Server(pid, uid, release, self.threads, dict(self.memory))
        self.record(f"Starting new server {pid} for user {uid}")
        return pid

    def serve(self, listening: int | None) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.pipe / SOCKET
        path.unlink(missing_ok=True)
        server.bind(str(path))
        os.chmod(path, 0o666)  # noqa: S103 - clients of every user connect (a server per user)
        server.listen(16)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        self.record(f"Starting control daemon using socket {path}")
        if listening is not None:
            os.write(listening, b"!")
            os.close(listening)
        signal.signal(signal.SIGTERM, lambda *_: self.stop(0))
        while True:
            conn, _ = server.accept()
            done = False
            # a client gone mid-way (or only probing) leaves it to the next one
            with conn, contextlib.suppress(OSError):
                done = self.session(conn)
            if done:
                self.stop(0)

    def session(self, conn: socket.socket) -> bool:
        """One client's commands, answered; whether one was `quit`."""
        _, uid, gid = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        )
        replies, done = [], False
        for line in conn.makefile("rb").read().decode().splitlines():
            if line.strip():
                reply, done = self.answer(line.strip(), (uid, gid))
                replies.append(reply)
                if done:
                    break
        answer = "".join(f"{r}\n" for r in replies if r).encode()
        if answer:
            conn.sendall(answer)
        return done

    def stop(self, status: int) -> None:
        for server in self.servers.values():
            server.end()
        for name in (SOCKET, PID_FILE):
            (self.pipe / name).unlink(missing_ok=True)
        self.record("Control daemon exited")
        os._exit(status)


def _running(pipe: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(pipe / SOCKET))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def daemon(background: bool) -> int:
    pipe, log = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    if _running(pipe):
        sys.stderr.write("An instance of this daemon is already running\n")
        return 1
    listening = None
    if background:  # the parent returns once the daemon listens, as a started service does
        readable, listening = os.pipe()
        if os.fork() > 0:
            os.close(listening)
            os.read(readable, 1)
            return 0
        os.close(readable)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    Daemon(pipe, log).serve(listening)
    return 0


def client() -> int:
    pipe, _ = _dirs()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(pipe / SOCKET))
    except OSError:
        sys.stderr.write("Cannot find MPS control daemon process\n")
        return 1
    with conn:
        conn.sendall(sys.stdin.buffer.read())
        conn.shutdown(socket.SHUT_WR)
        sys.stdout.write(conn.makefile("rb").read().decode())
    return 0


def main(argv: list[str]) -> int:
    if argv in (["-d"], ["-f"]):
        return daemon(background=argv == ["-d"])
    if not argv:
        return client()
    sys.stderr.write("usage: nvidia-cuda-mps-control [-d | -f]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
