"""The node's part: from a pod bound to the node to its running containers, as the kubelet
does it, over CRI to containerd's own CRI plugin.

The pod becomes active on the node (the pod-resources API lists it); its sandbox runs with
the runtime handler of its RuntimeClass ("" without one: containerd's default); for each
container, the device plugin's resources through the kubelet stand-in (which asks
GetPreferredAllocation, then Allocate), then CreateContainer with the Allocate answer as the
kubelet hands it over and StartContainer (testbed/kuberuntime.py). containerd itself writes
the `io.kubernetes.cri.*` annotations the shim trusts, from the pod's metadata. The
containers keep running, holding their GPUs, until the demo ends; what they printed
(testbed.view), the annotations containerd wrote and what gpuwire-runtime logged about
them come back as data.

Simplified (see testbed/kuberuntime.py for the rest): every pod is on the host network;
init containers are not run (the demo's pods have none); env values are literal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import api_pb2
from scripts.demo.base import VIEWED, Handler, Host, until
from scripts.demo.cluster import Cluster
from testbed.apiserver import ApiServer
from testbed.cri import api_pb2 as cri
from testbed.kubelet import KubeletError
from testbed.kuberuntime import CRIError, KubeRuntime, Sandbox
from testbed.view import view

Obj = dict[str, Any]


@dataclass(frozen=True)
class Mount:
    """A read-only bind mount an Allocate answer asks for."""

    source: Path
    destination: str


@dataclass(frozen=True)
class Allocation:
    """One device plugin resource of one container: what the kubelet asked and was given."""

    resource: str
    preferred: tuple[str, ...]  # GetPreferredAllocation's answer (empty: not asked)
    devices: tuple[str, ...]  # the device IDs the kubelet allocated
    answer: api_pb2.ContainerAllocateResponse = field(
        default_factory=api_pb2.ContainerAllocateResponse
    )

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.answer.envs)

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return tuple(Mount(Path(m.host_path), m.container_path) for m in self.answer.mounts)


@dataclass(frozen=True)
class Started:
    """One container of a pod: how it was started and what it saw."""

    name: str
    allocations: tuple[Allocation, ...]
    handler: Handler | None  # None: containerd does not run here
    container_id: str = ""
    running: bool = False
    seen: Mapping[str, list[str]] | None = None  # what it printed (testbed.view)
    annotations: Mapping[str, str] = field(default_factory=dict)  # containerd's, on its spec
    error: str = ""  # why it did not start or run
    runtime_log: tuple[str, ...] = ()  # what gpuwire-runtime said about it
    cdi_ids: tuple[str, ...] = ()  # its prepared DRA claims' devices, sent in CDI_devices


def allocate(host: Host, pod: Obj, spec: Obj) -> tuple[Allocation, ...]:
    """The device plugin resources in `spec`'s limits, allocated through the node's kubelet."""
    limits = (spec.get("resources") or {}).get("limits") or {}
    out = []
    uid = pod["metadata"]["uid"]
    kubelet = host.kubelet
    for resource, count in limits.items():
        if resource not in kubelet.plugins:
            continue
        devices, answer = kubelet.admit(resource, int(count), uid, spec["name"])
        preferred = tuple(kubelet.hints.get((uid, spec["name"]), ()))
        out.append(Allocation(resource, preferred, tuple(devices), answer))
    return tuple(out)


def handler_for(
    api: ApiServer, handlers: Mapping[str, Handler], default: str, pod: Obj
) -> tuple[Handler, str]:
    """The pod's RuntimeClass handler (containerd's `default` without one), as containerd has
    it configured, and the name the kubelet asks RunPodSandbox for ("" without a class).
    KeyError names what is missing, as the kubelet would fail the pod."""
    name = pod["spec"].get("runtimeClassName")
    handler = default
    if name:
        runtime_class = api.get("runtimeclasses", name)
        if runtime_class is None:
            raise KeyError(f'RuntimeClass "{name}" not found')
        handler = runtime_class["handler"]
    if handler not in handlers:
        raise KeyError(f"no runtime for {handler!r} is configured")
    return handlers[handler], handler if name else ""


def _runtime_log(path: Path, offset: int, cid: str) -> tuple[str, ...]:
    """What gpuwire-runtime logged (to `path`) about container `cid` after `offset`."""
    if not path.exists():
        return ()
    with path.open() as f:
        f.seek(offset)
        lines = f.read().splitlines()
    mark = f" {cid}: "
    return tuple(line.split(mark, 1)[1] for line in lines if mark in line)


def start(
    runtime: KubeRuntime,
    runtime_log: Path,
    sandbox: Sandbox,
    pod: Obj,
    spec: Obj,
    allocations: tuple[Allocation, ...],
    handler: Handler,
    cdi_ids: tuple[str, ...] = (),
) -> Started:
    """CreateContainer (with the device plugin's answers, and the CDI ids of its prepared
    claims) and StartContainer in the pod's sandbox; once the container has printed what it
    sees (or has stopped), what it printed. `runtime_log`: where gpuwire-runtime logs."""
    name = spec["name"]
    offset = runtime_log.stat().st_size if runtime_log.exists() else 0
    try:
        cid = runtime.create(sandbox, pod, spec, [a.answer for a in allocations], cdi_ids)
    except CRIError as exc:
        return Started(name, allocations, handler, error=str(exc), cdi_ids=cdi_ids)
    try:
        runtime.start(cid)
    except CRIError as exc:
        log = _runtime_log(runtime_log, offset, cid)
        return Started(name, allocations, handler, cid, error=str(exc), runtime_log=log,
                       cdi_ids=cdi_ids)  # fmt: skip

    def running() -> bool:
        return runtime.status(cid).state == cri.CONTAINER_RUNNING

    until(lambda: VIEWED in runtime.logs(cid) or not running(),
          f"container {name} to print what it sees")  # fmt: skip
    printed = runtime.logs(cid)
    up = running()
    return Started(
        name,
        allocations,
        handler,
        cid,
        running=up,
        seen=view(printed) if VIEWED in printed else None,
        annotations=runtime.spec(cid).get("annotations", {}),
        error="" if up else (printed.strip() or "it exited"),
        runtime_log=_runtime_log(runtime_log, offset, cid),
        cdi_ids=cdi_ids,
    )


def run_pod(cluster: Cluster, pod: Obj, host: Host | None = None) -> tuple[Started, ...]:
    """Run a pod bound to a node (`host`; the first node's by default): its sandbox, then its
    containers in order; they keep running. A refusal on the way fails the container with the
    kubelet's reason; the pod's phase goes to the API server."""
    host = host or cluster.host()
    meta, spec = pod["metadata"], pod["spec"]
    names = [c["name"] for c in spec["containers"]]
    host.pod_resources.add_pod(meta["namespace"], meta["name"], meta["uid"], names)
    started = []
    sandbox: Sandbox | str | None = None  # str: why there is none
    for container in spec["containers"]:
        name = container["name"]
        try:
            allocations = allocate(host, pod, container)
        except (KubeletError, grpc.RpcError) as exc:
            reason = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
            started.append(Started(name, (), None, error=f"UnexpectedAdmissionError: {reason}"))
            continue
        runtime = host.runtime
        if runtime is None:
            error = "not run: containerd is not running here"
            started.append(Started(name, allocations, None, error=error))
            continue
        try:
            handler, named = handler_for(cluster.api, host.handlers, host.default_handler, pod)
        except KeyError as exc:
            started.append(Started(name, allocations, None, error=str(exc.args[0])))
            continue
        if sandbox is None:
            try:
                sandbox = runtime.run_sandbox(pod, named)
            except CRIError as exc:
                sandbox = f"RunPodSandbox: {exc}"
        if isinstance(sandbox, str):
            started.append(Started(name, allocations, handler, error=sandbox))
            continue
        started.append(start(runtime, cluster.runtime_log, sandbox, pod, container, allocations,
                             handler))  # fmt: skip
    if host.runtime is not None:
        phase = "Running" if all(s.running for s in started) else "Failed"
        pod["status"] = {**pod.get("status", {}), "phase": phase}
        cluster.api.put(pod)
    return tuple(started)
