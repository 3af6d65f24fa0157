"""A private containerd of one generation (testbed/containerds.py): its own config, root,
state, sockets, runc root and namespace; with its CRI plugin on, pods run through it as a
kubelet runs them (`kuberuntime`, testbed/kuberuntime.py).

Nothing is shared with the host's containerd or with another test running beside this one:
every path lives under one temporary directory, containers get unique ids in a unique
namespace (so their cgroups are `/<namespace>/<id>`, a pod's `/<namespace>/pod<uid>/<id>`),
and `close` removes exactly what this instance made, by pid and by path.
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

from testbed import containerds
from testbed.containerds import Generation
from testbed.host import Closing, LabError, remove_cgroups, remove_home, run, stop
from testbed.image import PAUSE, write_pause_tar
from testbed.kuberuntime import KubeRuntime

CRI = "io.containerd.grpc.v1.cri"
CRI_NAMESPACE = "k8s.io"  # where containerd's CRI plugin keeps pods, containers and images
RUNC_SHIM = "io.containerd.runc.v2"
# Config version → the plugin holding `containerd.runtimes`, and the CRI plugins to disable
RUNTIME_PLUGIN = {2: CRI, 3: "io.containerd.cri.v1.runtime"}
CRI_PLUGINS = {2: (CRI,), 3: (CRI, "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images")}


@dataclass(frozen=True)
class Container:
    """What `ctr run` starts, without CRI (bench/hook.py's `ctr` rows): `image` running
    `args`, through `runtime`'s shim, with its annotations and env as given."""

    image: str
    args: tuple[str, ...] = ()
    runtime: str = RUNC_SHIM  # the shim containerd starts (a handler's runtime_type)
    runc_binary: str | None = None  # containerd's runc shim runs this instead of runc
    annotations: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


def cri_config(home: Path, generation: Generation) -> str:
    """The CRI plugin's private settings, in `generation`'s config version.

    Its pause image is the testbed's own (`image.PAUSE`: no registry here); its CNI dirs, runc
    root and (from 1.7) CDI spec dir lie under `home`; its stream server takes a free port.
    `restrict_oom_score_adj`: the sandbox's oom_score_adj of -998 needs CAP_SYS_RESOURCE,
    which a CI container may not have; capped at containerd's own, nothing here depends on it.
    """
    runtime = RUNTIME_PLUGIN[generation.config_version]
    if generation.config_version == 2:  # 1.x: one plugin holds it all
        head = f"""[plugins."{CRI}"]
  stream_server_port = "0"
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
"""
    else:  # 2.x: the gRPC service, the images and the runtime are plugins of their own
        head = f"""[plugins."{CRI}"]
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE}"

[plugins."{runtime}"]
  restrict_oom_score_adj = true
"""
    cdi = f'  cdi_spec_dirs = ["{home}/cdi"]\n' if generation.cdi else ""
    # bin_dirs from 2.1, which deprecates bin_dir
    cni = (
        f'bin_dirs = ["{home}/cni/bin"]'
        if generation.series >= (2, 1)
        else f'bin_dir = "{home}/cni/bin"'
    )
    return f"""
{head}{cdi}
[plugins."{runtime}".cni]
  {cni}
  conf_dir = "{home}/cni/net.d"

[plugins."{runtime}".containerd.runtimes.runc]
  runtime_type = "{RUNC_SHIM}"

[plugins."{runtime}".containerd.runtimes.runc.options]
  Root = "{home}/runc"
"""


def base_config(home: Path, *, cri: bool = False, generation: Generation | None = None) -> str:
    """A config in `generation`'s version (2 before containerd 2.0, 3 from it) whose every
    path, sockets included, is under `home`; NRI (on by default from 2.0, its socket in
    /var/run/nri) is off.

    The CRI plugin stays off unless asked for; when on, it is set up to run pods
    (`cri_config`)."""
    generation = generation or containerds.system()
    version = generation.config_version
    off = "" if cri else ", ".join(f'"{p}"' for p in CRI_PLUGINS[version])
    text = f"""version = {version}
root = "{home}/root"
state = "{home}/state"
temp = "{home}/tmp"
disabled_plugins = [{off}]

[grpc]
  address = "{home}/containerd.sock"

[ttrpc]
  address = "{home}/containerd.sock.ttrpc"

[debug]
  address = "{home}/debug.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{home}/opt"

[plugins."io.containerd.nri.v1.nri"]
  disable = true
"""
    return text + (cri_config(home, generation) if cri else "")


@dataclass
class Containerd(Closing):
    home: Path
    generation: Generation = field(default_factory=containerds.system)
    cri: bool = False
    namespace: str = field(default_factory=lambda: f"gpuwire-{uuid.uuid4().hex[:8]}")
    process: subprocess.Popen[bytes] | None = None
    _env: Mapping[str, str] | None = None  # what `start` was given, for `restart`

    @classmethod
    def create(cls, *, cri: bool = False, generation: Generation | None = None) -> Containerd:
        """A configured, not yet started, instance of `generation` (default: the system's).
        The home is short: socket paths must fit in 108 bytes."""
        home = Path(tempfile.mkdtemp(prefix="gwctd-", dir="/tmp"))
        (home / "tmp").mkdir()
        generation = generation or containerds.system()
        (home / "config.toml").write_text(base_config(home, cri=cri, generation=generation))
        return cls(home, generation, cri)

    @property
    def config(self) -> Path:
        return self.home / "config.toml"

    @property
    def address(self) -> Path:
        return self.home / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.home / "containerd.log"

    def binary(self, name: str) -> str:
        return str(self.generation.bin / name)

    def start(self, env: Mapping[str, str] | None = None, timeout: float = 30) -> None:
        """Run containerd with `config`; return once it answers, with the pause image in
        place when the CRI plugin is on. Shims, and so the runtime binaries they run,
        inherit `env` (how gpuwire-runtime finds its config) and find their own generation's
        shim first on PATH."""
        self._env = env
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary("containerd"), "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.generation.env({**os.environ, **(env or {})}),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LabError(f"containerd exited {self.process.returncode}: {self._log_tail()}")
            if self.address.exists() and self.ctr("version", check=False).returncode == 0:
                if self.cri:
                    self.import_image(write_pause_tar(self.home / "pause.tar"), CRI_NAMESPACE)
                return
            time.sleep(0.05)
        raise LabError(f"containerd did not answer within {timeout}s: {self._log_tail()}")

    def restart(self) -> None:
        """containerd itself killed (SIGKILL, as the OOM killer or a crash ends it) and started
        again on the same root and state: running containers keep running under their shims,
        which the new containerd finds again; CRI calls fail until it answers."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.start(self._env)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60, namespace: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """This generation's `ctr`, in this instance's namespace unless told another."""
        where = ["--address", str(self.address), "--namespace", namespace or self.namespace]
        return run([self.binary("ctr"), *where, *args], check=check, timeout=timeout)

    def dump(self) -> str:
        """`containerd config dump`: the config as containerd reads it, imports merged."""
        return run(
            [self.binary("containerd"), "--config", str(self.config), "config", "dump"]
        ).stdout

    def import_image(self, layout_tar: Path, namespace: str = "") -> None:
        """Import an image-layout tar (into `CRI_NAMESPACE` for pods that CRI runs)."""
        self.ctr("images", "import", str(layout_tar), namespace=namespace)

    def kuberuntime(self) -> KubeRuntime:
        """A kubelet's runtime manager on this containerd's CRI socket, its files under the
        home and its pods' cgroups under this instance's namespace (removed by `close`)."""
        return KubeRuntime(self.address, self.home / "kubelet", f"/{self.namespace}")

    def run_argv(self, container: Container, cid: str, *, detach: bool = False) -> list[str]:
        """The `ctr run` arguments: runc root and IO fifos private; the container removed on
        exit, or (`detach`) left to `remove` once `ctr` returns from starting it."""
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
        for key, value in container.annotations.items():
            argv += ["--annotation", f"{key}={value}"]
        for key, value in container.env.items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, container.image, cid, *container.args]

    def remove(self, cid: str, namespace: str = "") -> None:
        """Kill and delete container `cid` and its task, if it exists."""
        ns = namespace or self.namespace
        if self.ctr("containers", "info", cid, check=False, namespace=ns).returncode == 0:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", cid, check=False, namespace=ns)
            self.ctr("tasks", "delete", "--force", cid, check=False, namespace=ns)
            self.ctr("containers", "delete", cid, check=False, namespace=ns)

    def stop(self) -> None:
        """Remove this instance's containers (pods' too, which a failed test may have left
        to it), so that no shim outlives it, then stop containerd (by its pid)."""
        if self.process is None or self.process.poll() is not None:
            return
        for ns in (self.namespace, CRI_NAMESPACE):
            listed = self.ctr("containers", "list", "--quiet", check=False, namespace=ns)
            for cid in listed.stdout.split():
                self.remove(cid, ns)
        stop(self.process, timeout=15)

    def close(self) -> None:
        """Stop, then remove the namespace's cgroups and the home directory."""
        self.stop()
        remove_cgroups(self.namespace)
        remove_home(self.home)
