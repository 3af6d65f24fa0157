"""The demo's one-node cluster: everything `make demo` starts, and how it all goes away.

In order: a simulated GPU node (`gpuwire sim node`: 4 A100s, NVLink pairs 0-1 and 2-3) with
the node's gpuwire config and a grant key; a kube-apiserver stand-in holding the Node and the
RuntimeClass; the device plugin (`gpuwire device-plugin serve --sim`) registered with a
kubelet stand-in over real unix sockets, labelling the Node; the webhook (`gpuwire webhook
serve`) over TLS with certificates from `gpuwire certs generate`, watching the Nodes; and, as
root, a private containerd configured by `gpuwire containerd configure --set-default`, with
the demo's images, and the kubelet's runtime manager on its CRI socket
(testbed/kuberuntime.py): the system's containerd, or with GPUWIRE_DEMO_CONTAINERD=trixie|sid
Debian's 1.7 or 2.x (testbed/containerds.py, fetched by `make demo`). The plugin also runs
the node agent's holders job (who holds which GPU, from the shim's container records and the
kubelet's pod-resources API), for the inventory.
The stand-ins are the testbed's (testbed/apiserver.py, testbed/kubelet.py,
testbed/podresources.py): a kube-apiserver and a kubelet are what cannot run here. A second
node, for DRA, joins later (scripts/demo/dra.py), its parts on the same ExitStack.

`up` stops everything in reverse order, by pid and by path, whether the block ends, fails or
is interrupted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from certs import pki
from certs.grantkey import key_id
from deviceplugin.agent.labels import GPUS_ANNOTATION
from gpuwire import mps, nvidia, sim
from gpuwire.devices import Device
from scripts.demo.base import (
    GPUWIRE,
    NVIDIA_IMAGES,
    ROOT,
    Handler,
    Host,
    Step,
    handlers_of,
    import_images,
    run,
    until,
)
from testbed import containerds, mps_control
from testbed.apiserver import ApiServer
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.host import LabError, stop
from testbed.kubelet import Kubelet
from testbed.kuberuntime import KubeRuntime
from testbed.podresources import PodResourcesKubelet
from testbed.resident import Resident, command
from testbed.webhook import serving

POLICY = ROOT / "examples/policy.yaml"
RUNTIME_CLASS = ROOT / "deploy/base/runtimeclass.yaml"
NODE = "gpu-node-0"
POD_RESOURCES = "pod-resources/kubelet.sock"  # under the work dir, as under /var/lib/kubelet
# The installer's ready file (deploy/node/install-node): the demo's node has gpuwire's runtime
# before any GPU pod starts, so the device plugin labels it runtime-ready from the start.
READY = "ready"
RESOURCE = nvidia.RESOURCE


@dataclass
class Cluster:
    workdir: Path
    devices: tuple[Device, ...]
    api: ApiServer
    kubeconfig: Path
    kubelet: Kubelet
    pod_resources: PodResourcesKubelet
    webhook_url: str
    ca: Path
    node_config: Path  # the node's gpuwire config (GPUWIRE_CONFIG of the shim)
    runtime_log: Path  # where the shim writes one line per decision
    containerd: Containerd | None = None
    runtime: KubeRuntime | None = None  # the kubelet's runtime manager, over CRI
    handlers: dict[str, Handler] = field(default_factory=dict)
    default_handler: str = ""
    no_containers: str = ""  # why containers do not run, when they do not
    steps: list[Step] = field(default_factory=list)
    stack: ExitStack = field(default_factory=ExitStack)  # what stops it all: up()'s
    places: dict[str, str] = field(default_factory=dict)  # more paths the commands name

    def webhook(self) -> httpx.Client:
        """A client that trusts the webhook's CA, as the API server's caBundle does."""
        return webhook_client(self.webhook_url, self.ca)

    def host(self) -> Host:
        """The first node's kubelet side."""
        return Host(self.kubelet, self.pod_resources, self.runtime, self.handlers,
                    self.default_handler)  # fmt: skip

    def node(self) -> dict[str, Any]:
        node = self.api.get("nodes", NODE)
        assert node is not None, f"node {NODE} is gone from the API server"
        return node


def webhook_client(url: str, ca: Path) -> httpx.Client:
    return httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca))


def generation() -> Generation | str:
    """The containerd the demo runs (GPUWIRE_DEMO_CONTAINERD names a Debian suite; the
    system's by default), or why there is none."""
    suite = os.environ.get("GPUWIRE_DEMO_CONTAINERD", "")
    if not suite:
        return containerds.system()
    found = containerds.generations().get(suite)
    if found is None:
        accepted = ", ".join(containerds.SUITES)
        return f"GPUWIRE_DEMO_CONTAINERD={suite}: no such containerd here (accepted: {accepted})"
    return found


