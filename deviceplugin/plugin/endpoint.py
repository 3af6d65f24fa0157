"""One resource's gRPC server on its unix socket in the kubelet's device plugin directory,
and its registration with the kubelet (serve first: the kubelet dials back at once)."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from deviceplugin.api import api_pb2, api_pb2_grpc
from deviceplugin.plugin.service import DevicePluginService
from deviceplugin.sockets import identity, listen

log = logging.getLogger(__name__)

VERSION = "v1beta1"
REGISTER_TIMEOUT = 5.0


class Endpoint:
    def __init__(self, service: DevicePluginService, kubelet_dir: str | os.PathLike[str]) -> None:
        self.service = service
        self.path = Path(kubelet_dir, service.resource.socket_name)
        self._server: grpc.Server | None = None
        self._identity: tuple[int, int, int] | None = None

    @property
    def resource(self) -> str:
        return self.service.resource.name

    def serve(self) -> None:
        self.path.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        listen(server, self.path, self.resource)
        self.service.closing.clear()
        server.start()
        self._server = server
        self._identity = identity(self.path)
        log.info("serving %s on %s", self.resource, self.path)

    def serving(self) -> bool:
        """Whether our socket is still the one at our path (the kubelet deletes it on restart)."""
        return self._server is not None and identity(self.path) == self._identity

    def register(self, kubelet_socket: Path) -> None:
        """Register with the kubelet; grpc.RpcError if it refuses or does not answer."""
        request = api_pb2.RegisterRequest(
            version=VERSION,
            endpoint=self.path.name,
            resource_name=self.resource,
            options=self.service.options,
        )
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT)
        log.info("registered %s with the kubelet as %s", self.resource, self.path.name)

    def stop(self) -> None:
        """Stop serving (open streams end) and remove our socket, if it is still ours."""
        if self._server is None:
            return
        self.service.closing.set()
        self.service.health.wake()
        self._server.stop(grace=0.5).wait()  # in-flight Allocate calls may finish
        if identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        self._server = None
