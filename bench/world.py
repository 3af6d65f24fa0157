"""The fault campaign's world (bench/faults.py): two simulated GPU nodes with every gpuwire part
running for real, each part a process that can be killed and started again.

- The API server stand-in (testbed/apiserver.py), reached by every gpuwire process through a
  TCP path that can be cut (testbed/partition.py); the campaign itself, as the control plane,
  reads and writes the store directly (so a cut isolates the nodes and the webhook).
- Two webhook replicas (`gpuwire webhook serve`, TLS), which admission reaches as a Service
  would: the first that answers.
- Node `gpu-a`: four A100s, the device plugin's node. Its node agent is `gpuwire device-plugin
  serve` (labels, holders, an MPS control daemon per GPU: the MPS stand-in of
  testbed/mps_control.py), registered with the kubelet stand-in (device manager and
  pod-resources); containerd (the system's) with gpuwire's handler its default.
- Node `gpu-b`: four H100s, GPU 0 in MIG mode (mig-parted's balanced layout), GPU 3 shared
  (consumable capacity, HAMi-core holding the shares): the DRA node. Its node agent is `gpuwire
  dra serve` (labels, holders), registered with the kubelet DRA stand-in; containerd (the
  newest here that applies CDI from CRI) with gpuwire's handler beside runc.
- One resident gpuwire serving both nodes' launchers.

The state directories a disk can fill are small tmpfs mounts: node A's agent state, node B's
plugin directory (checkpoint, health) and CDI spec directory. Everything lives under one
temporary directory and is stopped and removed by pid and by path (`close`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from certs import pki
from gpuwire import dra, mps, sim
from gpuwire.devices import Device
from scripts.demo.base import handlers_of, import_images
from testbed import containerds, dracluster, mps_control
from testbed.apiserver import ApiServer
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.host import LabError, run, stop
from testbed.kubelet import Kubelet
from testbed.kubelet_dra import DraKubelet
from testbed.kuberuntime import KubeRuntime
from testbed.lab import write_keys
from testbed.partition import Partition
from testbed.podresources import PodResourcesKubelet
from testbed.resident import Resident
from testbed.waiting import until
from testbed.webhook import WebhookProcess, serving

GPUWIRE = (sys.executable, "-m", "gpuwire.cli")
NODE_A, NODE_B = "gpu-a", "gpu-b"
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
SHARED_B = 3  # node B's shared GPU
MIG_B = 0  # node B's GPU in MIG mode
READY = "ready"  # the installer's ready file (deploy/node/install-node), in a node's dir
# The quiet period after which a GPU is healthy again (both agents): longer than a node
# agent takes to start again, so that a restart with a faulting GPU can be seen to keep it.
RECOVER_AFTER = 10.0
TMPFS = "size=2m,mode=0755"
ROOT = Path(__file__).resolve().parents[1]
RUNTIME_CLASS = ROOT / "deploy/base/runtimeclass.yaml"
POLICY = """
excludedNamespaces: [kube-system]
devicePlugin: true
defaults:
  capabilities: compute,utility
  limitProfile: hami
  runtimeClassName: gpuwire
  voidUnrequested: true
namespaces:
  - match: [dra]
    allocation: dra
  - match: [monitoring]
    allGpus: true
  - match: ["*"]
"""

Obj = dict[str, Any]


@dataclass
class Process:
    """One gpuwire process of the world, started again with the same argv after a kill."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is cleaned up."""
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def close(self) -> None:
        if self.popen is not None:
            stop(self.popen)


@dataclass
class Replica:
    """One webhook replica; `url` changes when it is started again (it takes a free port)."""

    args: list[str]
    stack: ExitStack = field(default_factory=ExitStack)
    served: WebhookProcess | None = None

    def start(self) -> None:
        # the bound only ends a hang: a loaded machine takes tens of seconds to import it
        self.served = self.stack.enter_context(serving(self.args, timeout=120.0))

    def kill(self) -> None:
        assert self.served is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.served.pid, signal.SIGKILL)
        self.stack.close()
        self.served = None

    @property
    def url(self) -> str:
        return self.served.url if self.served is not None else ""

    def close(self) -> None:
        self.stack.close()


