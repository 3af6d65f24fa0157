"""The fault campaign: pods starting and stopping on two GPU nodes for a set time while faults
are injected at random (seeded) times, and invariants checked throughout and at the end.

    sudo .venv/bin/python -m bench.faults [--seconds 75] [--seed 1] [--workers 3] [--rounds 1]
                                          [--overlap]

The world is bench/world.py's: every gpuwire process real (both node agents, the resident,
two webhook replicas), containerd over CRI, the kubelet and API server stand-ins. The
workload: pods of six kinds, each admitted by the webhook, scheduled (the DRA ones by the
scheduler stand-in's allocator), started by the kubelet's part (Allocate, or
NodePrepareResources, then CRI), held a while and deleted: a whole GPU from the device plugin;
a GPU with an MPS memory limit (joined to its MPS control daemon); a plugin-less pod that
takes every GPU of the node (a grant, daemonset-style); a DRA claim of a whole H100; a DRA
share of the shared H100 (consumable capacity, HAMi-core); a DRA MIG device; each worker
takes the kinds in rounds, each once per round in a random order. A step that
fails because a part is away is tried again for a while, as the kubelet's sync loop does;
a pod then ends Running or with the error it met.

Faults, each kind once per round at a random time (`--rounds` for more; `--overlap`: each
pair of `OVERLAPS` too, its two at once): SIGKILL and restart of node A's agent while an
Allocate is in flight (the device plugin) and while an MPS pod holds its daemon's GPU (the
node agent: labels, daemons, holders), of node B's agent while a NodePrepareResources is in
flight (the DRA plugin), each of these three while one of the node's GPUs is faulting (XIDs
until the kill); of the resident, of one webhook replica;
containerd restarted (killed, started on the same state); the kubelet stand-ins restarted
(re-registration, re-prepare); the API server unreachable from the nodes and the webhook
for 10 s; ENOSPC on the agents' state and CDI directories for 5 s; an XID storm on one GPU;
a GPU falling off the bus (gone from the driver, XID 79) for 6 s.

Invariants:
- no GPU or MIG device held by two exclusive holders at once, and no share beyond the
  shared GPU's memory;
- no container sees a device it was not allocated or granted: the GPUs `nvidia-smi -L` lists,
  and the `/dev/nvidia<minor>` and `/dev/nvidia-caps/nvidia-cap<minor>` files it has, against
  those of the Allocate answer's devices, the claim's allocation, or the grant;
- every pod ends Running with what it asked for, or with an error, in bounded time;
- after a fault, health converges to the truth within a bound (`--health-within`, 5 s): an
  XID'd or lost GPU unhealthy (ListAndWatch, the slice's taint), a recovered one healthy
  again after the quiet period; a process that holds health, killed while a GPU faulted,
  publishes it unhealthy first when started again (`HOLDING`) where its quiet period is not
  over, and healthy once it is;
- at the end, nothing leaked: no container record, claim CDI spec, prepared claim, claim or
  allocation token, extra MPS daemon, CRI sandbox, resident child, or mount is left.

It prints the faults injected, the pod starts by kind, every violation (the goal: none), what
each restarted health holder published first and whether its kill hit its moment, and the
recovery time of each fault kind: from the fault (its end, for the unreachable API
server, the full disk and a GPU back on the bus) until the part serves again: a killed
process registered or ready again, containerd answering and a pod run on it, a pod run on
the DRA node after the API server or the disk came back, a GPU healthy again.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonpatch

from bench.world import MIG_B, NODE_A, NODE_B, RECOVER_AFTER, SHARED_B, Node, World, built
from deviceplugin.dra import checkpoint
from deviceplugin.dra.devices import Sharing, devices
from deviceplugin.gpus import healthfile
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import claimtoken, dra, mps, nodegpus, nvidia, records, sim
from scripts.demo.base import IMAGE, VIEWED
from testbed.containerd import CRI_NAMESPACE
from testbed.cri import api_pb2 as cri
from testbed.kubelet import KubeletError
from testbed.kubelet_dra import KubeletError as DraKubeletError
from testbed.kuberuntime import CRIError, Sandbox
from testbed.scheduler import Scheduler
from testbed.view import view
from testbed.waiting import until
from webhook.review import decode_patch, request_for

Obj = dict[str, Any]
RETRY_FOR = 20.0  # seconds a pod's step is tried again while a part is away
# A terminating pod's unprepare is tried again until the plugin answers (the kubelet never
# gives a claim up); bounded here only so that a hang ends, well past any part's recovery.
UNPREPARE_FOR = 120.0
SETTLE = 20.0  # seconds the end's leak checks wait for sweeps and daemons to catch up
PARTITION_SECONDS, ENOSPC_SECONDS, OFF_BUS_SECONDS = 10.0, 5.0, 6.0
KINDS = ("plugin", "mps", "all", "dra", "share", "mig")
SHARE_GIB = 20  # what a share pod asks of the shared H100 (80 GB): four fit
# The processes that hold health: the moment each is killed at, and what the restarted one
# publishes first of it (the device plugin's ListAndWatch; the node agent's labels job, on
# the same process; the DRA plugin's NodeWatchResources).
HOLDING = {
    "device-plugin": ("allocate", "ListAndWatch"),
    "node-agent": ("mps-pod", "gpuwire.io/gpus"),
    "dra-plugin": ("prepare", "NodeWatchResources"),
}
MARK = nvidia.LABEL_PREFIX + "cuda.driver-version.full"  # a label only the labels job writes
# Faults that come together on real nodes, injected at once with --overlap: containerd
# restarting while the API server is away; the kubelet restarting (claims prepared again)
# onto a full disk.
OVERLAPS = (("api-unreachable", "containerd"), ("kubelet", "enospc"))
FAULTS = (
    "device-plugin", "node-agent", "dra-plugin", "resident", "webhook", "containerd",
    "kubelet", "api-unreachable", "enospc", "xid-storm", "off-bus",
)  # fmt: skip


@dataclass
class Tally:
    """What the campaign saw, shared by its threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    starts: Counter[str] = field(default_factory=Counter)  # kind → pods that ran
    failed: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    violations: list[str] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    holders: dict[str, str] = field(default_factory=dict)  # exclusive device → pod
    shares: dict[str, int] = field(default_factory=dict)  # pod → GiB of the shared GPU
    scheduling: threading.Lock = field(default_factory=threading.Lock)
    health_within: float = 5.0  # seconds after a fault its health must be the truth
    converged: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ran: list[tuple[float, str]] = field(default_factory=list)  # when a pod ran, on which node
    in_flight: Counter[str] = field(default_factory=Counter)  # "allocate", "prepare", "mps"
    moments: dict[str, threading.Event] = field(
        default_factory=lambda: defaultdict(threading.Event)
    )
    hit: dict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))  # moment hit
    kept: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)
        print(f"VIOLATION: {text}", flush=True)

    @contextlib.contextmanager
    def during(self, what: str) -> Iterator[None]:
        """Mark `what` in flight, for an injector waiting for such a moment."""
        with self.lock:
            self.in_flight[what] += 1
            self.moments[what].set()
        try:
            yield
        finally:
            with self.lock:
                self.in_flight[what] -= 1
                if not self.in_flight[what]:
                    self.moments[what].clear()


