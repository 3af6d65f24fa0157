"""A Kubernetes node on this machine, sandboxed: the host its pods and gpuwire's installer see
is the node's, never this machine's.

The node is a PID, mount, network and UTS namespace whose PID 1 is testbed/nodeinit.py: its
root an overlay of this machine's `/` (every write lands in the node's upper layer, under
`home`; nothing of the real host changes), a simulated GPU driver installed in it, containerd
of one generation (testbed/containerds.py) run by a systemd stand-in with the node's own
`/etc/containerd/config.toml` at the standard paths (CRI socket /run/containerd/
containerd.sock, root /var/lib/containerd, runc state /run/containerd/runc), and a bridge
network for its pods (containernetworking-plugins' `bridge` and `host-local`) whose gateway is
where the node reaches the API server. What is at path P on the node is at `path(P)` here
(through /proc/<pid>/root); sockets in the node's network come from `listen` and `connect`.
`close` ends the namespace, and with it every process, mount and network device of the node;
then the pods' cgroups and the home go, by path.

Left out: a node's own user namespace (it runs as this machine's root), kernel modules and a
real GPU (the driver is gpuwire's simulated one, testbed's GPU stand-in), systemd itself (only
containerd.service, `systemctl restart|is-active containerd`), DNS, and a network to other
nodes (one node, one bridge).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpuwire import sim
from testbed import containerds, mps_control
from testbed.containerd import CRI, CRI_NAMESPACE, RUNC_SHIM, RUNTIME_PLUGIN
from testbed.containerds import Generation
from testbed.host import Closing, LabError, remove_cgroups, remove_home, run
from testbed.image import PAUSE, write_pause_tar
from testbed.kuberuntime import KubeRuntime
from testbed.nodeinit import CNI_BIN, CONTROL, READY
from testbed.waiting import until

REPO = Path(__file__).resolve().parents[1]
SOCKET = "/run/containerd/containerd.sock"
BRIDGE, SUBNET, GATEWAY = "cni0", "10.88.0.0/16", "10.88.0.1"
IMAGE_PYTHON = "/opt/gpuwire/current/bin/python"  # gpuwire's image's (Containerfile)
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def containerd_config(generation: Generation) -> str:
    """What a node's admin has in /etc/containerd/config.toml before gpuwire: the config
    version of the generation, the CRI plugin with the testbed's pause image (no registry
    here), CNI from Debian's plugins, runc as the default handler."""
    version = generation.config_version
    runtime = RUNTIME_PLUGIN[version]
    # restrict_oom_score_adj: a sandbox's -998 needs CAP_SYS_RESOURCE, which this machine's
    # root may lack (testbed/containerd.py says the same)
    if version == 2:
        images = (
            f'[plugins."{CRI}"]\n  sandbox_image = "{PAUSE}"\n  restrict_oom_score_adj = true\n'
        )
    else:
        images = (
            f'[plugins."io.containerd.cri.v1.images".pinned_images]\n  sandbox = "{PAUSE}"\n\n'
            f'[plugins."{runtime}"]\n  restrict_oom_score_adj = true\n'
        )
    cni_dirs = (
        f'bin_dirs = ["{CNI_BIN}"]' if generation.series >= (2, 1) else f'bin_dir = "{CNI_BIN}"'
    )
    return f"""version = {version}

{images}
[plugins."{runtime}".cni]
  {cni_dirs}
  conf_dir = "/etc/cni/net.d"

[plugins."{runtime}".containerd]
  default_runtime_name = "runc"

[plugins."{runtime}".containerd.runtimes.runc]
  runtime_type = "{RUNC_SHIM}"
"""