@dataclass
class Node:
    name: str
    root: Path  # the simulated node
    devices: tuple[Device, ...]
    config: Path  # the node's gpuwire config (the runtime's GPUWIRE_CONFIG)
    records: Path
    allocations: Path
    agent: Process
    containerd: Containerd
    runtime: KubeRuntime
    handlers: dict[str, Any]
    default_handler: str
    tmpfs: tuple[Path, ...]  # the state and CDI directories a full disk is tried on


@dataclass
class World:
    workdir: Path
    api: ApiServer
    partition: Partition
    kubeconfig: Path
    keys: Path
    ca: Path
    replicas: list[Replica]
    resident_socket: str
    resident: Resident
    kubelet_a: Kubelet
    pod_resources_a: PodResourcesKubelet
    kubelet_b: DraKubelet
    a: Node
    b: Node
    stack: ExitStack

    @property
    def nodes(self) -> tuple[Node, Node]:
        return self.a, self.b

    def webhook(self, url: str) -> httpx.Client:
        return httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=self.ca),
                            timeout=5)  # fmt: skip

    def ready(self, replica: Replica) -> bool:
        """Whether the replica answers ready (its Node list read, the grant key loaded)."""
        if not replica.url:
            return False
        with contextlib.suppress(httpx.HTTPError), self.webhook(replica.url) as http:
            return http.get("/readyz").status_code == 200
        return False

    def restart_resident(self) -> None:
        """SIGKILL of the resident alone (its children finish their calls), then a new one."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.resident.process.pid, signal.SIGKILL)
        self.resident.process.wait()
        self.resident = Resident(self.resident_socket)
        self.stack.callback(self.resident.close)

    def mps_daemons(self) -> list[int]:
        """The pids of node A's MPS control daemons (the stand-in's `-f` processes)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if any(a.endswith(b"nvidia-cuda-mps-control") for a in argv) and b"-f" in argv:
                    environ = (proc / "environ").read_bytes()
                    if str(self.workdir).encode() in environ:
                        found.append(int(proc.name))
        return found

    def close(self) -> None:
        self.stack.close()


def newest_cdi() -> Generation:
    found = [g for g in containerds.generations().values() if g.cdi]
    system = containerds.system()
    if not isinstance(system, str) and system.cdi:
        found.append(system)
    if not found:
        raise LabError("no containerd 1.7 or 2.x here (make test fetches them)")
    return max(found, key=lambda g: g.series)


def mount_tmpfs(path: Path, stack: ExitStack) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    run(["mount", "-t", "tmpfs", "-o", TMPFS, "gpuwire-faults", str(path)])
    stack.callback(lambda: run(["umount", "--lazy", str(path)], check=False))
    return path


def node_config(workdir: Path, name: str, root: Path, keys: Path, mps_root: Path | None) -> Path:
    settings: dict[str, Path] = {
        "root": root,
        "grant-key-dir": keys,
        "allocation-dir": workdir / name / "allocations",
        "records-dir": workdir / name / "records",
        "log": workdir / name / "runtime.log",
        "hami-library": root / sim.HAMI_LIBRARY,
        "hami-dir": workdir / name / "hami",
        "mig-map": workdir / name / "mig-map",  # two nodes on one host: a map each
    }
    if mps_root is not None:
        settings["mps-root"] = mps_root
    config = workdir / name / "config.toml"
    config.write_text("".join(f"{k} = {json.dumps(str(v))}\n" for k, v in settings.items()))
    (workdir / name / READY).write_text("world\n")  # the node's runtime is installed
    return config


def start_containerd(
    workdir: Path, generation: Generation, config: Path, stack: ExitStack, *mode: str
) -> tuple[Containerd, KubeRuntime, dict[str, Any], str]:
    """A node's containerd, its images in; with `--cdi`, its CDI spec directory a tmpfs
    mounted before it starts (it watches the directory it finds)."""
    containerd = stack.enter_context(Containerd.create(cri=True, generation=generation))
    if "--cdi" in mode:
        mount_tmpfs(containerd.home / "cdi", stack)
    libexec = workdir / "libexec"
    configured = subprocess.run(
        [*GPUWIRE, "containerd", "configure", "--config", str(containerd.config),
         "--runtime-path", str(libexec / "gpuwire-runtime"), *mode,
         "--containerd", containerd.binary("containerd")],
        capture_output=True, text=True, env=generation.env(), check=False,
    )  # fmt: skip
    if configured.returncode != 0:
        raise LabError(f"containerd configure: {configured.stderr.strip()}")
    containerd.start(env={"GPUWIRE_CONFIG": str(config)})
    handlers, default = handlers_of(containerd.dump(), generation.config_version)
    import_images(containerd, workdir, f"{containerd.namespace}-")
    runtime = stack.enter_context(containerd.kuberuntime())
    return containerd, runtime, handlers, default


