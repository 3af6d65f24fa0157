"""A kubelet stand-in for device plugin tests, over real unix sockets.

It does what the kubelet's device manager does (kubernetes/kubernetes
`pkg/kubelet/cm/devicemanager/manager.go`, `endpoint.go`; kubernetes.io "Device Plugins"):
serves `v1beta1.Registration` on `kubelet.sock`; on Register checks the version and the
resource name, answers, then dials the plugin back on `<dir>/<endpoint>` in the background,
asks `GetDevicePluginOptions` and keeps a `ListAndWatch` stream open, taking every message as
the complete device list (capacity = all, allocatable = healthy). `admit` allocates for one
container the kubelet's way: healthy minus allocated, `GetPreferredAllocation` if the plugin
offers it (its answer is a hint: intersected with what is free, then filled up), `Allocate`
with exactly one container request, `PreStartContainer` if the plugin asks for it; and it
writes `kubelet_internal_checkpoint` with the pod's entries and the serialized answer, as the
kubelet does. `restart` is a new kubelet instance: every socket in the directory is deleted,
then `kubelet.sock` is created again. The Topology Manager is left out (policy `none`, the
default), so there is no NUMA filtering before GetPreferredAllocation.
"""

from __future__ import annotations

import base64
import json
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import api_pb2, api_pb2_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"
_EXTENDED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class KubeletError(RuntimeError):
    """What the kubelet would report as an admission failure."""


@dataclass
class Plugin:
    """The kubelet's view of one registered resource."""

    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    channel: Any
    stub: Any
    snapshots: list[list[api_pb2.Device]] = field(default_factory=list)
    allocated: set[str] = field(default_factory=set)
    stream_ended: bool = False

    @property
    def devices(self) -> list[api_pb2.Device]:
        return self.snapshots[-1] if self.snapshots else []

    def healthy(self) -> set[str]:
        return {d.ID for d in self.devices if d.health == "Healthy"}

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        return len(self.healthy())


