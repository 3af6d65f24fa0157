"""The v1beta1 `DevicePlugin` service for one resource: a thin protocol layer over the pure
modules (`allocate`, the node's vendor's preferred allocation) and the shared health state."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import grpc

from deviceplugin.api import api_pb2
from deviceplugin.gpus.state import HealthState
from deviceplugin.plugin.allocate import AllocateError, Strategies, granted, response
from deviceplugin.plugin.preferred import PreferenceError
from deviceplugin.plugin.resources import Resource
from deviceplugin.vendors import NodeVendor
from gpuwire import allocation
from gpuwire.grant import GrantError, KeyRing

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def _abort(context: Any, code: Any, message: str) -> NoReturn:
    log.warning("%s: %s", code.name, message)
    context.abort(code, message)
    raise AssertionError("grpc's abort raises")  # pragma: no cover


class DevicePluginService:
    def __init__(
        self,
        resource: Resource,
        health: HealthState,
        *,
        vendor: NodeVendor,
        allocation_dir: str,
        grant_key_dir: str,
        strategies: Strategies,
        control_nodes: Sequence[str] = (),
        pre_start_check: bool = False,
    ) -> None:
        self.resource = resource
        self.health = health
        self.vendor = vendor
        self.allocation_dir = allocation_dir
        self.grant_key_dir = grant_key_dir
        self.strategies = strategies
        self.control_nodes = tuple(control_nodes)
        self.options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start_check, get_preferred_allocation_available=True
        )
        self.closing = threading.Event()  # set while the server stops: streams end at once

    def snapshot(self, unhealthy: frozenset[str]) -> api_pb2.ListAndWatchResponse:
        """The complete device list, as the kubelet expects on every ListAndWatch message."""
        resource = self.resource
        devices = []
        for gpu in resource.gpus:
            health = UNHEALTHY if gpu.uuid in unhealthy else HEALTHY
            topology = (
                api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu.numa_node)])
                if gpu.numa_node >= 0
                else None
            )
            for device_id in resource.ids_of(gpu):
                devices.append(api_pb2.Device(ID=device_id, health=health, topology=topology))
        return api_pb2.ListAndWatchResponse(devices=devices)

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: Any) -> Any:
        return self.options

    def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        context.add_callback(self.health.wake)  # a cancelled stream ends at once
        for unhealthy in self.health.watch(
            lambda: self.closing.is_set() or not context.is_active()
        ):
            yield self.snapshot(unhealthy)

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        resource = self.resource  # one answer from one resource, however MIG changes meanwhile
        answers = []
        for req in request.container_requests:
            try:
                ids = self.vendor.preferred(
                    resource,
                    req.available_deviceIDs,
                    req.must_include_deviceIDs,
                    req.allocation_size,
                )
            except PreferenceError as exc:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{resource.name}: {exc}")
            answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        """One answer per container; if any container's request is refused, the whole call
        fails and the tokens already written for the others are removed."""
        resource = self.resource
        unhealthy = self.health.unhealthy()
        keys = KeyRing.load(self.grant_key_dir)
        answers = []
        tokens: list[str] = []
        try:
            for req in request.container_requests:
                gpus = granted(resource, req.devices_ids, unhealthy)
                share = resource.share_of(gpus[0]) if len(gpus) == 1 else None
                token = allocation.write(
                    self.allocation_dir, resource.name, [g.uuid for g in gpus], keys, share
                ).token
                tokens.append(token)
                answers.append(
                    response(
                        gpus,
                        token,
                        self.allocation_dir,
                        self.strategies,
                        self.control_nodes,
                        resource.mig,
                        share,
                        self.vendor.vendor,
                    )
                )
                log.info(
                    "allocated %s GPU %s (token %s)",
                    resource.name,
                    ",".join(str(g.index) for g in gpus),
                    token,
                )
        except (AllocateError, GrantError, OSError) as exc:
            for token in tokens:
                allocation.remove(self.allocation_dir, token)
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if isinstance(exc, AllocateError)
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            _abort(context, code, f"{resource.name}: {exc}")
        return api_pb2.AllocateResponse(container_responses=answers)

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        """With the pre-start check on, a container does not (re)start on a device that has
        become unhealthy since it was allocated."""
        if self.options.pre_start_required:
            try:
                granted(self.resource, request.devices_ids, self.health.unhealthy())
            except AllocateError as exc:
                _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"{self.resource.name}: {exc}")
        return api_pb2.PreStartContainerResponse()
