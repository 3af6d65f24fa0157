"""The gRPC services on the DRA socket: DRAPlugin v1 and v1beta1 over one `Preparer`, the
DRAResourceHealth stream (v1alpha1 and v1) over the node's health, and the plugin watcher's
Registration on the registration socket. A thin protocol layer: messages in, `prepared` and
`state` do the work, messages out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from deviceplugin.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
)
from deviceplugin.dra.checkpoint import PreparedClaim
from deviceplugin.dra.claims import ClaimRef
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.prepared import Preparer
from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.state import HealthState

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# What the kubelet may call, preferred first: it takes the first DRAPlugin it supports, and
# a v1beta1 connection loses `share_id` (kubelet pkg/kubelet/cm/dra/plugin).
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
HEALTH_RESEND = 10.0  # the kubelet marks a device Unknown after 30 s without a report
HEALTH_TIMEOUT = 30
MAX_MESSAGE = 1024


class DraPluginService:
    """NodePrepareResources / NodeUnprepareResources for one message module (v1, v1beta1)."""

    def __init__(self, preparer: Preparer, pb: ModuleType) -> None:
        self.preparer = preparer
        self.pb = pb

    def _refs(self, claims: Sequence[Any]) -> list[ClaimRef]:
        return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]

    def _answer(self, claim: PreparedClaim | str) -> Any:
        if isinstance(claim, str):
            return self.pb.NodePrepareResourceResponse(error=claim)
        devices = []
        for d in claim.devices:
            device = self.pb.Device(
                request_names=list(d.requests),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_ids),
            )
            if d.share_id is not None and self.pb is dra_v1_pb2:
                device.share_id = d.share_id
            devices.append(device)
        return self.pb.NodePrepareResourceResponse(devices=devices)

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        done = self.preparer.prepare(self._refs(request.claims))
        return self.pb.NodePrepareResourcesResponse(
            claims={uid: self._answer(claim) for uid, claim in done.items()}
        )

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        done = self.preparer.unprepare(self._refs(request.claims))
        return self.pb.NodeUnprepareResourcesResponse(
            claims={
                uid: self.pb.NodeUnprepareResourceResponse(error=error or "")
                for uid, error in done.items()
            }
        )


def health_message(device: DraDevice, causes: Mapping[str, Sequence[HealthEvent]]) -> str:
    events = causes.get(device.uuid, ())
    if not events:
        return ""
    text = "; ".join(e.detail for e in events)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class HealthService:
    """NodeWatchResources: the complete device list now, on every change, and at least every
    HEALTH_RESEND seconds, until the kubelet hangs up or the server stops."""

    def __init__(
        self,
        health: HealthState,
        pool: str,
        devices: Callable[[], Sequence[DraDevice]],
        pb: ModuleType,
        closing: threading.Event,
    ) -> None:
        self.health = health
        self.pool = pool
        self.devices = devices
        self.pb = pb
        self.closing = closing

    def snapshot(self) -> Any:
        causes = self.health.causes()
        now = int(time.time())
        return self.pb.NodeWatchResourcesResponse(
            devices=[
                self.pb.DeviceHealth(
                    device=self.pb.DeviceIdentifier(pool_name=self.pool, device_name=d.name),
                    health=self.pb.UNHEALTHY if d.uuid in causes else self.pb.HEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT,
                    message=health_message(d, causes),
                )
                for d in self.devices()
            ]
        )

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        context.add_callback(self.health.wake)
        done = lambda: self.closing.is_set() or not context.is_active()  # noqa: E731
        for _ in self.health.watch(done, every=HEALTH_RESEND):
            yield self.snapshot()


class RegistrationService:
    """The plugin watcher's `Registration`: who we are, and what the kubelet made of it."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver,
            endpoint=endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            self.error = ""
            self.registered.set()
            log.info("the kubelet registered DRA driver %s", self.info.name)
        else:
            self.error = request.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", self.info.name, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


def add_services(
    server: Any,
    preparer: Preparer,
    health: HealthState,
    pool: str,
    devices: Callable[[], Sequence[DraDevice]],
    closing: threading.Event,
) -> None:
    """Every service the DRA socket serves, as SUPPORTED_VERSIONS lists them."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraPluginService(preparer, dra_v1_pb2), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        DraPluginService(preparer, dra_v1beta1_pb2), server
    )
    for pb, grpc_module in (
        (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
        (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
    ):
        grpc_module.add_DRAResourceHealthServicer_to_server(
            HealthService(health, pool, devices, pb, closing), server
        )
