"""A stand-in for NVIDIA's `nvidia-cuda-mps-control`, as a simulated node's driver binary.

It speaks what gpuwire uses of the real program (`nvidia-cuda-mps-control(1)`,
docs.nvidia.com/deploy/mps): `-d` starts a control daemon in the background and `-f` in the
foreground, in `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`), logging to
`$CUDA_MPS_LOG_DIRECTORY/control.log` (default `/var/log/nvidia-mps`) and writing
`nvidia-cuda-mps-control.pid` into the pipe directory; run without either, it is the client:
it sends each line of its standard input to the daemon of that pipe directory and prints the
answers, failing when no daemon runs there. The daemon answers the MPS v2 commands
`set_default_active_thread_percentage`, `get_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit`, `get_default_device_pinned_mem_limit`,
`get_server_list` and `quit`, and records every command in `control.log` ("CMD: ...").

The getters answer as the setters left them (`25.0`, `20480M`; `100.0` and `0` before any
was set). The daemon takes commands from anyone who reaches its socket, as NVIDIA's does (its
CUDA clients and its command client share the one `control` socket): `tenant` builds a
static client of that socket to put into an image, so a test can have a container connect
through its read-only pipe directory and, as a tenant would, set the daemon's defaults.

Left out: the real client/daemon protocol (this one is a line protocol on a unix socket
`control` in the pipe directory), MPS servers and their per-user lifecycle, CUDA clients,
GPUs, compute modes, and the limits themselves (nothing here runs a kernel). Standard
library only: `install` copies this file into a simulated node, with this Python as its
interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
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


class Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.threads = "100.0"
        self.memory: dict[str, str] = {}

    def record(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.log / "control.log", "a") as f:
            f.write(f"[{stamp} Control {os.getpid()}] {message}\n")

    def answer(self, command: str) -> tuple[str, bool]:
        """(the reply, whether to stop)."""
        self.record(f"CMD: {command}")
        verb, *args = command.split()
        if verb == "quit":
            return "", True
        if verb == "set_default_active_thread_percentage" and len(args) == 1:
            self.threads = f"{float(args[0]):.1f}"
            return self.threads, False
        if verb == "get_default_active_thread_percentage" and not args:
            return self.threads, False
        if verb == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.memory[args[0]] = args[1]
            return "", False
        if verb == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.memory.get(args[0], "0"), False
        if verb == "get_server_list" and not args:
            return "", False
        return f"Unrecognized command: {command}", False

    def serve(self, listening: int | None) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.pipe / SOCKET
        path.unlink(missing_ok=True)
        server.bind(str(path))
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
        replies, done = [], False
        for line in conn.makefile("rb").read().decode().splitlines():
            if line.strip():
                reply, done = self.answer(line.strip())
                replies.append(reply)
                if done:
                    break
        answer = "".join(f"{r}\n" for r in replies if r).encode()
        if answer:
            conn.sendall(answer)
        return done

    def stop(self, status: int) -> None:
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
