"""The DRA plugin's two sockets and their lifecycle with the kubelet's plugin watcher.

`<kubelet>/plugins/<driver>/dra.sock` serves the DRA services; it is served first, because
the kubelet may call as soon as it learns the endpoint. Then `<kubelet>/plugins_registry/
<driver>-reg.sock` serves `Registration`: the kubelet watches that directory (inotify), calls
GetInfo on a new socket and answers with NotifyRegistrationStatus. A restarted kubelet finds
the socket there and registers it again, so registration needs nothing from the plugin but
its socket; if either socket is removed (by hand, by a cleanup), the plugin notices within a
quarter second and makes it again, the DRA socket before the registration one. On stop both
are removed, if they are still ours; a stale socket of an earlier run is replaced at start.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import pluginregistration_pb2_grpc
from deviceplugin.dra.service import RegistrationService
from deviceplugin.sockets import identity, listen

log = logging.getLogger(__name__)

KUBELET_DIR = "/var/lib/kubelet"
TICK = 0.25


class Sockets:
    def __init__(self, kubelet_dir: str | os.PathLike[str], driver: str) -> None:
        self.plugin_dir = Path(kubelet_dir, "plugins", driver)
        self.dra = self.plugin_dir / "dra.sock"
        self.registry = Path(kubelet_dir, "plugins_registry")
        self.registration = self.registry / f"{driver}-reg.sock"


class _Served:
    """One gRPC server on one socket, and whether the socket there is still its own."""

    def __init__(self, path: Path, what: str, add: Callable[[Any], None]) -> None:
        self.path = path
        self.what = what
        self.add = add
        self.server: grpc.Server | None = None
        self.identity: tuple[int, int, int] | None = None

    def start(self) -> None:
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="dra"))
        self.add(server)
        listen(server, self.path, self.what)
        server.start()
        self.server, self.identity = server, identity(self.path)
        log.info("serving %s on %s", self.what, self.path)

    def ours(self) -> bool:
        return self.server is not None and identity(self.path) == self.identity

    def stop(self) -> None:
        if self.server is None:
            return
        self.server.stop(grace=0.5).wait()
        if identity(self.path) == self.identity:
            self.path.unlink(missing_ok=True)
        self.server = None


class Endpoint:
    def __init__(
        self,
        sockets: Sockets,
        add_services: Callable[[Any], None],
        registration: RegistrationService,
        closing: threading.Event,
    ) -> None:
        self.sockets = sockets
        self.closing = closing  # set while stopping: health streams end at once
        self.registration = registration
        self._dra = _Served(sockets.dra, "the DRA services", add_services)
        self._reg = _Served(
            sockets.registration,
            "plugin registration",
            lambda s: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
                registration, s
            ),
        )

    def serve(self) -> None:
        self.closing.clear()
        self._dra.start()
        self._reg.start()

    def check(self) -> None:
        """Serve again whatever socket is no longer ours (the DRA one first)."""
        if not self._dra.ours():
            log.warning("%s is gone: serving it and registering again", self.sockets.dra)
            self.stop()
            self.serve()
        elif not self._reg.ours():
            log.warning("%s is gone: registering again", self.sockets.registration)
            self._reg.stop()
            self._reg.start()

    def stop(self) -> None:
        """Registration first (the kubelet stops calling), then the DRA services."""
        self.closing.set()
        self._reg.stop()
        self._dra.stop()

    def run(self, stop: threading.Event) -> None:
        """Serve and keep serving until `stop` is set; the sockets are gone when it returns."""
        self.serve()
        try:
            while not stop.wait(TICK):
                self.check()
        finally:
            self.stop()
