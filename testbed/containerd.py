"""A private containerd: its own config, root, state, sockets, runc root and namespace.

Nothing is shared with the host's containerd or with another test running beside this one:
every path lives under one temporary directory, containers get unique ids in a unique
namespace (so their cgroups are `/<namespace>/<id>`), and `close` removes exactly what this
instance made, by pid and by path.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from testbed.host import Closing, LabError, remove_cgroups, remove_home, run, stop

CRI = "io.containerd.grpc.v1.cri"
RUNC_SHIM = "io.containerd.runc.v2"


@dataclass(frozen=True)
class Mount:
    """A read-only bind mount, as `ctr run --mount` and `podman run -v` take it."""

    source: Path
    destination: str


@dataclass(frozen=True)
class Container:
    """What `ctr run` starts: `image` running `args`, or, with `spec`, that OCI spec file
    whole (`ctr run --config`, the way CRI starts from a `base_runtime_spec`)."""

    image: str = ""
    args: tuple[str, ...] = ()
    spec: Path | None = None
    runtime: str = RUNC_SHIM  # the shim containerd starts (a handler's runtime_type)
    runc_binary: str | None = None  # containerd's runc shim runs this instead of runc
    annotations: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def base_config(home: Path, *, cri: bool = False) -> str:
    """A version-2 config whose every path (sockets included) is under `home`.

    The CRI plugin stays off unless asked for (it is only needed to validate runtime
    handlers); when on, its CNI dirs and stream port are private too.
    """
    text = f"""version = 2
root = "{home}/root"
state = "{home}/state"
temp = "{home}/tmp"
disabled_plugins = [{"" if cri else f'"{CRI}"'}]

[grpc]
  address = "{home}/containerd.sock"

[ttrpc]
  address = "{home}/containerd.sock.ttrpc"

[debug]
  address = "{home}/debug.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{home}/opt"
"""
    if cri:
        text += f"""
[plugins."{CRI}"]
  stream_server_port = "0"
  [plugins."{CRI}".cni]
    bin_dir = "{home}/cni/bin"
    conf_dir = "{home}/cni/net.d"
"""
    return text


@dataclass
class Containerd(Closing):
    home: Path
    namespace: str = field(default_factory=lambda: f"gpuwire-{uuid.uuid4().hex[:8]}")
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, *, cri: bool = False) -> Containerd:
        """A configured, not yet started, instance. The home is short: socket paths must
        fit in 108 bytes."""
        home = Path(tempfile.mkdtemp(prefix="gwctd-", dir="/tmp"))
        (home / "tmp").mkdir()
        (home / "config.toml").write_text(base_config(home, cri=cri))
        return cls(home)

    @property
    def config(self) -> Path:
        return self.home / "config.toml"

    @property
    def address(self) -> Path:
        return self.home / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.home / "containerd.log"

    def start(self, env: Mapping[str, str] | None = None, timeout: float = 30) -> None:
        """Run containerd with `config`; return once it answers. Shims, and so the runtime
        binaries they run, inherit `env` (how gpuwire-runtime finds its config)."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                ["containerd", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LabError(f"containerd exited {self.process.returncode}: {self._log_tail()}")
            if self.address.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.05)
        raise LabError(f"containerd did not answer within {timeout}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        ctr = ["ctr", "--address", str(self.address), "--namespace", self.namespace]
        return run([*ctr, *args], check=check, timeout=timeout)

    def dump(self) -> str:
        """`containerd config dump`: the config as containerd reads it, imports merged."""
        return run(["containerd", "--config", str(self.config), "config", "dump"]).stdout

    def import_image(self, layout_tar: Path) -> None:
        self.ctr("images", "import", str(layout_tar))

    def run_argv(
        self, container: Container, cid: str, *, detach: bool = False, log: Path | None = None
    ) -> list[str]:
        """The `ctr run` arguments: runc root and IO fifos private; the container removed on
        exit, or (`detach`) left to `remove` once `ctr` returns from starting it, its output
        going to the file `log`."""
        argv = [
            "run",
            "--detach" if detach else "--rm",
            "--runc-root",
            f"{self.home}/runc",
            "--fifo-dir",
            f"{self.home}/fifo",
            "--runtime",
            container.runtime,
        ]
        if container.runc_binary:
            argv += ["--runc-binary", container.runc_binary]
        if log is not None:
            argv += ["--log-uri", f"file://{log}"]
        for key, value in container.annotations.items():
            argv += ["--annotation", f"{key}={value}"]
        for m in container.mounts:
            argv += ["--mount", f"type=bind,src={m.source},dst={m.destination},options=rbind:ro"]
        for key, value in container.env.items():
            argv += ["--env", f"{key}={value}"]
        if container.spec:
            return [*argv, "--config", str(container.spec), cid]
        return [*argv, container.image, cid, *container.args]

    def run(
        self, container: Container, timeout: float = 60, cid: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a container to completion under `cid` (default: a fresh id); it is gone
        afterwards either way."""
        cid = cid or f"gpuwire-{uuid.uuid4().hex[:12]}"
        try:
            return self.ctr(*self.run_argv(container, cid), check=False, timeout=timeout)
        finally:
            self.remove(cid)

    def run_detached(
        self, container: Container, cid: str, log: Path, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Start a container that keeps running (until `remove` or `close`), its stdout and
        stderr going to the file `log`."""
        return self.ctr(*self.run_argv(container, cid, detach=True, log=log), check=False,
                        timeout=timeout)  # fmt: skip

    def task_status(self, cid: str) -> str:
        """RUNNING, STOPPED, ... as `ctr tasks ls` says; "" when `cid` has no task."""
        for line in self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]:
            words = line.split()
            if words and words[0] == cid:
                return words[-1]
        return ""

    def remove(self, cid: str) -> None:
        """Kill and delete container `cid` and its task, if it exists."""
        if self.ctr("containers", "info", cid, check=False).returncode == 0:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", cid, check=False)
            self.ctr("tasks", "delete", "--force", cid, check=False)
            self.ctr("containers", "delete", cid, check=False)

    def stop(self) -> None:
        """Remove this instance's containers, then stop containerd (by its pid)."""
        if self.process is None or self.process.poll() is not None:
            return
        for cid in self.ctr("containers", "list", "--quiet", check=False).stdout.split():
            self.remove(cid)
        stop(self.process, timeout=15)

    def close(self) -> None:
        """Stop, then remove the namespace's cgroups and the home directory."""
        self.stop()
        remove_cgroups(self.namespace)
        remove_home(self.home)
