"""A client of the kubelet's pod-resources API (`v1.PodResourcesLister`): which device IDs
the kubelet gave which container, which DRA claims' devices it prepared for which container
(`dynamic_resources`, GA from 1.36; the driver, pool and device of each, and a share's ID),
and which device IDs it can give at all.

The kubelet serves it on `/var/lib/kubelet/pod-resources/kubelet.sock` for monitoring agents.
A DaemonSet mounts the directory, not the socket: a restarting kubelet makes a new socket,
and a mount of the old one would go stale (kubernetes.io, "Device Plugins", section
"Monitoring device plugin resources").
`GetAllocatableResources` is GA since Kubernetes 1.28; an older kubelet without it answers
UNIMPLEMENTED, and what it can give is then only known from what it gave.
"""

from __future__ import annotations

import grpc

from deviceplugin.api import podresources_pb2, podresources_pb2_grpc
from gpuwire.holders import Assignment, Claimed

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
TIMEOUT = 5.0

Allocatable = list[tuple[str, tuple[str, ...]]]


class PodResourcesError(RuntimeError):
    """The kubelet's pod-resources API did not answer; the message says where and why."""


def read(
    socket: str, timeout: float = TIMEOUT
) -> tuple[list[Assignment], Allocatable, list[Claimed]]:
    """Every container's device IDs (`List`), every device ID the kubelet knows, and every
    container's DRA devices."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        try:
            listed = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=timeout)
            allocatable = _allocatable(stub, timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(f"pod-resources API at {socket}: {exc.details()}") from None
    assignments = [
        Assignment(pod.namespace, pod.name, container.name, d.resource_name, tuple(d.device_ids))
        for pod in listed.pod_resources
        for container in pod.containers
        for d in container.devices
    ]
    claimed = [
        Claimed(pod.namespace, pod.name, container.name, r.driver_name, r.pool_name,
                r.device_name, r.share_id if r.HasField("share_id") else None,
                f"{dynamic.claim_namespace}/{dynamic.claim_name}")
        for pod in listed.pod_resources
        for container in pod.containers
        for dynamic in container.dynamic_resources
        for r in dynamic.claim_resources
    ]  # fmt: skip
    return assignments, allocatable, claimed


def _allocatable(stub: podresources_pb2_grpc.PodResourcesListerStub, timeout: float) -> Allocatable:
    request = podresources_pb2.AllocatableResourcesRequest()
    try:
        answer = stub.GetAllocatableResources(request, timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return []
        raise
    return [(d.resource_name, tuple(d.device_ids)) for d in answer.devices]
