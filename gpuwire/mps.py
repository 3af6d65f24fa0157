"""NVIDIA MPS as gpuwire runs it: one control daemon per GPU, which the node agent starts and
supervises and the runtime joins containers to. What both must agree on is here, once.

Each GPU has a directory `<root>/<uuid>` (root: the node config's `mps-root`, the node
agent's `mps.root`) holding the daemon's `pipe/` (`CUDA_MPS_PIPE_DIRECTORY`: the control
daemon, its server and every client must name the same one), `log/`
(`CUDA_MPS_LOG_DIRECTORY`) and `shm/`, the `/dev/shm` that daemon (run in a mount namespace
of its own) and its clients share, and no other GPU's: NVIDIA's device plugin shares one
`<root>/shm` among all (`cmd/mps-control-daemon`, `internal/plugin/mps.go` of
NVIDIA/k8s-device-plugin), which lets a tenant of one GPU read another's. When a daemon is
up and has its defaults, the agent writes `<root>/<uuid>/ready`: the daemon's pid, its
start time (so a reused pid is not taken for it) and the defaults applied. A client then
needs the pipe directory mounted, `CUDA_MPS_PIPE_DIRECTORY` naming it, and its GPU's
`/dev/shm`; the MPS server enforces its limits (docs.nvidia.com/deploy/mps: the client
variables `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` can only
lower the daemon's defaults). A client that finds no daemon runs without MPS and without
limits (the `nvidia-cuda-mps-control` man page), so the runtime refuses to start one instead.

What a client uses of the pipe directory is one socket, the daemon's `control`: "When CUDA
is first initialized in a program, the CUDA driver attempts to connect to the MPS control
daemon" (the man page), the daemon logs "Starting control daemon using socket
<pipe dir>/control ... To connect CUDA applications to this daemon, set env
CUDA_MPS_PIPE_DIRECTORY" (its log, quoted in NVIDIA/k8s-device-plugin#1614), and it hands
each client its server's connection over that socket (`SCM_RIGHTS`, traced in
google/gvisor#14594). So a client gets the directory read-only (`PIPE_OPTIONS`): it connects,
it creates and removes nothing there (a read-only mount keeps a tenant from putting a socket
of its own in the place of `control` for the next client), and it gets neither MPS program
(`PROGRAMS`), which a client needs not (the daemon starts its servers on the host). That
socket is also the one `nvidia-cuda-mps-control` sends its commands on: NVIDIA's MPS has no
client-only door, so what a tenant could change through it, the daemon's defaults and what
its servers hold, is what the node agent checks every pass (`Defaults.queries`): defaults
it puts back, a server holding more than the share it ends (with its clients) by restarting
the daemon.

The runtime holds `lock(root, uuid)` shared from the moment it finds the daemon ready until
its process ends (after the container record names the GPU, `gpuwire.records`' `mps`); the
agent takes it exclusively before it restarts an idle daemon to empty its `/dev/shm`, so a
container being started is never left without its daemon.

On the container-start path: `os`, `gpuwire.lightjson` and `gpuwire.records` only (and
`fcntl` for a container that joins).
"""

from __future__ import annotations

import os

from gpuwire import lightjson
from gpuwire.records import process_start
from gpuwire.value import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

DEFAULT_ROOT = "/run/gpuwire/mps"
CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
CLIENT_ENV = (MEMORY_ENV, THREADS_ENV)  # a container asks for MPS limits by these
# Where a client container finds its GPU's pipes: MPS's default, so that a client finds them
# even where its environment cannot be set (the prestart hook runs after the process is made).
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
CONTAINER_SHM = "/dev/shm"
READY = "ready"
SERVER_LIST = "get_server_list"  # a daemon's servers' pids, one a line
SERVER = "nvidia-cuda-mps-server"
PROGRAMS = (CONTROL, SERVER)  # the driver's, which a client container is not given
PIPE_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind")  # a client connects, and no more


def gpu_dir(root: str, uuid: str) -> str:
    return f"{root}/{uuid}"


def pipe_dir(root: str, uuid: str) -> str:
    return f"{root}/{uuid}/pipe"


def log_dir(root: str, uuid: str) -> str:
    return f"{root}/{uuid}/log"


def shm_dir(root: str, uuid: str) -> str:
    return f"{root}/{uuid}/shm"