def containers_unavailable(chosen: Generation | str) -> str:
    """Why this machine cannot run the demo's containers, or "" when it can."""
    if os.geteuid() != 0:
        return "not root: containerd runs containers only as root; `sudo make demo` runs them"
    if isinstance(chosen, str):
        return chosen
    missing = [b for b in ("containerd", "ctr") if not (chosen.bin / b).exists()]
    missing += ["runc"] if shutil.which("runc") is None else []
    if missing:
        return f"{', '.join(missing)} not installed (`make demo` installs them as root)"
    return ""


def write_node_files(workdir: Path, steps: list[Step]) -> tuple[Path, Path]:
    """The simulated node, a grant key as the node agent installs it, and the node's gpuwire
    config; returns the config and the runtime log paths."""
    run(steps, "a simulated GPU node", [GPUWIRE, "sim", "node", str(workdir / "node")])
    mps_control.install(workdir / "node")  # the driver's MPS control program: the stand-in
    keys = workdir / "keys"
    keys.mkdir(mode=0o700)
    key = keys / key_id(dt.datetime.now(dt.UTC))
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    log = workdir / "gpuwire.log"
    settings = {
        "root": workdir / "node",
        "grant-key-dir": keys,
        "allocation-dir": workdir / "allocations",
        "records-dir": workdir / "records",
        "log": log,
        "mps-root": workdir / "mps",  # the device plugin's MPS control daemons
        "hami-library": workdir / "node" / sim.HAMI_LIBRARY,
        "hami-dir": workdir / "hami",
    }
    config = workdir / "config.toml"
    config.write_text("".join(f"{k} = {json.dumps(str(v))}\n" for k, v in settings.items()))
    (workdir / READY).write_text("demo\n")
    return config, log


def register_node(api: ApiServer) -> None:
    """What the kubelet and an admin put in the API server: the Node and the RuntimeClass."""
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {
                    # what Node Feature Discovery (or the admin) marks GPU nodes with, so
                    # that gpuwire's DaemonSets and RuntimeClass land there (docs/install.md)
                    "nvidia.com/gpu.present": "true",
                    "kubernetes.io/hostname": NODE,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
        }
    )
    for runtime_class in yaml.safe_load_all(RUNTIME_CLASS.read_text()):
        api.put(runtime_class)


@contextmanager
def device_plugin(
    workdir: Path, kubeconfig: Path, steps: list[Step]
) -> Iterator[Callable[[], bool]]:
    """`gpuwire device-plugin serve` on the simulated node, labelling the Node and keeping
    its holders annotation, until the block ends (then SIGTERM: it removes its sockets).
    Yields a check that it still runs (LabError with its log when it does not)."""
    argv = [
        GPUWIRE, "device-plugin", "serve",
        "--sim", str(workdir / "node"),
        "--kubelet-dir", str(workdir / "kubelet"),
        "--allocation-dir", str(workdir / "allocations"),
        "--grant-key-dir", str(workdir / "keys"),
        "--labels", "--node", NODE, "--kubeconfig", str(kubeconfig),
        "--runtime-ready", str(workdir / READY),
        "--holders", "--holders-interval", "0.5",
        "--records-dir", str(workdir / "records"),
        "--pod-resources-socket", str(workdir / POD_RESOURCES),
        "--mps-root", str(workdir / "mps"),
        "--hami-library", str(workdir / "node" / sim.HAMI_LIBRARY),
        "--log-level", "WARNING",
    ]  # fmt: skip
    with serving_plugin("the device plugin", argv, workdir / "device-plugin.log", steps) as runs:
        yield runs


@contextmanager
def serving_plugin(
    what: str, argv: list[str], log: Path, steps: list[Step]
) -> Iterator[Callable[[], bool]]:
    """`argv` (a device plugin) running, its output in `log`, until the block ends (then
    SIGTERM); yields a check that it still runs (LabError with its log when it does not)."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    steps.append(Step(what, tuple(argv)))

    def running() -> bool:
        if process.poll() is not None:
            raise LabError(f"{what} exited {process.returncode}: {log.read_text()}")
        return True

    try:
        yield running
    finally:
        stop(process)


def report_capacity(
    api: ApiServer, kubelet: Kubelet, name: str = NODE, resource: str = RESOURCE
) -> None:
    """What the kubelet does with a plugin's device list: capacity and allocatable on the Node."""
    plugin = kubelet.plugin(resource)
    node = api.get("nodes", name)
    assert node is not None
    status = node.setdefault("status", {})
    status["capacity"] = {**status.get("capacity", {}), resource: str(plugin.capacity)}
    status["allocatable"] = {**status.get("allocatable", {}), resource: str(plugin.allocatable)}
    api.put(node)


