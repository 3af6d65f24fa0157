"""A stand-in for the kubelet's pod-resources API (`v1.PodResourcesLister`) over a real unix
socket, for the node agent's tests.

It answers as the kubelet's podresources server does: `List` has every active pod with each
of its containers, devices or none, and for each container the device IDs its device plugin
allocated, per resource; `GetAllocatableResources` has every device ID of every registered
resource; `Get` has one pod, or an error naming it. The devices come from where the kubelet
takes them, its device manager: given a `testbed.kubelet.Kubelet`, the allocations it made
(`admit`) and the devices its plugins advertise; `assign` and `advertise` add more by hand.
A container's DRA devices (`dynamic_resources`: per claim, each device's driver, pool,
name, CDI ids and share ID) are what the kubelet's DRA manager prepared for it: `claim` adds
them, from a claim's allocation as the kubelet stand-in for DRA prepared it.
`allocatable=False` makes `GetAllocatableResources` UNIMPLEMENTED, like a kubelet before it
existed. Left out: CPU and memory, topology, the rate limit.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import podresources_pb2 as pb
from deviceplugin.api import podresources_pb2_grpc
from testbed.kubelet import Kubelet


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    containers: list[str]
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container → ids
    claims: dict[str, list[pb.DynamicResource]] = field(default_factory=dict)  # container → DRA


class PodResourcesKubelet:
    def __init__(
        self, socket: Path, kubelet: Kubelet | None = None, *, allocatable: bool = True
    ) -> None:
        self.socket = socket
        self.kubelet = kubelet
        self.implements_allocatable = allocatable
        self.pods: dict[str, Pod] = {}
        self.advertised: dict[str, list[str]] = {}
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._server: Any = None

    def __enter__(self) -> PodResourcesKubelet:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=0).wait()
        self.socket.unlink(missing_ok=True)

    # --- what the tests set up -------------------------------------------------------------

    def add_pod(self, namespace: str, name: str, uid: str, containers: list[str]) -> None:
        with self._lock:
            self.pods[uid] = Pod(namespace, name, uid, containers)

    def remove_pod(self, uid: str) -> None:
        with self._lock:
            self.pods.pop(uid, None)

    def assign(self, uid: str, container: str, resource: str, ids: list[str]) -> None:
        """Devices of a plugin the kubelet stand-in does not run (NVIDIA's, say)."""
        with self._lock:
            self.pods[uid].devices.setdefault(container, {})[resource] = ids

    def claim(
        self, uid: str, container: str, claim: dict[str, Any], cdi_ids: dict[str, list[str]]
    ) -> None:
        """A DRA claim of the pod (its allocation) prepared for `container`; `cdi_ids`:
        device name → the CDI ids its plugin answered."""
        results = claim["status"]["allocation"]["devices"]["results"]
        resources = [
            pb.ClaimResource(
                cdi_devices=[pb.CDIDevice(name=i) for i in cdi_ids.get(r["device"], [])],
                driver_name=r["driver"],
                pool_name=r["pool"],
                device_name=r["device"],
                share_id=r.get("shareID"),
            )
            for r in results
        ]
        meta = claim["metadata"]
        dynamic = pb.DynamicResource(claim_name=meta["name"], claim_namespace=meta["namespace"],
                                     claim_resources=resources)  # fmt: skip
        with self._lock:
            self.pods[uid].claims.setdefault(container, []).append(dynamic)

    def advertise(self, resource: str, ids: list[str]) -> None:
        with self._lock:
            self.advertised[resource] = ids

    # --- the device manager's view ---------------------------------------------------------

    def _devices(self, pod: Pod, container: str) -> list[pb.ContainerDevices]:
        found = dict(pod.devices.get(container, {}))
        if self.kubelet is not None:
            for entry in self.kubelet.entries:
                if (entry["PodUID"], entry["ContainerName"]) == (pod.uid, container):
                    found.setdefault(entry["ResourceName"], []).extend(entry["DeviceIDs"]["-1"])
        return [pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in found.items()]

    def _pod(self, pod: Pod) -> pb.PodResources:
        containers = [
            pb.ContainerResources(
                name=c, devices=self._devices(pod, c), dynamic_resources=pod.claims.get(c, [])
            )
            for c in pod.containers
        ]
        return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    # --- PodResourcesLister ----------------------------------------------------------------

    def List(
        self, request: pb.ListPodResourcesRequest, context: Any
    ) -> pb.ListPodResourcesResponse:
        with self._lock:
            self.calls.append("List")
            return pb.ListPodResourcesResponse(
                pod_resources=[self._pod(p) for p in self.pods.values()]
            )

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        with self._lock:
            self.calls.append("GetAllocatableResources")
            if not self.implements_allocatable:
                context.abort(
                    grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources"
                )
            devices = dict(self.advertised)
            if self.kubelet is not None:
                for resource, plugin in self.kubelet.plugins.items():
                    devices.setdefault(resource, []).extend(d.ID for d in plugin.devices)
        return pb.AllocatableResourcesResponse(
            devices=[
                pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices.items()
            ]
        )

    def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        with self._lock:
            self.calls.append("Get")
            for pod in self.pods.values():
                if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                    return pb.GetPodResourcesResponse(pod_resources=self._pod(pod))
        context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} not found in namespace {request.pod_namespace}",
        )
        raise AssertionError("abort raises")