class Failed(Exception):
    """A pod that did not reach Running, with the error it met."""


def retrying(what: str, call: Callable[[], Any], errors: tuple[type[BaseException], ...],
             within: float = RETRY_FOR) -> Any:  # fmt: skip
    """`call` tried again while it fails with `errors` (a part away), for `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except errors as exc:
            if time.monotonic() > deadline:
                raise Failed(f"{what}: {exc}") from None
            time.sleep(0.3)


# --- one pod, from admission to deletion -------------------------------------------------


def pod_of(kind: str) -> Obj:
    annotations = {
        "plugin": {"gpuwire.io/gpu-count": "1"},
        "mps": {"gpuwire.io/gpu-count": "1", "gpuwire.io/gpu-memory-limit": "10Gi",
                "gpuwire.io/limit-profile": "mps"},
        "all": {"gpuwire.io/gpu-count": "all"},
        "dra": {"gpuwire.io/gpu-count": "1"},
        "share": {"gpuwire.io/gpu-memory-limit": f"{SHARE_GIB}Gi"},
        "mig": {"gpuwire.io/mig-profile": "1g.10gb"},
    }[kind]  # fmt: skip
    namespace = {"dra": "dra", "share": "dra", "mig": "dra", "all": "monitoring"}.get(
        kind, "plugin"
    )
    name = f"{kind}-{uuid.uuid4().hex[:8]}"
    meta = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
            "annotations": annotations}  # fmt: skip
    containers = [{"name": "main", "image": IMAGE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers}}


def admit(world: World, pod: Obj) -> Obj:
    """The webhook's answer, from the first replica that gives one (a Service's endpoints):
    the pod as stored, or Failed with the denial."""
    namespace = pod["metadata"]["namespace"]
    body = request_for(pod, namespace, uid=pod["metadata"]["uid"])

    def ask() -> Obj:
        for replica in list(world.replicas):
            if not replica.url:
                continue
            with contextlib.suppress(httpx.HTTPError), world.webhook(replica.url) as http:
                reply = http.post("/mutate", json=body)
                if reply.status_code == 200:
                    return dict(reply.json())
        raise ConnectionError("no webhook replica answered")

    answer = retrying("admission", ask, (ConnectionError,))
    response = answer["response"]
    if not response["allowed"]:
        raise Failed(f"denied: {response.get('status', {}).get('message', '')}")
    admitted: Obj = jsonpatch.apply_patch(pod, decode_patch(answer))
    return admitted


@dataclass
class Running:
    """A pod the kubelet started: what deleting it must undo."""

    pod: Obj
    node: Node
    sandbox: Sandbox
    container: str
    claims: list[tuple[str, str, str]] = field(default_factory=list)
    exclusive: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def start(world: World, tally: Tally, kind: str) -> Running:
    pod = admit(world, pod_of(kind))
    meta = pod["metadata"]
    if kind in ("dra", "share", "mig"):
        world.api.put(pod)
        scheduler = Scheduler(world.api)

        def scheduled() -> str:
            with tally.scheduling:  # one scheduling cycle at a time, as the scheduler runs them
                decision = scheduler.schedule(meta["namespace"], meta["name"])
            if not decision.scheduled:
                raise LookupError(decision.message)
            return str(decision.node)

        retrying("scheduling", scheduled, (LookupError,))
        stored = world.api.get("pods", meta["name"], meta["namespace"])
        assert stored is not None
        return start_dra(world, tally, stored, kind)
    pod["spec"]["nodeName"] = NODE_A
    world.api.put(pod)
    return start_a(world, tally, pod, kind)


def start_a(world: World, tally: Tally, pod: Obj, kind: str) -> Running:
    """Node A's kubelet: the device plugin's Allocate (with the container's resources), CRI."""
    meta, spec = pod["metadata"], pod["spec"]["containers"][0]
    uid = meta["uid"]
    world.pod_resources_a.add_pod(meta["namespace"], meta["name"], uid, ["main"])
    limits = (spec.get("resources") or {}).get("limits") or {}
    asked = [(r, int(n)) for r, n in limits.items() if r.startswith("nvidia.com/")]
    answers, granted = [], {d.uuid for d in world.a.devices}  # a grant: every GPU (`all`)
    for resource, count in asked:

        def allocate(resource: str = resource, count: int = count) -> Any:
            with tally.during("allocate"):
                return world.kubelet_a.admit(resource, count, uid, "main")

        devices, answer = retrying("Allocate", allocate, (KubeletError, grpc.RpcError))
        answers.append(answer)
        granted = {d.split("::")[0] for d in devices}
    if kind != "all" and not asked:
        raise Failed(f"admitted without a device plugin resource: {limits}")
    running = run_containers(world, world.a, pod, answers, ())
    exclusive = tuple(sorted(granted)) if kind != "all" else ()
    return checked(world, tally, running, granted, exclusive, kind)


def start_dra(world: World, tally: Tally, pod: Obj, kind: str) -> Running:
    """Node B's kubelet: NodePrepareResources for the pod's claims, then CRI with their CDI
    ids."""
    namespace = pod["metadata"]["namespace"]
    refs, results = [], []
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
        claim = world.api.get("resourceclaims", status["resourceClaimName"], namespace)
        assert claim is not None
        refs.append((namespace, claim["metadata"]["name"], claim["metadata"]["uid"]))
        results += claim["status"]["allocation"]["devices"]["results"]

    def prepare() -> list[str]:
        with tally.during("prepare"):
            answers = world.kubelet_b.prepare(dra.DRIVER, refs)
        errors = [a.error for a in answers.values() if a.error]
        if errors:
            raise DraKubeletError(errors[0])
        return [i for _, _, u in refs for i in world.kubelet_b.cdi_ids(u)]

    ids = retrying("NodePrepareResources", prepare, (DraKubeletError, grpc.RpcError))
    by_name = dra_names(world.b.root)
    granted = {by_name.get(r["device"], r["device"]) for r in results}
    try:
        running = run_containers(world, world.b, pod, [], tuple(ids))
    except Failed:
        unprepare(world, refs)
        raise
    running.claims = refs
    exclusive = () if kind == "share" else tuple(sorted(granted))
    if kind == "share":
        with tally.lock:
            tally.shares[running.name] = SHARE_GIB
            if sum(tally.shares.values()) * 1024 > world.b.devices[SHARED_B].memory_mib:
                tally.violations.append(f"shares beyond GPU {SHARED_B}'s memory: {tally.shares}")
    return checked(world, tally, running, granted, exclusive, kind)


@functools.cache
def device_files(root: Path) -> dict[str, tuple[str, ...]]:
    """A node's GPUs and MIG devices (by UUID) → the device files that give them: a GPU's
    `/dev/nvidia<minor>`; a MIG device's GPU's, and its two capabilities'
    (`/dev/nvidia-caps/nvidia-cap<minor>`)."""
    node = SimDiscovery(root).discover()
    files: dict[str, tuple[str, ...]] = {d.uuid: (f"/dev/nvidia{d.minor}",) for d in node.devices}
    for m in node.mig_devices:
        caps = tuple(f"/dev/nvidia-caps/nvidia-cap{c}" for c in (m.gi_cap, m.ci_cap))
        files[m.uuid] = (f"/dev/nvidia{m.parent_minor}", *caps)
    return files


@functools.cache
def dra_names(root: Path) -> dict[str, str]:
    """A DRA node's device names (`gpu-1`, `gpu-0-mig-1g10gb-…`) → the GPU or MIG device UUID
    each is, as its plugin names them."""
    return {d.name: d.uuid for d in devices(SimDiscovery(root).discover(), Sharing())}


def run_containers(
    world: World, node: Node, pod: Obj, answers: list[Any], cdi_ids: tuple[str, ...]
) -> Running:
    """RunPodSandbox with the RuntimeClass's handler, then the container; CRI calls that fail
    while containerd is away are tried again (a half-made sandbox removed first)."""
    name = pod["spec"].get("runtimeClassName")
    handler = ""
    if name:
        runtime_class = world.api.get("runtimeclasses", name)
        assert runtime_class is not None
        handler = runtime_class["handler"]
    spec = pod["spec"]["containers"][0]

    def run() -> Running:
        sandbox = node.runtime.run_sandbox(pod, handler)
        try:
            cid = node.runtime.create(sandbox, pod, spec, answers, cdi_ids)
            node.runtime.start(cid)
        except CRIError:
            with contextlib.suppress(CRIError):
                node.runtime.remove_sandbox(sandbox)
            raise
        return Running(pod, node, sandbox, cid)

    return retrying("CRI", run, (CRIError, grpc.RpcError))  # type: ignore[no-any-return]


def checked(
    world: World, tally: Tally, running: Running, granted: set[str], exclusive: tuple[str, ...],
    kind: str,
) -> Running:  # fmt: skip
    """The started pod, held to what it was given; deleted again when that cannot be told."""
    try:
        return check_view(world, tally, running, granted, exclusive, kind)
    except BaseException:
        stop(world, tally, running)
        raise


def check_view(
    world: World, tally: Tally, running: Running, granted: set[str], exclusive: tuple[str, ...],
    kind: str,
) -> Running:  # fmt: skip
    """Wait for the container to print what it sees; hold it to what it was given."""
    runtime, cid = running.node.runtime, running.container

    def printed() -> str:
        try:
            text = runtime.logs(cid)
            if VIEWED not in text and runtime.status(cid).state != cri.CONTAINER_RUNNING:
                raise Failed(f"the container exited: {text.strip()[-300:]}")
        except CRIError:  # containerd away (restarting): look again
            return ""
        return text

    deadline = time.monotonic() + RETRY_FOR
    while VIEWED not in (text := printed()):
        if time.monotonic() > deadline:  # stuck: a violation, not an error the pod ended with
            raise TimeoutError(f"{running.name}'s container printed nothing in {RETRY_FOR:.0f} s")
        time.sleep(0.1)
    seen = view(text)
    uuids = {line.rpartition("UUID: ")[2].rstrip(")") for line in seen.get("smi", [])}
    if kind == "mig":  # nvidia-smi -L lists a MIG device under its GPU's line
        granted = granted | {world.b.devices[MIG_B].uuid}
    beyond = uuids - granted
    if beyond:
        tally.violation(f"{running.name} sees {sorted(beyond)}, granted {sorted(granted)}")
    files = device_files(running.node.root)
    allowed = {f for u in granted for f in files.get(u, ())}
    present = {f"/dev/{n}" for n in " ".join(seen.get("devices", [])).split()
               if n.removeprefix("nvidia").isdigit()}  # fmt: skip
    present |= {f"/dev/nvidia-caps/{n}" for n in " ".join(seen.get("caps", [])).split()
                if n.removeprefix("nvidia-cap").isdigit()}  # fmt: skip
    if present - allowed:
        tally.violation(f"{running.name} has {sorted(present - allowed)}, granted "
                        f"{sorted(granted)} ({sorted(allowed)})")  # fmt: skip
    if kind != "all" and not uuids:
        tally.violation(f"{running.name} ({kind}) sees no GPU: {seen.get('smi')}")
    with tally.lock:
        for device in exclusive:
            other = tally.holders.get(device)
            if other is not None:
                tally.violations.append(f"{device} held by {other} and {running.name}")
            tally.holders[device] = running.name
    running.exclusive = exclusive
    return running


def stop(world: World, tally: Tally, running: Running) -> None:
    """Delete the pod: its sandbox, then the kubelet's undoing (devices freed, claims
    unprepared and deallocated), then the API object."""
    with tally.lock:
        for device in running.exclusive:
            if tally.holders.get(device) == running.name:
                del tally.holders[device]
        tally.shares.pop(running.name, None)
    meta = running.pod["metadata"]
    node = running.node
    retrying("StopPodSandbox", lambda: node.runtime.remove_sandbox(running.sandbox),
             (CRIError, grpc.RpcError))  # fmt: skip
    if node is world.a:
        world.kubelet_a.remove_pod(meta["uid"])
        world.pod_resources_a.remove_pod(meta["uid"])
    else:
        unprepare(world, running.claims)
    world.api.delete("pods", meta["name"], meta["namespace"])


def unprepare(world: World, refs: list[tuple[str, str, str]]) -> None:
    def call() -> None:
        errors = [e for e in world.kubelet_b.unprepare(dra.DRIVER, refs).values() if e]
        if errors:
            raise DraKubeletError(errors[0])

    if refs:
        retrying("NodeUnprepareResources", call, (DraKubeletError, grpc.RpcError),
                 UNPREPARE_FOR)  # fmt: skip
    for namespace, name, _ in refs:  # deallocated: the resourceclaim controller's part
        with contextlib.suppress(Exception):
            world.api.delete("resourceclaims", name, namespace)


def worker(
    world: World, tally: Tally, rng: random.Random, deadline: float, faults: threading.Event
) -> None:
    """Pods, one after another, until the time is up and every fault has been injected: the
    kinds in rounds, each once per round in a random order (so a short run starts each)."""
    kinds: list[str] = []
    while time.monotonic() < deadline or not faults.is_set():
        kinds = kinds or rng.sample(KINDS, len(KINDS))
        kind = kinds.pop()
        try:
            running = start(world, tally, kind)
        except Failed as exc:
            with tally.lock:
                why = str(exc).split(":")[0]
                if not tally.failed[kind][why]:
                    print(f"{kind} pod ended with an error: {str(exc)[:300]}", flush=True)
                tally.failed[kind][why] += 1
            continue
        except Exception as exc:  # a pod whose end is not a clear error: a violation
            tally.violation(f"{kind} pod: {type(exc).__name__}: {exc}")
            continue
        with tally.lock:
            tally.starts[kind] += 1
            tally.ran.append((time.monotonic(), running.node.name))
        time.sleep(rng.uniform(0.5, 2.5))
        try:
            stop(world, tally, running)
        except Exception as exc:
            tally.violation(f"{running.name} not deleted: {type(exc).__name__}: {exc}")


# --- the faults ------------------------------------------------------------------------------


def wait_for(tally: Tally, moment: str, within: float = 8.0) -> None:
    """Until `moment` is in flight somewhere (an Allocate, a prepare), or `within` passed."""
    tally.moments[moment].wait(within)


def a_health(world: World) -> dict[str, str]:
    plugin = world.kubelet_a.plugins.get(nvidia.RESOURCE)
    return {d.ID: d.health for d in plugin.devices} if plugin else {}


def b_taints(world: World) -> dict[str, bool]:
    """Node B's GPUs (by UUID) → whether its slices taint them."""
    out = {}
    for s in world.api.objects("resourceslices"):
        if s["spec"].get("nodeName") != NODE_B:
            continue
        for d in s["spec"].get("devices") or ():
            uuid_ = next(iter((d.get("attributes") or {}).get("uuid", {}).values()), "")
            out[uuid_] = bool(d.get("taints"))
    return out


def inject(world: World, tally: Tally, kind: str, rng: random.Random) -> float:
    """One fault; returns the seconds until the part served again."""
    started = time.monotonic()
    if kind in HOLDING:
        return restart_holding_health(world, tally, kind, rng)
    if kind == "resident":
        world.restart_resident()
    elif kind == "webhook":
        replica = rng.choice(world.replicas)
        replica.kill()
        started = time.monotonic()
        replica.start()
        until(lambda: world.ready(replica), timeout=60)
    elif kind == "containerd":
        node = rng.choice(world.nodes)
        node.containerd.restart()
        until(lambda: _cri_answers(node), timeout=60)
        pod_runs(tally, started, node.name)
    elif kind == "kubelet":
        world.kubelet_a.restart()
        world.kubelet_b.restart()
        until(lambda: nvidia.RESOURCE in world.kubelet_a.plugins, timeout=60)
        world.kubelet_b.wait_registered(dra.DRIVER, timeout=60)
    elif kind == "api-unreachable":
        world.partition.cut()
        time.sleep(PARTITION_SECONDS)
        world.partition.heal()
        started = time.monotonic()
        until(lambda: all(world.ready(r) for r in world.replicas), timeout=60)
        pod_runs(tally, started, NODE_B)  # a DRA pod: admitted, its template made, prepared
    elif kind == "enospc":
        fillers = [fill(d) for node in world.nodes for d in node.tmpfs]
        time.sleep(ENOSPC_SECONDS)
        for filler in fillers:
            filler.unlink()
        started = time.monotonic()
        pod_runs(tally, started, NODE_B)  # a claim prepared: checkpoint and spec written
    elif kind == "xid-storm":
        node = rng.choice(world.nodes)
        gpu = node.devices[rng.choice([1, 2])]
        for _ in range(50):
            sim.inject_fault(node.root, gpu.uuid, 48)
        converge(world, tally, node, gpu.uuid, unhealthy=True, what=kind)
        converge(world, tally, node, gpu.uuid, unhealthy=False, what=kind, after=RECOVER_AFTER)
    elif kind == "off-bus":  # XID 79, then the driver no longer reaches it
        node = world.a
        gpu = node.devices[rng.choice([1, 2])]
        machine = sim.load_machine(node.root)
        sim.inject_fault(node.root, gpu.uuid, 79)
        converge(world, tally, node, gpu.uuid, unhealthy=True, what=kind)
        gone = sim.Machine(machine.driver_version, machine.cuda_version,
                           tuple(g for g in machine.gpus if g.device.uuid != gpu.uuid))  # fmt: skip
        (node.root / sim.MACHINE).write_text(gone.to_json())
        time.sleep(OFF_BUS_SECONDS)
        if a_health(world).get(gpu.uuid) == "Healthy":
            tally.violation(f"off-bus: {gpu.uuid} healthy while it is gone")
        (node.root / sim.MACHINE).write_text(machine.to_json())
        started = time.monotonic()
        converge(world, tally, node, gpu.uuid, unhealthy=False, what=kind, after=RECOVER_AFTER)
    return time.monotonic() - started


def restart_holding_health(world: World, tally: Tally, kind: str, rng: random.Random) -> float:
    """SIGKILL of a process that holds health, at its moment, while one of its node's GPUs
    is faulting (XIDs until the kill, so the quiet period runs from about then), and started
    again: the restarted process's first publication (what `HOLDING` names) must hold the
    GPU unhealthy where the quiet period was not over when it published, and the GPU is
    healthy again once it is. Returns the seconds until the process served again."""
    node = world.b if kind == "dra-plugin" else world.a
    moment, published = HOLDING[kind]
    gpu = node.devices[rng.choice([1, 2])].uuid
    old: Any = (world.kubelet_b.plugins.get(dra.DRIVER) if node is world.b
                else world.kubelet_a.plugins.get(nvidia.RESOURCE))  # fmt: skip
    with faulting(node.root, gpu):
        converge(world, tally, node, gpu, unhealthy=True, what=kind)
        wait_for(tally, moment)
        hit = tally.moments[moment].is_set()
        node.agent.kill()
    started = time.monotonic()
    kept = healthfile.load(node.tmpfs[0], time.time(), time.time()).get(gpu)
    if kind == "node-agent":
        relabel(world, NODE_A)
    node.agent.start()
    if node is world.b:
        until(lambda: (p := world.kubelet_b.plugins.get(dra.DRIVER)) is not None
              and p is not old and p.health_messages > 0, timeout=60)  # fmt: skip
    else:
        until(lambda: (p := world.kubelet_a.plugins.get(nvidia.RESOURCE)) is not None
              and p is not old and bool(p.snapshots), timeout=60)  # fmt: skip
    if kind == "node-agent":
        until(lambda: MARK in node_labels(world, NODE_A), timeout=60)
    seen_at = time.time()
    first = first_publication(world, kind, gpu)
    served = time.monotonic() - started
    with tally.lock:
        tally.hit[kind].append(hit)
    if kind == "node-agent":
        daemons = str(world.a.root.parent / "mps")
        until(lambda: all(mps.ready(daemons, d.uuid) for d in world.a.devices), timeout=60)
    if kept is None:  # faulting until the kill: the book had it, and so had its file
        tally.violation(f"{kind}: {gpu}'s fault not on disk at the kill")
        return served
    due = kept[0] + RECOVER_AFTER  # the wall-clock end of its quiet period
    if seen_at >= due:
        outcome = "not checked (the restart outlasted the quiet period)"
    elif first == "Unhealthy":
        outcome = "still unhealthy"
    else:
        outcome = "forgotten"
        early = due - seen_at
        tally.violation(f"{kind}: {gpu} {first} in the restarted process's first "
                        f"{published}, {early:.1f} s before its quiet period ended")  # fmt: skip
    with tally.lock:
        tally.kept[kind][outcome] += 1
    left = max(0.0, due - time.time())
    converge(world, tally, node, gpu, unhealthy=False, what=kind, after=left)
    return served


@contextlib.contextmanager
def faulting(root: Path, uuid_: str, every: float = 0.5) -> Iterator[None]:
    """A critical XID on the GPU every `every` seconds while the block runs."""
    stop = threading.Event()

    def storm() -> None:
        while True:
            sim.inject_fault(root, uuid_, 48)
            if stop.wait(every):
                return

    thread = threading.Thread(target=storm, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def plugin_a(world: World) -> Any:
    return world.kubelet_a.plugins[nvidia.RESOURCE]


def first_publication(world: World, kind: str, uuid_: str) -> str:
    """The GPU's health in what the restarted process published first (`HOLDING`)."""
    if kind == "device-plugin":
        health = {d.ID: d.health for d in plugin_a(world).snapshots[0]}
        return str(health.get(uuid_, "absent"))
    if kind == "node-agent":
        gpus = {g.uuid: g for g in node_gpus(world, NODE_A)}
        return "absent" if uuid_ not in gpus else "Healthy" if gpus[uuid_].healthy else "Unhealthy"
    name = {u: n for n, u in dra_names(world.b.root).items()}[uuid_]
    return world.kubelet_b.device_health(dra.DRIVER).get(name, "absent")


def node_labels(world: World, name: str) -> dict[str, str]:
    return dict(((world.api.get("nodes", name) or {}).get("metadata") or {}).get("labels") or {})


def node_gpus(world: World, name: str) -> tuple[nodegpus.NodeGpu, ...]:
    meta = (world.api.get("nodes", name) or {}).get("metadata") or {}
    text = (meta.get("annotations") or {}).get(nodegpus.ANNOTATION)
    return nodegpus.decode(text) if text else ()


def relabel(world: World, name: str) -> None:
    """Take `MARK` off the Node, so that its coming back says the agent's labels job has
    run: that pass wrote what it holds of the GPUs' health too (one patch)."""
    node = world.api.get("nodes", name)
    assert node is not None
    node["metadata"]["labels"].pop(MARK, None)
    world.api.put(node)


def pod_runs(tally: Tally, since: float, node: str, within: float = 60.0) -> None:
    """Until a pod has run on `node` since `since` (the workers' next one)."""
    until(lambda: any(t > since and n == node for t, n in list(tally.ran)), timeout=within)


def converge(world: World, tally: Tally, node: Node, uuid_: str, unhealthy: bool, what: str,
             after: float = 0.0) -> None:  # fmt: skip
    """The GPU's health, as the node's role publishes it, the truth within the bound (`after`
    more for a recovery, the quiet period); how long it took goes to the figures. Healthy is
    a GPU published healthy: one its role does not list (yet) is not."""
    within = after + tally.health_within
    began = time.monotonic()

    def seen() -> bool:  # healthy: published so, not merely left out (a GPU not listed yet)
        if node is world.a:
            return a_health(world).get(uuid_) == ("Unhealthy" if unhealthy else "Healthy")
        return b_taints(world).get(uuid_) is unhealthy

    try:
        until(seen, timeout=within)
        with tally.lock:
            tally.converged[f"{what} {'unhealthy' if unhealthy else 'healthy'}"].append(
                time.monotonic() - began
            )
    except TimeoutError:
        state = "unhealthy" if unhealthy else "healthy"
        shown = a_health(world) if node is world.a else b_taints(world)
        if node is world.a:
            plugin = world.kubelet_a.plugins.get(nvidia.RESOURCE)
            ended = plugin.stream_ended if plugin else None
            shown = {uuid_: f"{shown.get(uuid_)}, stream ended: {ended}, registrations: "
                            f"{len(world.kubelet_a.registrations)}"}  # fmt: skip
        said = [line for line in node.agent.log.read_text(errors="replace").splitlines()
                if uuid_ in line][-3:]  # fmt: skip
        tally.violation(f"{what}: {uuid_} on {node.name} not {state} within {within:.0f} s "
                        f"(published: {shown.get(uuid_)}; its agent said: {said})")  # fmt: skip


def fill(directory: Path) -> Path:
    """A file taking every free block of `directory`'s filesystem."""
    path = directory / ".filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 65536):
                pass
    finally:
        os.close(fd)
    return path


def _cri_answers(node: Node) -> bool:
    with contextlib.suppress(CRIError, grpc.RpcError):
        node.runtime.version()
        return True
    return False


Schedule = list[tuple[float, tuple[str, ...]]]  # when, and the faults injected at once


def injector(world: World, tally: Tally, rng: random.Random, schedule: Schedule,
             begun: float, done: threading.Event) -> None:  # fmt: skip
    try:
        inject_all(world, tally, rng, schedule, begun)
    finally:
        done.set()


def inject_all(world: World, tally: Tally, rng: random.Random, schedule: Schedule,
               begun: float) -> None:  # fmt: skip
    for at, kinds in schedule:
        time.sleep(max(0.0, begun + at - time.monotonic()))
        together = [threading.Thread(target=inject_one, daemon=True,
                                     args=(world, tally, kind, random.Random(rng.random()), begun))
                    for kind in kinds]  # fmt: skip
        for thread in together:
            thread.start()
        for thread in together:
            thread.join()


def inject_one(world: World, tally: Tally, kind: str, rng: random.Random, begun: float) -> None:
    print(f"{time.monotonic() - begun:6.1f} s  fault {kind}", flush=True)
    with tally.lock:
        tally.faults.append((time.monotonic() - begun, kind))
    try:
        took = inject(world, tally, kind, rng)
    except Exception as exc:
        tally.violation(f"fault {kind}: not recovered: {type(exc).__name__}: {exc}")
        return
    with tally.lock:
        tally.recovery[kind].append(took)


def mps_pods(world: World, tally: Tally, done: threading.Event) -> None:
    """Keep marking the moments an MPS pod holds its daemon's GPU, for the node-agent fault
    (the pods themselves are the workers')."""
    while not done.is_set():
        held = [h for h in tally.holders.values() if h.startswith("mps-")]
        with tally.lock:
            if held:
                tally.moments["mps-pod"].set()
            else:
                tally.moments["mps-pod"].clear()
        time.sleep(0.2)


def plan(rng: random.Random, seconds: float, rounds: int, overlap: bool = False) -> Schedule:
    """Each kind once per round (with `overlap`, each of `OVERLAPS` too, its two at once), in
    a random order, at random times within its slot."""
    units = [(k,) for k in FAULTS] + (list(OVERLAPS) if overlap else [])
    kinds = [u for _ in range(rounds) for u in rng.sample(units, len(units))]
    slot = (seconds - 10.0) / len(kinds)
    return [(5.0 + i * slot + rng.uniform(0, slot * 0.4), k) for i, k in enumerate(kinds)]


# --- the end: nothing leaked -------------------------------------------------------------------


def leaks(world: World) -> list[str]:
    """What is left once every pod is gone and the sweeps have run."""
    found = []
    for node in world.nodes:
        left = [e for e in records.scan(str(node.records))]
        if left:
            found.append(f"{node.name}: {len(left)} container record(s) left")
        listed = node.containerd.ctr("containers", "list", "--quiet", namespace=CRI_NAMESPACE)
        if listed.stdout.split():
            found.append(f"{node.name}: {len(listed.stdout.split())} container(s) left")
    cdi = [p.name for p in (world.b.containerd.home / "cdi").glob("*claim_*")]
    if cdi:
        found.append(f"claim CDI specs left: {cdi}")
    plugin_dir = world.b.tmpfs[0]
    with contextlib.suppress(Exception):
        prepared = checkpoint.load(plugin_dir)
        if prepared:
            found.append(f"prepared claims left: {sorted(prepared)}")
    tokens = Path(claimtoken.directory(str(world.b.allocations)))
    if tokens.exists() and any(tokens.iterdir()):
        found.append(f"claim tokens left: {sorted(p.name for p in tokens.iterdir())}")
    allocation_tokens = [p.name for p in world.a.allocations.glob("*") if p.is_file()]
    if allocation_tokens:
        found.append(f"allocation tokens left: {allocation_tokens}")
    daemons = world.mps_daemons()
    if len(daemons) != len(world.a.devices):
        found.append(f"{len(daemons)} MPS control daemons for {len(world.a.devices)} GPUs")
    children = Path(f"/proc/{world.resident.process.pid}/task/{world.resident.process.pid}"
                    "/children").read_text().split()  # fmt: skip
    if len(children) > 1:
        found.append(f"the resident has {len(children)} children (one waits for a call)")
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if "/rootfs" in line.split()[4] and any(str(n.containerd.home) in line
                                                      for n in world.nodes)]  # fmt: skip
    if mounts:
        found.append(f"container mounts left: {mounts[:3]}")
    return found


def settle(world: World) -> list[str]:
    deadline = time.monotonic() + SETTLE
    while True:
        found = leaks(world)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


# --- the campaign ----------------------------------------------------------------------------


def campaign(
    seconds: float, seed: int, workers: int = 3, rounds: int = 1, logs: Path | None = None,
    health_within: float = 5.0, overlap: bool = False,
) -> Tally:  # fmt: skip
    """`logs`: where the agents' logs are copied at the end; `overlap`: `OVERLAPS` too."""
    rng = random.Random(seed)
    tally = Tally(health_within=health_within)
    schedule = plan(rng, seconds, rounds, overlap)
    with built() as world:
        print(f"world up in {world.workdir}; faults at {[round(t) for t, _ in schedule]} s",
              flush=True)  # fmt: skip
        begun = time.monotonic()
        deadline = begun + seconds
        done = threading.Event()
        threads = [threading.Thread(target=worker, args=(world, tally, random.Random(seed + i),
                                                         deadline, done), daemon=True)
                   for i in range(workers)]  # fmt: skip
        faults = (world, tally, rng, schedule, begun, done)
        threads.append(threading.Thread(target=injector, args=faults, daemon=True))
        threads.append(threading.Thread(target=mps_pods, args=(world, tally, done), daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=seconds + 4 * RETRY_FOR + UNPREPARE_FOR + 120)
            if thread.is_alive():
                tally.violation(f"{thread.name} stuck past the end")
        for leak in settle(world):
            tally.violation(f"leak: {leak}")
        for node in world.nodes:
            if not node.agent.running():
                tally.violation(f"{node.name}'s agent is not running at the end")
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(node.agent.log, logs / f"{node.name}-agent.log")
    return tally


def report(tally: Tally, seconds: float, seed: int) -> str:
    lines = [f"fault campaign: {seconds:.0f} s, seed {seed}"]
    lines.append(f"faults injected: {len(tally.faults)} ({', '.join(k for _, k in tally.faults)})")
    lines.append(f"pod starts: {sum(tally.starts.values())} "
                 f"({', '.join(f'{k} {n}' for k, n in sorted(tally.starts.items()))})")  # fmt: skip
    for kind, why in sorted(tally.failed.items()):
        lines.append(f"  {kind}: ended with an error: {dict(why)}")
    lines.append(f"invariant violations: {len(tally.violations)}")
    lines += [f"  {v}" for v in tally.violations]
    bound = f"bound {tally.health_within:.0f} s, a recovery's after the quiet period"
    lines.append(f"health, seconds from the fault until published so ({bound}), median, max:")
    for what, seen in sorted(tally.converged.items()):
        lines.append(f"  {what:24} {statistics.median(seen):6.2f} {max(seen):6.2f}  n={len(seen)}")
    lines.append("health across a restart (a GPU faulting until the kill, in the restarted "
                 "process's first publication):")  # fmt: skip
    for kind, (moment, published) in HOLDING.items():
        outcomes = ", ".join(f"{o} {n}" for o, n in sorted(tally.kept[kind].items()))
        hits = tally.hit[kind]
        lines.append(f"  {kind:16} {published}: {outcomes or 'none'}; killed with {moment} in "
                     f"flight: {sum(hits)} of {len(hits)}")  # fmt: skip
    lines.append("recovery, seconds from the fault until the part serves again (median, max):")
    for kind in FAULTS:
        took = tally.recovery.get(kind)
        if took:
            lines.append(
                f"  {kind:16} {statistics.median(took):6.2f} {max(took):6.2f}  n={len(took)}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=75.0, help="the workload's length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3, help="pods started at once")
    parser.add_argument("--rounds", type=int, default=1, help="each fault kind this often")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    parser.add_argument("--logs", metavar="DIR", type=Path, help="keep the agents' logs here")
    parser.add_argument("--health-within", type=float, default=5.0, metavar="SECONDS",
                        help="the bound on a fault's health becoming the truth")  # fmt: skip
    parser.add_argument("--overlap", action="store_true",
                        help="also inject each pair of OVERLAPS at once, each round")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench.faults runs containers: run it as root", file=sys.stderr)
        return 2
    tally = campaign(args.seconds, args.seed, args.workers, args.rounds, args.logs,
                     args.health_within, args.overlap)  # fmt: skip
    print(report(tally, args.seconds, args.seed))
    if args.json:
        figures = {"starts": tally.starts, "violations": tally.violations,
                   "faults": tally.faults, "recovery": tally.recovery}  # fmt: skip
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