def start_webhook(
    workdir: Path, kubeconfig: Path, steps: list[Step], stack: ExitStack
) -> tuple[str, Path]:
    """Certificates, then `gpuwire webhook serve` watching the Nodes; its URL and CA, once
    it is ready (the Node list read, the grant key loaded)."""
    tls = workdir / "tls"
    generate = [GPUWIRE, "certs", "generate", "--out", str(tls), "--host", "127.0.0.1"]
    run(steps, "the webhook's certificates", generate)
    args = [
        "--tls-cert", str(tls / pki.CERT_FILE), "--tls-key", str(tls / pki.KEY_FILE),
        "--grant-key-dir", str(workdir / "keys"), "--policy", str(POLICY),
        "--kubeconfig", str(kubeconfig), "--lease-namespace", "default",
    ]  # fmt: skip
    served = stack.enter_context(serving(args))
    steps.append(Step("the webhook", (GPUWIRE, "webhook", "serve", "--port", "0", *args)))
    with webhook_client(served.url, tls / pki.CA_FILE) as http:
        until(lambda: http.get("/readyz").status_code == 200, "the webhook to be ready")
    return served.url, tls / pki.CA_FILE


def start_containerd(cluster: Cluster, stack: ExitStack, generation: Generation) -> None:
    """A private containerd with the gpuwire handler as its default runtime (as the nvidia
    runtime is on many GPU nodes), so that every container, asked-for or not, meets the shim:
    the launcher, served by a resident gpuwire, as on a node the installer set up."""
    libexec, socket = cluster.workdir / "libexec", str(cluster.workdir / "resident.sock")
    install = ["-I", "-m", "runtime_hook.setup.launcher", "--socket", socket, str(libexec)]
    run(cluster.steps, "the launchers and gpuwire-call", [sys.executable, *install])
    stack.enter_context(Resident(socket))
    cluster.steps.append(Step("the resident gpuwire", tuple(command(sys.executable, socket))))
    containerd = node_containerd(cluster, stack, generation, cluster.node_config)
    cluster.handlers, cluster.default_handler = handlers_of(
        containerd.dump(), generation.config_version
    )
    cluster.containerd = containerd
    cluster.runtime = stack.enter_context(containerd.kuberuntime())


def node_containerd(
    cluster: Cluster,
    stack: ExitStack,
    generation: Generation,
    config: Path,
    prefix: str = "",
    images: Sequence[str] = NVIDIA_IMAGES,
) -> Containerd:
    """A node's private containerd, gpuwire's handler (the launchers start_containerd
    installed) its default, started with the node's gpuwire config `config`, with the
    demo's `images`."""
    containerd = stack.enter_context(Containerd.create(cri=True, generation=generation))
    libexec = cluster.workdir / "libexec"
    configure = [GPUWIRE, "containerd", "configure", "--config", str(containerd.config)]
    runtime = ["--runtime-path", str(libexec / "gpuwire-runtime"), "--set-default"]
    which = ["--containerd", containerd.binary("containerd")]
    run(cluster.steps, f"the gpuwire handler in {prefix}containerd", [*configure, *runtime, *which],
        env=generation.env())  # fmt: skip
    containerd.start(env={"GPUWIRE_CONFIG": str(config)})
    started = (containerd.binary("containerd"), "--config", str(containerd.config))
    cluster.steps.append(Step(f"{prefix}containerd", (f"GPUWIRE_CONFIG={config}", *started)))
    import_images(containerd, cluster.workdir, prefix, images)
    return containerd


@contextmanager
def up() -> Iterator[Cluster]:
    """The whole cluster, torn down when the block ends, fails or is interrupted."""
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuwire-demo-")))
        steps: list[Step] = []
        node_config, runtime_log = write_node_files(workdir, steps)
        api = stack.enter_context(ApiServer())
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        register_node(api)
        kubelet = stack.enter_context(Kubelet(workdir / "kubelet"))
        pod_resources = stack.enter_context(PodResourcesKubelet(workdir / POD_RESOURCES, kubelet))
        plugin_runs = stack.enter_context(device_plugin(workdir, kubeconfig, steps))

        def labelled() -> bool:
            node = api.get("nodes", NODE) or {"metadata": {}}
            return GPUS_ANNOTATION in node["metadata"].get("annotations", {})

        until(lambda: plugin_runs() and RESOURCE in kubelet.plugins, "the plugin to register")
        until(lambda: plugin_runs() and labelled(), "the device plugin to label the node")
        gpus = sim.load_machine(workdir / "node").devices
        daemons = str(workdir / "mps")
        until(lambda: all(mps.ready(daemons, g.uuid) for g in gpus), "its MPS control daemons")
        report_capacity(api, kubelet)
        url, ca = start_webhook(workdir, kubeconfig, steps, stack)
        cluster = Cluster(
            workdir,
            sim.load_machine(workdir / "node").devices,
            api,
            kubeconfig,
            kubelet,
            pod_resources,
            url,
            ca,
            node_config,
            runtime_log,
            steps=steps,
            stack=stack,
        )
        chosen = generation()
        cluster.no_containers = containers_unavailable(chosen)
        if not cluster.no_containers:
            assert not isinstance(chosen, str)
            start_containerd(cluster, stack, chosen)
        yield cluster
