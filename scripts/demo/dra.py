"""The demo's second node, which joins after the device-plugin scenes: its GPUs published for
DRA, which the scheduler allocates itself.

`gpuwire dra serve` on a simulated node of four H100s (NVLink pairs 0-1 and 2-3; GPU 3
shared, its memory and cores handed out in shares, HAMi-core holding them) publishes them as
ResourceSlices and prepares the claims the scheduler allocated there as CDI specs, registered
with the kubelet DRA stand-in (testbed/kubelet_dra.py); the Node carries the GPU list the node
agent would write (`gpuwire.io/gpus`, which the inventory reads), and the DeviceClasses of
`deploy/overlays/dra` are in the API server. The webhook's watch takes in the new slices.
As root, its containers run on a containerd of its own that applies CDI from CRI (1.7 or
2.x: the newest the testbed has), configured by `gpuwire containerd configure --cdi`
(gpuwire's handler beside runc, the default: the DRA pods name it by the RuntimeClass the
webhook gives them), its CDI spec dir the one the plugin writes. The plugin signs each
claim's token with the node's grant keys into its allocation dir, and the gpuwire runtime
takes it as the container's proof (docs/dra.md).

`run_pod` is the kubelet's part for a pod bound to it: NodePrepareResources for the pod's
claims (the DRA manager), then each container with its claims' CDI ids in CRI's
`CDI_devices` (the runtime manager).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpuwire import sim
from gpuwire.devices import Device
from gpuwire.dra import DRIVER
from scripts.demo.base import GPUWIRE, Handler, Step, handlers_of, import_images, run, until
from scripts.demo.cluster import Cluster
from scripts.demo.controlplane import review
from scripts.demo.kubelet import Started, handler_for, start
from testbed import containerds, dracluster
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.host import LabError, stop
from testbed.kubelet_dra import DraKubelet, KubeletError
from testbed.kuberuntime import CRIError, KubeRuntime, Sandbox

NODE = "gpu-node-dra"
PRODUCT = "NVIDIA H100 80GB HBM3"
SHARED = 3  # the GPU its config shares
Obj = dict[str, Any]


@dataclass
class DraNode:
    root: Path  # the simulated node
    devices: tuple[Device, ...]
    kubelet: DraKubelet
    cdi_dir: Path  # where the plugin writes claims' CDI specs
    log: Path  # the plugin's
    containerd: Containerd | None = None
    runtime: KubeRuntime | None = None
    handlers: dict[str, Handler] = field(default_factory=dict)
    default_handler: str = ""
    no_containers: str = ""  # why its containers do not run, when they do not

    @property
    def shared(self) -> Device:
        return self.devices[SHARED]


def newest_cdi() -> Generation | str:
    """The newest containerd generation here that applies CDI from CRI, or why there is none."""
    found = [g for g in containerds.generations().values() if g.cdi]
    system = containerds.system()
    if not isinstance(system, str) and system.cdi:
        found.append(system)
    if not found:
        return "no containerd 1.7 or 2.x here (`make demo` fetches Debian's into .cache/containerd)"
    return max(found, key=lambda g: g.series)


def _containerd(cluster: Cluster) -> Generation | str:
    if cluster.no_containers:
        return cluster.no_containers
    return newest_cdi()


def join(cluster: Cluster, first_pod: Obj) -> DraNode:
    """The DRA node in the cluster, its slices published and seen by the webhook (a dry-run
    review of `first_pod` is admitted), its containerd started where one can run; everything
    stopped when the cluster goes."""
    workdir, steps, stack = cluster.workdir, cluster.steps, cluster.stack
    root = workdir / "dra-node"
    run(steps, "a simulated H100 node for DRA",
        [GPUWIRE, "sim", "node", str(root), "--product", PRODUCT, "--seed", NODE])  # fmt: skip
    machine = sim.load_machine(root)
    cluster.api.put(dracluster.DraNode(NODE, machine).node())
    for device_class in dracluster.device_classes():
        cluster.api.put(device_class)
    namespace = first_pod["metadata"]["namespace"]  # the DRA scenes' namespace, as an admin made it
    cluster.api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    chosen = _containerd(cluster)
    containerd = None
    if isinstance(chosen, Generation):
        containerd = stack.enter_context(Containerd.create(cri=True, generation=chosen))
    cdi_dir = containerd.home / "cdi" if containerd else workdir / "dra-cdi"
    cdi_dir.mkdir(parents=True, exist_ok=True)
    kubelet = stack.enter_context(DraKubelet(workdir / "dra-kubelet", NODE))
    node = DraNode(root, machine.devices, kubelet, cdi_dir, workdir / "dra-plugin.log")
    node.no_containers = chosen if isinstance(chosen, str) else ""
    serve(cluster, node, stack)
    if containerd is not None:
        assert isinstance(chosen, Generation)
        start_containerd(cluster, node, containerd, chosen, stack)
    with cluster.webhook() as http:

        def sees_slices() -> bool:
            return review(cluster, first_pod, dry_run=True, http=http).allowed

        until(sees_slices, "the webhook to see the DRA node's slices", 15)
    return node


def serve(cluster: Cluster, node: DraNode, stack: ExitStack) -> None:
    """`gpuwire dra serve` on the node, until its slices are in the API server."""
    config = cluster.workdir / "dra-plugin.yaml"
    library = str(node.root / sim.HAMI_LIBRARY)
    settings = {"hami": {"library": library}, "dra": {"sharedGpus": [node.shared.uuid]}}
    config.write_text(json.dumps(settings))
    argv = [
        GPUWIRE, "dra", "serve", "--config", str(config), "--sim", str(node.root),
        "--kubelet-root", str(node.kubelet.root), "--cdi-dir", str(node.cdi_dir),
        "--hook", str(cluster.workdir / "libexec/gpuwire-hook"),
        # the claims' tokens where the node's runtime reads them, MAC'd with its grant keys
        "--allocation-dir", str(cluster.workdir / "allocations"),
        "--grant-key-dir", str(cluster.workdir / "keys"),
        "--node", NODE, "--kubeconfig", str(cluster.kubeconfig), "--log-level", "WARNING",
    ]  # fmt: skip
    with node.log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    stack.callback(stop, process)
    cluster.steps.append(Step("the DRA plugin", tuple(argv)))

    def published() -> bool:
        if process.poll() is not None:
            raise LabError(f"the DRA plugin exited {process.returncode}: {node.log.read_text()}")
        return any(s["spec"].get("nodeName") == NODE for s in cluster.api.objects("resourceslices"))

    node.kubelet.wait_registered(DRIVER, timeout=30)
    until(published, "the DRA node's ResourceSlices")


def runtime_config(cluster: Cluster, node: DraNode) -> Path:
    """The gpuwire config of this node's runtime: the first node's (keys, allocation dir, log),
    with this node's root, whose GPUs the claims' specs name, and its own records."""
    own = {"root": node.root, "records-dir": cluster.workdir / "dra-records"}
    lines = cluster.node_config.read_text().splitlines()
    keys = [line.partition(" = ")[0] for line in lines]
    text = "".join(
        f"{k} = {json.dumps(str(own[k]))}\n" if k in own else f"{line}\n"
        for k, line in zip(keys, lines, strict=True)
    )
    config = cluster.workdir / "dra-config.toml"
    config.write_text(text)
    return config


def start_containerd(
    cluster: Cluster, node: DraNode, containerd: Containerd, chosen: Generation, stack: ExitStack
) -> None:
    """Its containerd, CDI from CRI on and the gpuwire handler beside runc, its default (the
    DRA pods reach gpuwire's runtime by the RuntimeClass the webhook gives them), with the
    demo's images and the kubelet's runtime manager on its CRI socket."""
    libexec = cluster.workdir / "libexec"
    configure = [GPUWIRE, "containerd", "configure", "--config", str(containerd.config)]
    runtime = ["--runtime-path", str(libexec / "gpuwire-runtime"), "--cdi"]
    which = ["--containerd", containerd.binary("containerd")]
    run(cluster.steps, "the DRA node's containerd: the gpuwire handler, CDI on",
        [*configure, *runtime, *which], env=chosen.env())  # fmt: skip
    config = runtime_config(cluster, node)
    containerd.start(env={"GPUWIRE_CONFIG": str(config)})
    started = (containerd.binary("containerd"), "--config", str(containerd.config))
    cluster.steps.append(Step("its containerd", (f"GPUWIRE_CONFIG={config}", *started)))
    node.handlers, node.default_handler = handlers_of(containerd.dump(), chosen.config_version)
    import_images(containerd, cluster.workdir, "dra-")
    cluster.places[str(containerd.home)] = "$DRA_CTD"
    node.containerd = containerd
    node.runtime = stack.enter_context(containerd.kuberuntime())


# --- the kubelet's part


@dataclass(frozen=True)
class Prepared:
    """A pod's claim as the kubelet's DRA manager prepared it."""

    entry: str  # the pod's spec.resourceClaims entry
    claim: Obj  # as stored, allocated
    cdi_ids: tuple[str, ...]
    error: str = ""


def claims_of(cluster: Cluster, pod: Obj) -> list[tuple[str, Obj]]:
    """(entry, claim) for each of the pod's claims, as the resourceclaim controller made them."""
    namespace = pod["metadata"]["namespace"]
    out = []
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        claim = cluster.api.get("resourceclaims", status["resourceClaimName"], namespace)
        if claim is not None:
            out.append((status["name"], claim))
    return out


def prepare(cluster: Cluster, node: DraNode, pod: Obj) -> list[Prepared]:
    """NodePrepareResources for the pod's claims, one call to the driver."""
    found = claims_of(cluster, pod)
    refs = [(c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"])
            for _, c in found]  # fmt: skip
    try:
        answers = node.kubelet.prepare(DRIVER, refs)
    except (KubeletError, grpc.RpcError) as exc:
        return [Prepared(entry, claim, (), str(exc)) for entry, claim in found]
    out = []
    for (entry, claim), (_, _, uid) in zip(found, refs, strict=True):
        answer = answers.get(uid)
        error = answer.error if answer is not None else "no answer"
        out.append(Prepared(entry, claim, tuple(node.kubelet.cdi_ids(uid)), error))
    return out


def run_pod(cluster: Cluster, node: DraNode, pod: Obj) -> tuple[Started, ...]:
    """Run a pod bound to the DRA node: its claims prepared, then its containers, each with
    the CDI ids of the claims it uses; the pod's phase goes to the API server."""
    prepared = prepare(cluster, node, pod)
    by_entry = {p.entry: p for p in prepared}
    started: list[Started] = []
    sandbox: Sandbox | str | None = None
    for spec in pod["spec"]["containers"]:
        name = spec["name"]
        uses = [by_entry[c["name"]] for c in (spec.get("resources") or {}).get("claims") or ()
                if c["name"] in by_entry]  # fmt: skip
        ids = tuple(i for p in uses for i in p.cdi_ids)
        failed = [p.error for p in uses if p.error]
        if failed:
            started.append(Started(name, (), None, error=f"NodePrepareResources: {failed[0]}"))
            continue
        if node.runtime is None:
            error = f"not run: {node.no_containers}"
            started.append(Started(name, (), None, error=error, cdi_ids=ids))
            continue
        try:
            handler, named = handler_for(cluster.api, node.handlers, node.default_handler, pod)
        except KeyError as exc:
            started.append(Started(name, (), None, error=str(exc.args[0]), cdi_ids=ids))
            continue
        if sandbox is None:
            try:
                sandbox = node.runtime.run_sandbox(pod, named)
            except CRIError as exc:
                sandbox = f"RunPodSandbox: {exc}"
        if isinstance(sandbox, str):
            started.append(Started(name, (), handler, error=sandbox, cdi_ids=ids))
            continue
        started.append(
            start(node.runtime, cluster.runtime_log, sandbox, pod, spec, (), handler, ids)
        )
    if node.runtime is not None:
        phase = "Running" if all(s.running for s in started) else "Failed"
        pod["status"] = {**pod.get("status", {}), "phase": phase}
        cluster.api.put(pod)
    return tuple(started)


def allocated(claims: Sequence[Obj]) -> list[str]:
    """The devices the claims were allocated, by name (`gpu-<minor>`)."""
    return [
        r["device"]
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", ())
    ]