def lock(root: str, uuid: str, *, exclusive: bool = False) -> int | None:
    """A lock on GPU `uuid`'s directory, held while the returned descriptor is open (closed
    on exec); shared (the runtime, waiting for it), or exclusive and only if free (the
    agent: None where it is not). The directory lives as long as `root`: the lock outlives
    daemons, whose markers are replaced."""
    import fcntl

    fd = os.open(gpu_dir(root, uuid), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def limit_env(memory_mib: int | None, threads: int | None) -> dict[str, str]:
    """The client variables for its one device (ordinal 0): memory in MiB, thread percent."""
    env: dict[str, str] = {}
    if memory_mib is not None:
        env[MEMORY_ENV] = f"0={memory_mib}M"
    if threads is not None:
        env[THREADS_ENV] = str(threads)
    return env


def asks(names: Iterable[str]) -> bool:
    """Whether an environment (its variable names) asks for MPS limits."""
    return any(name in CLIENT_ENV for name in names)


class Defaults(Value):
    """What a GPU's daemon applies to every client: the share of its threads (percent) and of
    its memory (MiB); None leaves MPS's own (100 %, no memory limit)."""

    __slots__ = _fields = ("threads", "memory_mib")
    threads: int | None
    memory_mib: int | None

    def __init__(self, threads: int | None = None, memory_mib: int | None = None) -> None:
        self._set(threads=threads, memory_mib=memory_mib)

    def commands(self) -> list[str]:
        """The control commands that set them, for servers started after them. The memory
        limit names the device by ordinal (0: the daemon sees its one GPU): NVIDIA's plugin
        found limits set by UUID not applied (k8s-device-plugin v0.15.0-rc.2)."""
        out = []
        if self.threads is not None:
            out.append(f"set_default_active_thread_percentage {self.threads}")
        if self.memory_mib is not None:
            out.append(f"set_default_device_pinned_mem_limit 0 {self.memory_mib}M")
        return out

    @staticmethod
    def queries(server: int | None = None) -> list[str]:
        """The control commands that read a daemon's defaults back, or what its server of
        pid `server` holds (set from the defaults as it started, or on it since: MPS's v2
        interface, docs.nvidia.com/deploy/mps/latest/mpsv2-interface.html), in `live`'s
        order."""
        if server is None:
            return ["get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"]
        return [f"get_active_thread_percentage {server}", f"get_device_pinned_mem_limit {server} 0"]

    @classmethod
    def live(cls, answer: str) -> Defaults | None:
        """What a daemon answered to `queries` (its own or a server's): the thread
        percentage (`25.0`) and device 0's pinned memory limit (`20480M`, `20G`; `0` or
        nothing: none), as Defaults (100 % reads as None, MPS's own); None where the answer
        is not that."""
        words = answer.split()
        try:
            threads = float(words[0])
        except (IndexError, ValueError):
            return None
        memory = words[1] if len(words) == 2 else "0"
        scale = {"M": 1, "G": 1024}.get(memory[-1:], 0)
        digits = memory[:-1] if scale else memory
        if len(words) > 2 or not digits.isdigit() or not 0 < threads <= 100:
            return None
        if not scale and int(digits):  # a size without its unit
            return None
        return cls(None if threads == 100 else round(threads), int(digits) * scale or None)

    def lifted_by(self, live: Defaults) -> list[str]:
        """What `live` (a daemon's or a server's answer) allows beyond these: each limit it
        has looser, as `name: set → live`; a tighter one lifts nothing."""
        lifted = []
        if self.threads is not None and (live.threads or 100) > self.threads:
            lifted.append(f"active thread percentage {self.threads} → {live.threads or 100}")
        if self.memory_mib is not None and (live.memory_mib or 1 << 62) > self.memory_mib:
            now = f"{live.memory_mib} MiB" if live.memory_mib else "none"
            lifted.append(f"pinned memory limit {self.memory_mib} MiB → {now}")
        return lifted


class Daemon(Value):
    """A running control daemon, as its ready marker names it."""

    __slots__ = _fields = ("pid", "start", "defaults")
    pid: int
    start: int  # /proc/<pid>/stat field 22: when the process started, in clock ticks
    defaults: Defaults

    def __init__(self, pid: int, start: int, defaults: Defaults) -> None:
        self._set(pid=pid, start=start, defaults=defaults)

    def alive(self) -> bool:
        """Whether the process is still the one that was marked ready."""
        return process_start(self.pid) == self.start

    def encode(self) -> bytes:
        d = self.defaults
        body = {
            "pid": self.pid,
            "start": self.start,
            "threads": d.threads,
            "memory_mib": d.memory_mib,
        }
        return lightjson.dumps(body).encode()


def ready(root: str, uuid: str) -> Daemon | None:
    """GPU `uuid`'s daemon, if its marker is there and the process it names still runs."""
    try:
        with open(f"{gpu_dir(root, uuid)}/{READY}", "rb") as f:
            body = lightjson.loads(f.read())
        if not isinstance(body, dict):
            return None
        daemon = Daemon(
            int(body["pid"]), int(body["start"]), Defaults(body["threads"], body["memory_mib"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return daemon if daemon.alive() else None


def control_env(root: str, uuid: str, path: str) -> dict[str, str]:
    """The whole environment of a GPU's control daemon and of the commands sent to it: its
    GPU alone visible, its own pipe and log directories."""
    return {
        "PATH": path,
        "CUDA_VISIBLE_DEVICES": uuid,
        PIPE_ENV: pipe_dir(root, uuid),
        LOG_ENV: log_dir(root, uuid),
    }


def mark_ready(root: str, uuid: str, daemon: Daemon) -> None:
    from gpuwire import atomicfile

    atomicfile.replace(f"{gpu_dir(root, uuid)}/{READY}", daemon.encode(), 0o644)


def unmark(root: str, uuid: str) -> bool:
    """Remove the marker (the daemon is down or going); whether there was one."""
    try:
        os.unlink(f"{gpu_dir(root, uuid)}/{READY}")
    except FileNotFoundError:
        return False
    return True
