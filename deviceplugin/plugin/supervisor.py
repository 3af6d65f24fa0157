"""Keeps every endpoint served and registered, across kubelet restarts.

A restarting kubelet deletes every socket in its device plugin directory, then creates a new
`kubelet.sock`; a plugin that does not notice disappears from the node (capacity drops to 0
after the kubelet's grace period). The loop is level-triggered: on every wake-up it compares
what is on disk with what it last saw (our sockets still ours? `kubelet.sock` the same file?),
serves again where a socket is gone and registers where needed. inotify wakes it within
milliseconds of a change; without events it still looks every quarter second (which is also
how soon it notices that it should stop), and a registration the kubelet refused (not up
yet) is retried every half second. A file is told from its successor by device, inode and
ctime in nanoseconds, so a recreated `kubelet.sock` that reuses the old inode still counts
as new. Endpoints `add`ed while it runs (a resource that a MIG change brought) are served
and registered at its next wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import grpc

from deviceplugin import inotify
from deviceplugin.plugin.endpoint import Endpoint
from deviceplugin.sockets import identity

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
TICK = 0.25  # longest wait without an event: how soon `stop` is noticed
RETRY = 0.5  # between registrations the kubelet refused
_WATCH = (
    inotify.IN_CREATE
    | inotify.IN_DELETE
    | inotify.IN_MOVED_TO
    | inotify.IN_MOVED_FROM
    | inotify.IN_DELETE_SELF
    | inotify.IN_MOVE_SELF
)
_WATCH_GONE = inotify.IN_IGNORED | inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF


class Supervisor:
    def __init__(self, endpoints: list[Endpoint], kubelet_dir: str) -> None:
        self.endpoints = endpoints
        self.kubelet_dir = Path(kubelet_dir)
        self.kubelet_socket = self.kubelet_dir / KUBELET_SOCKET
        self._kubelet: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self._added: list[Endpoint] = []

    def add(self, endpoint: Endpoint) -> None:
        """Serve and register one more endpoint (from any thread)."""
        with self._lock:
            self._added.append(endpoint)

    def _take_added(self) -> list[Endpoint]:
        with self._lock:
            added, self._added = self._added, []
        for endpoint in added:
            endpoint.serve()
        self.endpoints += added
        return added

    def run(self, stop: threading.Event) -> None:
        """Serve, register, and keep it so until `stop` is set; then remove our sockets."""
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        watch: inotify.Watch | None = None
        self._kubelet = identity(self.kubelet_socket)
        pending = list(self.endpoints)
        retry_at = 0.0
        try:
            for endpoint in self.endpoints:
                endpoint.serve()
            while not stop.is_set():
                pending += self._take_added()
                pending = self._reconcile(pending)
                if self._kubelet is not None and pending and time.monotonic() >= retry_at:
                    pending = [e for e in pending if not self._register(e)]
                    retry_at = time.monotonic() + RETRY if pending else 0.0
                if watch is None:
                    watch = _open_watch(self.kubelet_dir)
                if watch is None:
                    stop.wait(TICK)
                elif any(e.mask & _WATCH_GONE for e in watch.read(TICK)):
                    watch.close()  # the directory went away: watch it again once it is back
                    watch = None
        finally:
            for endpoint in self.endpoints:
                endpoint.stop()
            if watch is not None:
                watch.close()

    def _reconcile(self, pending: list[Endpoint]) -> list[Endpoint]:
        """Serve again where our socket is gone; all need registering with a new kubelet."""
        for endpoint in self.endpoints:
            if not endpoint.serving():
                log.warning("%s: socket gone (kubelet restart?); serving again", endpoint.path)
                endpoint.stop()
                self.kubelet_dir.mkdir(parents=True, exist_ok=True)  # in case it went too
                endpoint.serve()
                if endpoint not in pending:
                    pending = [*pending, endpoint]
        now = identity(self.kubelet_socket)
        if now != self._kubelet:
            self._kubelet = now
            if now is not None:
                log.info("%s is new: registering", self.kubelet_socket)
                pending = list(self.endpoints)
        return pending

    def _register(self, endpoint: Endpoint) -> bool:
        try:
            endpoint.register(self.kubelet_socket)
        except grpc.RpcError as exc:
            log.warning("registering %s failed: %s; retrying", endpoint.resource, exc.details())
            return False
        return True


def _open_watch(directory: Path) -> inotify.Watch | None:
    try:
        return inotify.Watch(directory, _WATCH)
    except OSError as exc:
        log.warning("cannot watch %s (%s); checking it every %ss", directory, exc, TICK)
        return None