def _in_netns(path: str) -> None:
    """Move the calling thread into the network namespace at `path` (setns(2))."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


@dataclass
class Node(Closing):
    name: str
    generation: Generation
    home: Path
    machine: sim.Machine
    process: subprocess.Popen[bytes] | None = None
    pid: int = 0  # the node's PID 1, as this machine numbers it
    cgroup: str = field(default_factory=lambda: f"gwnode-{uuid.uuid4().hex[:8]}")
    _net: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def start(
        cls, name: str, generation: Generation | None = None, machine: sim.Machine | None = None
    ) -> Node:
        """A running node: its containerd answers, the pause image is in."""
        home = Path(tempfile.mkdtemp(prefix="gwnode-", dir="/tmp"))
        node = cls(
            name, generation or containerds.system(), home, machine or sim.make_machine(gpus=4)
        )
        try:
            node._boot()
        except BaseException:
            node.close()
            raise
        return node

    def _boot(self) -> None:
        for d in ("upper", "work", "root", "containerd"):
            (self.home / d).mkdir()
        sim.write_node(self.home / "sim", self.machine)
        # the driver's MPS control program, run in the containers of gpuwire's image (the
        # device plugin's) on that image's Python
        mps_control.install(self.home / "sim", python=IMAGE_PYTHON)
        config = {
            "name": self.name,
            "root": str(self.home / "root"),
            "upper": str(self.home / "upper"),
            "work": str(self.home / "work"),
            "containerd_root": str(self.home / "containerd"),
            "sim": str(self.home / "sim"),
            "bin": str(self.generation.bin),
            "bridge": BRIDGE,
            "subnet": SUBNET,
            "gateway": GATEWAY,
            "log": str(self.home / "containerd.log"),
            "containerd_config": containerd_config(self.generation),
        }
        (self.home / "node.json").write_text(json.dumps(config, indent=1))
        with (self.home / "init.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "unshare",
                    "--pid",
                    "--mount",
                    "--net",
                    "--uts",
                    "--fork",
                    "--kill-child",
                    sys.executable,
                    "-m",
                    "testbed.nodeinit",
                    str(self.home / "node.json"),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        until(lambda: self._child() or self._exited(), 30)
        self.pid = self._child()
        until(lambda: self.path(READY).exists() or self._exited(), 60)
        until(lambda: self.ctr("version", check=False).returncode == 0 or self._exited(), 60)
        self.import_image(write_pause_tar(self.home / "pause.tar"))

    def _child(self) -> int:
        assert self.process is not None
        tasks = Path(f"/proc/{self.process.pid}/task")
        for task in tasks.glob("*/children") if tasks.exists() else ():
            children = task.read_text().split()
            if children:
                return int(children[0])
        return 0

    def _exited(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            log = (self.home / "init.log").read_text(errors="replace")[-3000:]
            raise LabError(f"node {self.name} exited {self.process.returncode}: {log}")
        return False

    # --- the node's files, commands and network

    @property
    def root(self) -> Path:
        return Path(f"/proc/{self.pid}/root")

    def path(self, node_path: str) -> Path:
        """Where node path `node_path` is seen from here."""
        return self.root / node_path.lstrip("/")

    @property
    def upper(self) -> Path:
        """The node's upper layer: every file the node changed or added since it started."""
        return self.home / "upper"

    def ctr(
        self, *args: str, check: bool = True, namespace: str = CRI_NAMESPACE, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        where = ["--address", str(self.path(SOCKET)), "--namespace", namespace]
        return run([str(self.generation.bin / "ctr"), *where, *args], check=check, timeout=timeout)

    def import_image(self, layout_tar: Path) -> None:
        """An OCI image-layout tar into containerd's CRI namespace (the node pulls nothing)."""
        self.ctr("images", "import", str(layout_tar))

    def systemctl(self, *words: str) -> tuple[int, str]:
        """Ask the node's systemd stand-in, as `systemctl` on the node does."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(self.path(CONTROL)))
            conn.sendall((" ".join(words) + "\n").encode())
            code, _, text = conn.makefile().read().partition(" ")
        return int(code), text.rstrip("\n")

    @property
    def containerd_restarts(self) -> int:
        """How often `systemctl restart containerd` ran on the node."""
        return int(self.systemctl("show-restarts", "containerd")[1])

    def kuberuntime(self, timeout: float = 60) -> KubeRuntime:
        """A kubelet's runtime manager on the node's CRI socket, its files under the node's
        /var/lib/kubelet and /var/log/pods, its pods' cgroups under this node's own."""
        return KubeRuntime(
            self.path(SOCKET), Path("/var/lib/kubelet"), f"/{self.cgroup}", timeout, root=self.root
        )

    def _netns(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._net is None:
            self._net = concurrent.futures.ThreadPoolExecutor(
                1, initializer=_in_netns, initargs=(f"/proc/{self.pid}/ns/net",)
            )
        return self._net

    def listen(self, host: str = GATEWAY, port: int = 0) -> socket.socket:
        """A listening TCP socket in the node's network (on the pods' gateway by default)."""

        def make() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(64)
            return sock

        return self._netns().submit(make).result()

    def connect(self, host: str, port: int, timeout: float) -> socket.socket:
        """A TCP connection from the node's network (to a pod's address)."""
        sock = self._netns().submit(socket.socket, socket.AF_INET, socket.SOCK_STREAM).result()
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """SIGTERM to the node's PID 1 (containerd stops), then the namespace ends: every
        process, mount and device of the node with it; cgroups and home by path."""
        if self._net is not None:
            self._net.shutdown(wait=False)
        if self.process is not None and self.process.poll() is None:
            if self.pid:
                os.kill(self.pid, 15)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove_cgroups(self.cgroup)
        remove_home(self.home)