class Kubelet:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "kubelet.sock"
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.plugins: dict[str, Plugin] = {}
        self.entries: list[dict[str, Any]] = []  # checkpoint PodDeviceEntries
        # GetPreferredAllocation's answers by (pod UID, container), before the kubelet's fill
        self.hints: dict[tuple[str, str], list[str]] = {}
        self._cond = threading.Condition()
        self._admitting = threading.Lock()
        self._server: Any = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Kubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None
        for plugin in self.plugins.values():
            plugin.channel.close()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """A new kubelet instance: it forgets its plugins (not the allocations its checkpoint
        holds), deletes every socket in the device plugin directory (CleanupPluginDirectory),
        then serves a new `kubelet.sock`."""
        self.stop()
        with self._cond:
            self.plugins = {}
        for entry in self.directory.iterdir():
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
        self.start()

    def __enter__(self) -> Kubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- Registration service ----------------------------------------------------------------

    def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        if request.version not in SUPPORTED_VERSIONS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Unsupported version {request.version!r}: supported {SUPPORTED_VERSIONS}",
            )
        if not _EXTENDED.match(request.resource_name):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid extended resource name {request.resource_name!r}",
            )
        with self._cond:
            self.registrations.append(request)
            number = len(self.registrations)
        # like the device manager (plugin/v1beta1/server.go, Register → connectClient): dial
        # the plugin back and ask its options before answering, so that a plugin it cannot
        # reach hears the registration failed (and registers again); ListAndWatch then runs
        # in the background
        channel = grpc.insecure_channel(f"unix://{self.directory / request.endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10,
                                                  wait_for_ready=True)  # fmt: skip
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial the plugin back: {exc}")
        plugin = Plugin(request.resource_name, request.endpoint, options, channel, stub)
        threading.Thread(target=self._connect, args=(plugin, number), daemon=True).start()
        return api_pb2.Empty()

    def _connect(self, plugin: Plugin, number: int) -> None:
        """Take on a registered plugin and follow its ListAndWatch; `number`: its
        registration's, the newest of a resource's wins (not the one handled last)."""
        resource = plugin.resource
        with self._cond:
            if [r for r in self.registrations[number:] if r.resource_name == resource]:
                plugin.channel.close()
                return
            old = self.plugins.get(resource)
            if old is not None:  # the newest registration replaces the old endpoint
                plugin.allocated = old.allocated
                old.channel.close()
            else:  # a new kubelet: what its checkpoint holds stays allocated
                plugin.allocated = {
                    d for e in self.entries if e["ResourceName"] == resource
                    for d in e["DeviceIDs"]["-1"]
                }  # fmt: skip
            self.plugins[resource] = plugin
            self._cond.notify_all()
        try:
            for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                with self._cond:
                    plugin.snapshots.append(list(response.devices))
                    self._cond.notify_all()
        except grpc.RpcError:
            pass
        with self._cond:
            plugin.stream_ended = True
            self._cond.notify_all()

    # --- what the tests wait for -------------------------------------------------------------

    def wait(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Wait until `predicate()` is truthy (evaluated under the kubelet's lock)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (result := predicate()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"kubelet stand-in: condition not met in {timeout}s")
                self._cond.wait(left)
            return result

    def plugin(self, resource: str, timeout: float = 10.0) -> Plugin:
        """The plugin for `resource` once it has sent its first device list."""
        plugin: Plugin = self.wait(
            lambda: (p := self.plugins.get(resource)) and p.snapshots and p, timeout
        )
        return plugin

    def next_snapshot(
        self, plugin: Plugin, after: int, timeout: float = 10.0
    ) -> list[api_pb2.Device]:
        """The first device list the plugin sends after its first `after` ones."""
        return list(
            self.wait(lambda: len(plugin.snapshots) > after and plugin.snapshots[after], timeout)
        )

    # --- admission ---------------------------------------------------------------------------

    def admit(
        self, resource: str, count: int, pod_uid: str = "pod-1", container: str = "main"
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """Allocate `count` devices of `resource` to one container, the way the kubelet does:
        one admission at a time (its pod workers admit pods one after another)."""
        with self._admitting:
            return self._admit(resource, count, pod_uid, container)

    def _admit(
        self, resource: str, count: int, pod_uid: str, container: str
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        plugin = self.plugin(resource)
        with self._cond:
            available = sorted(plugin.healthy() - plugin.allocated)
        if len(available) < count:
            raise KubeletError("requested number of devices unavailable")
        chosen: list[str] = []
        if count < len(available) and plugin.options.get_preferred_allocation_available:
            ask = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=count
                    )
                ]
            )
            hint = plugin.stub.GetPreferredAllocation(ask, timeout=5)
            preferred = list(hint.container_responses[0].deviceIDs)
            self.hints[(pod_uid, container)] = preferred
            chosen = [d for d in preferred if d in available][:count]
        chosen += [d for d in available if d not in chosen][: count - len(chosen)]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        )
        answer = plugin.stub.Allocate(request, timeout=5)
        if not answer.container_responses:
            raise KubeletError("no containers return in allocation response")
        response = answer.container_responses[0]
        with self._cond:
            plugin.allocated.update(chosen)
            self.entries.append(
                {
                    "PodUID": pod_uid,
                    "ContainerName": container,
                    "ResourceName": resource,
                    "DeviceIDs": {"-1": chosen},
                    "AllocResp": base64.b64encode(response.SerializeToString()).decode(),
                }
            )
            self._write_checkpoint()
        self.start_container(resource, chosen)
        return chosen, response

    def start_container(self, resource: str, ids: list[str]) -> None:
        """What the kubelet does before each container start (restarts included)."""
        plugin = self.plugin(resource)
        if plugin.options.pre_start_required:
            plugin.stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=30
            )

    def remove_pod(self, pod_uid: str) -> None:
        """The pod is gone: its devices are free and its entries leave the checkpoint."""
        with self._cond:
            gone = [e for e in self.entries if e["PodUID"] == pod_uid]
            self.entries = [e for e in self.entries if e["PodUID"] != pod_uid]
            for e in gone:
                if e["ResourceName"] in self.plugins:
                    self.plugins[e["ResourceName"]].allocated -= set(e["DeviceIDs"]["-1"])
            self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        registered = {r: sorted(p.healthy()) for r, p in self.plugins.items()}
        data: dict[str, Any] = {
            "Data": {"PodDeviceEntries": self.entries, "RegisteredDevices": registered},
            "Checksum": 0,  # the kubelet's is a hash of the Go struct; nothing reads it here
        }
        (self.directory / CHECKPOINT).write_text(json.dumps(data))