def agent_args(world_dir: Path, name: str, kubeconfig: Path) -> list[str]:
    """What both node agents are told alike; the installer's ready file (`node_config`) makes
    the agent label the node gpuwire.io/runtime-ready, which the shipped RuntimeClass schedules
    GPU pods on."""
    return [
        "--node", name, "--kubeconfig", str(kubeconfig),
        "--runtime-ready", str(world_dir / name / READY),
        "--labels", "--holders", "--holders-interval", "0.5",
        "--records-dir", str(world_dir / name / "records"),
        "--mig-map", str(world_dir / name / "mig-map"),
        "--recover-after", str(RECOVER_AFTER), "--log-level", "warning",
    ]  # fmt: skip


@contextlib.contextmanager
def built(replicas: int = 2) -> Iterator[World]:
    """The world, running; everything stopped and removed when the block ends."""
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gwfault-")))
        stack.callback(_unmount_under, workdir)
        keys = workdir / "keys"
        write_keys(keys)
        api = stack.enter_context(ApiServer())
        partition = stack.enter_context(Partition(int(api.url.rsplit(":", 1)[1])))
        kubeconfig = workdir / "kubeconfig"
        api.write_kubeconfig(kubeconfig)
        text = json.loads(kubeconfig.read_text())
        text["clusters"][0]["cluster"]["server"] = partition.url
        kubeconfig.write_text(json.dumps(text))  # the nodes and the webhook: through the path
        for runtime_class in yaml.safe_load_all(RUNTIME_CLASS.read_text()):
            api.put(runtime_class)
        for namespace in ("plugin", "dra", "monitoring"):
            api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for device_class in dracluster.device_classes():
            api.put(device_class)
        socket = str(workdir / "resident.sock")
        libexec = workdir / "libexec"
        run([sys.executable, "-I", "-m", "runtime_hook.setup.launcher", "--socket", socket,
             str(libexec)])  # fmt: skip
        resident = Resident(socket)
        stack.callback(resident.close)
        a = node_a(workdir, keys, kubeconfig, api, stack)
        kubelet_a, pod_resources_a = a[1], a[2]
        b, kubelet_b = node_b(workdir, keys, kubeconfig, api, stack)
        tls = workdir / "tls"
        run([*GPUWIRE, "certs", "generate", "--out", str(tls), "--host", "127.0.0.1"])
        ca = tls / pki.CA_FILE
        policy = workdir / "policy.yaml"
        policy.write_text(POLICY)
        args = ["--tls-cert", str(tls / pki.CERT_FILE), "--tls-key", str(tls / pki.KEY_FILE),
                "--grant-key-dir", str(keys), "--policy", str(policy), "--kubeconfig",
                str(kubeconfig), "--lease-namespace", "default"]  # fmt: skip
        webhooks = []
        for _ in range(replicas):
            replica = Replica(args)
            replica.start()
            stack.callback(replica.close)
            webhooks.append(replica)
        world = World(workdir, api, partition, kubeconfig, keys, ca, webhooks, socket, resident,
                      kubelet_a, pod_resources_a, kubelet_b, a[0], b, stack)  # fmt: skip
        until(lambda: all(world.ready(r) for r in webhooks), timeout=60)
        yield world


