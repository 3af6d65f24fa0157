"""The node's part: from a pod bound to the node to its containers, as kubelet and containerd
do it, then `ctr run` with the runtime handler containerd resolves.

The pod becomes active on the node (the pod-resources API lists it); for each container: the
device plugin's resources through the kubelet stand-in (which asks GetPreferredAllocation,
then Allocate); the env in the order the kubelet hands it to the CRI (the plugin's envs, then
the pod's) over the image's; the plugin's mounts; the annotations containerd's CRI plugin puts
on every container spec; and the runtime handler: the pod's RuntimeClass, else containerd's
default, looked up in containerd's own config. The containers keep running, holding their
GPUs, until the demo ends; what they printed (testbed.view) and what gpuwire-runtime
logged about them come back as data.

Simplified: the pod sandbox is an id, not a pause container; init containers are not run
(the demo's pods have none); `command`/`args` replace the image's command (the demo's
images have no entrypoint); env values are literal.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from scripts.demo.cluster import VIEWED, Cluster, Handler, until
from testbed.containerd import RUNC_SHIM, Container, Mount
from testbed.kubelet import KubeletError
from testbed.view import view

Obj = dict[str, Any]


@dataclass(frozen=True)
class Allocation:
    """One device plugin resource of one container: what the kubelet asked and was given."""

    resource: str
    preferred: tuple[str, ...]  # GetPreferredAllocation's answer (empty: not asked)
    devices: tuple[str, ...]  # the device IDs the kubelet allocated
    envs: Mapping[str, str]
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class Started:
    """One container of a pod: how it was started and what it saw."""

    name: str
    container: Container  # what containerd was asked to create
    allocations: tuple[Allocation, ...]
    handler: Handler | None  # None: containerd does not run here
    argv: tuple[str, ...] = ()  # the `ctr` command
    running: bool = False
    seen: Mapping[str, list[str]] | None = None  # what it printed (testbed.view)
    error: str = ""  # why it did not start or run
    runtime_log: tuple[str, ...] = ()  # what gpuwire-runtime said about it


def cri_annotations(pod: Obj, container: str, image: str, sandbox: str) -> dict[str, str]:
    """The annotations containerd's CRI plugin writes on a container's spec
    (pkg/cri/annotations DefaultCRIAnnotations)."""
    meta = pod["metadata"]
    return {
        "io.kubernetes.cri.sandbox-id": sandbox,
        "io.kubernetes.cri.sandbox-namespace": meta["namespace"],
        "io.kubernetes.cri.sandbox-uid": meta["uid"],
        "io.kubernetes.cri.sandbox-name": meta["name"],
        "io.kubernetes.cri.container-name": container,
        "io.kubernetes.cri.image-name": image,
        "io.kubernetes.cri.container-type": "container",
    }


def container_options(
    pod: Obj,
    spec: Obj,
    allocations: Sequence[Allocation],
    sandbox: str,
    handler: Handler | None,
) -> Container:
    """What the kubelet passes to the CRI for container `spec`, and containerd then runs.

    Env: the kubelet lists the device plugins' envs before the pod's (a later entry wins in
    the process env, over the image's own)."""
    env: dict[str, str] = {}
    for allocation in allocations:
        env |= allocation.envs
    env |= {e["name"]: e["value"] for e in spec.get("env", [])}
    return Container(
        image=spec["image"],
        args=(*spec.get("command", ()), *spec.get("args", ())),
        runtime=handler.runtime_type if handler else RUNC_SHIM,
        runc_binary=handler.binary if handler else None,
        annotations=cri_annotations(pod, spec["name"], spec["image"], sandbox),
        mounts=tuple(m for a in allocations for m in a.mounts),
        env=env,
    )


def allocate(cluster: Cluster, pod: Obj, spec: Obj) -> tuple[Allocation, ...]:
    """The device plugin resources in `spec`'s limits, allocated through the kubelet."""
    limits = (spec.get("resources") or {}).get("limits") or {}
    out = []
    uid = pod["metadata"]["uid"]
    for resource, count in limits.items():
        if resource not in cluster.kubelet.plugins:
            continue
        devices, answer = cluster.kubelet.admit(resource, int(count), uid, spec["name"])
        out.append(
            Allocation(
                resource,
                tuple(cluster.kubelet.hints.get((uid, spec["name"]), ())),
                tuple(devices),
                dict(answer.envs),
                tuple(Mount(Path(m.host_path), m.container_path) for m in answer.mounts),
            )
        )
    return tuple(out)


def handler_for(cluster: Cluster, pod: Obj) -> Handler:
    """The pod's RuntimeClass handler (containerd's default without one), as containerd has
    it configured. KeyError names what is missing, as the kubelet would fail the pod."""
    name = pod["spec"].get("runtimeClassName")
    handler = cluster.default_handler
    if name:
        runtime_class = cluster.api.get("runtimeclasses", name)
        if runtime_class is None:
            raise KeyError(f'RuntimeClass "{name}" not found')
        handler = runtime_class["handler"]
    if handler not in cluster.handlers:
        raise KeyError(f"no runtime for {handler!r} is configured")
    return cluster.handlers[handler]


def _runtime_log(cluster: Cluster, offset: int, cid: str) -> tuple[str, ...]:
    """What gpuwire-runtime logged about container `cid` after `offset`."""
    if not cluster.runtime_log.exists():
        return ()
    with cluster.runtime_log.open() as f:
        f.seek(offset)
        lines = f.read().splitlines()
    mark = f" {cid}: "
    return tuple(line.split(mark, 1)[1] for line in lines if mark in line)


def start(
    cluster: Cluster,
    name: str,
    container: Container,
    allocations: tuple[Allocation, ...],
    handler: Handler,
) -> Started:
    """`ctr run --detach` through `handler`'s runtime; once the container has printed what it
    sees (or has stopped), what it printed."""
    containerd = cluster.containerd
    assert containerd is not None
    cid = f"gpuwire-demo-{secrets.token_hex(6)}"
    log = cluster.workdir / "logs" / f"{cid}.log"
    log.parent.mkdir(exist_ok=True)
    offset = cluster.runtime_log.stat().st_size if cluster.runtime_log.exists() else 0
    out = containerd.run_detached(container, cid, log)
    ctr = ("ctr", "--address", str(containerd.address), "--namespace", containerd.namespace)
    argv = (*ctr, *containerd.run_argv(container, cid, detach=True, log=log))

    def printed() -> str:
        return log.read_text() if log.exists() else ""

    if out.returncode == 0:
        until(
            lambda: VIEWED in printed() or containerd.task_status(cid) != "RUNNING",
            f"container {name} to print what it sees",
        )
    running = containerd.task_status(cid) == "RUNNING"
    return Started(
        name,
        container,
        allocations,
        handler,
        argv=argv,
        running=running,
        seen=view(printed()) if VIEWED in printed() else None,
        error="" if running else (out.stderr.strip() or printed().strip() or "it exited"),
        runtime_log=_runtime_log(cluster, offset, cid),
    )


def start_container(cluster: Cluster, pod: Obj, spec: Obj, sandbox: str) -> Started:
    """One container: its devices, its runtime handler, then (where containerd runs) the
    container itself. A refusal on the way fails the container with the kubelet's reason."""
    name = spec["name"]
    try:
        allocations = allocate(cluster, pod, spec)
    except (KubeletError, grpc.RpcError) as exc:
        reason = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        refused = container_options(pod, spec, (), sandbox, None)
        return Started(name, refused, (), None, error=f"UnexpectedAdmissionError: {reason}")
    handler, error = None, "not run: containerd is not running here"
    if cluster.containerd is not None:
        try:
            handler = handler_for(cluster, pod)
        except KeyError as exc:
            error = str(exc.args[0])
    container = container_options(pod, spec, allocations, sandbox, handler)
    if handler is None:
        return Started(name, container, allocations, None, error=error)
    return start(cluster, name, container, allocations, handler)


def run_pod(cluster: Cluster, pod: Obj) -> tuple[Started, ...]:
    """Start the containers of a pod bound to the node, in order; they keep running. The
    pod's phase goes to the API server."""
    meta, spec = pod["metadata"], pod["spec"]
    names = [c["name"] for c in spec["containers"]]
    cluster.pod_resources.add_pod(meta["namespace"], meta["name"], meta["uid"], names)
    sandbox = secrets.token_hex(32)  # containerd's sandbox ids are 64 hex digits
    started = tuple(start_container(cluster, pod, c, sandbox) for c in spec["containers"])
    if cluster.containerd is not None:
        phase = "Running" if all(s.running for s in started) else "Failed"
        pod["status"] = {**pod.get("status", {}), "phase": phase}
        cluster.api.put(pod)
    return started