def node_a(
    workdir: Path, keys: Path, kubeconfig: Path, api: ApiServer, stack: ExitStack
) -> tuple[Node, Kubelet, PodResourcesKubelet]:
    here = workdir / NODE_A
    root = here / "node"
    machine = sim.make_machine(gpus=4, products=(A100,), seed=NODE_A)
    sim.write_node(root, machine)
    mps_control.install(root)
    mps_root = here / "mps"
    config = node_config(workdir, NODE_A, root, keys, mps_root)
    api.put(_node(NODE_A))
    kubelet = stack.enter_context(Kubelet(here / "kubelet"))
    pod_resources = stack.enter_context(PodResourcesKubelet(here / "pod-resources.sock", kubelet))
    state = mount_tmpfs(here / "state", stack)
    containerd, runtime, handlers, default = start_containerd(
        workdir, _system(), config, stack, "--set-default"
    )
    argv = [
        *GPUWIRE, "device-plugin", "serve", "--sim", str(root),
        "--kubelet-dir", str(kubelet.directory),
        "--allocation-dir", str(here / "allocations"), "--grant-key-dir", str(keys),
        "--pod-resources-socket", str(pod_resources.socket), "--mps-root", str(mps_root),
        "--hami-library", str(root / sim.HAMI_LIBRARY), "--state-dir", str(state),
        "--sweep-interval", "1", "--sweep-grace", "2", "--label-interval", "5",
        *agent_args(workdir, NODE_A, kubeconfig),
    ]  # fmt: skip
    agent = Process("node A's agent", argv, here / "agent.log")
    agent.start()
    stack.callback(agent.close)
    node = Node(NODE_A, root, machine.devices, config, here / "records", here / "allocations",
                agent, containerd, runtime, handlers, default, (state,))  # fmt: skip
    until(lambda: "nvidia.com/gpu" in kubelet.plugins, timeout=60)
    daemons = str(mps_root)
    until(lambda: all(mps.ready(daemons, d.uuid) for d in machine.devices), timeout=60)
    return node, kubelet, pod_resources


def node_b(
    workdir: Path, keys: Path, kubeconfig: Path, api: ApiServer, stack: ExitStack
) -> tuple[Node, DraKubelet]:
    here = workdir / NODE_B
    root = here / "node"
    machine = sim.make_machine(gpus=4, products=(H100,), seed=NODE_B)
    machine = sim.with_mig(machine, MIG_B, ("balanced",))
    sim.write_node(root, machine)
    config = node_config(workdir, NODE_B, root, keys, None)
    api.put(_node(NODE_B))
    kubelet = stack.enter_context(DraKubelet(here / "kubelet", NODE_B, api=api.client()))
    plugin_dir = mount_tmpfs(here / "kubelet" / "plugins" / dra.DRIVER, stack)
    containerd, runtime, handlers, default = start_containerd(
        workdir, newest_cdi(), config, stack, "--cdi"
    )
    cdi_dir = containerd.home / "cdi"
    settings = here / "dra.yaml"
    shared = machine.devices[SHARED_B].uuid
    settings.write_text(json.dumps({"hami": {"library": str(root / sim.HAMI_LIBRARY)},
                                    "dra": {"sharedGpus": [shared]}}))  # fmt: skip
    argv = [
        *GPUWIRE, "dra", "serve", "--config", str(settings), "--sim", str(root),
        "--kubelet-root", str(kubelet.root), "--cdi-dir", str(cdi_dir),
        "--hook", str(workdir / "libexec" / "gpuwire-hook"),
        "--allocation-dir", str(here / "allocations"), "--grant-key-dir", str(keys),
        "--pod-resources-socket", str(here / "no-pod-resources.sock"),
        *agent_args(workdir, NODE_B, kubeconfig),
    ]  # fmt: skip
    agent = Process("node B's agent", argv, here / "agent.log")
    agent.start()
    stack.callback(agent.close)
    node = Node(NODE_B, root, machine.devices, config, here / "records", here / "allocations",
                agent, containerd, runtime, handlers, default, (plugin_dir, cdi_dir))  # fmt: skip
    kubelet.wait_registered(dra.DRIVER, timeout=60)
    until(lambda: any(s["spec"]["nodeName"] == NODE_B for s in api.objects("resourceslices")),
          timeout=60)  # fmt: skip
    return node, kubelet


def _system() -> Generation:
    found = containerds.system()
    if isinstance(found, str):
        raise LabError(found)
    return found


def _node(name: str) -> Obj:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "nvidia.com/gpu.present": "true"}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}  # fmt: skip


def _unmount_under(workdir: Path) -> None:
    """Any mount left under the world's directory (a failed start)."""
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point.startswith(f"{workdir}/"):
            run(["umount", "--lazy", point], check=False)


def labelled(api: ApiServer, node: str) -> Mapping[str, str]:
    found = api.get("nodes", node) or {}
    return dict((found.get("metadata") or {}).get("annotations") or {})
