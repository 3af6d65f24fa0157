"""Keeps every endpoint served and registered, across kubelet restarts.

A restarting kubelet deletes every socket in its device plugin directory, then creates a new
`kubelet.sock`; a plugin that does not notice disappears from the node (capacity drops to 0
after the kubelet's grace period). The loop is level-triggered: on every wake-up it compares
what is on disk with what it last saw (our sockets still ours? `kubelet.sock` the same file?),
serves again where a socket is gone and registers where needed. inotify wakes it within
milliseconds of a change; without events it still looks once a second, and a registration
the kubelet refused (not up yet) is retried every half second.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from deviceplugin import inotify
from deviceplugin.endpoint import Endpoint, identity

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
POLL = 1.0
RETRY = 0.5
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
        self.registrations = 0  # successful Register calls, for logs and tests

    def run(self, stop: threading.Event) -> None:
        """Serve, register, and keep it so until `stop` is set; then remove our sockets."""
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        watch: inotify.Watch | None = None
        kubelet = identity(self.kubelet_socket)
        pending = list(self.endpoints)
        try:
            for endpoint in self.endpoints:
                endpoint.serve()
            while not stop.is_set():
                for endpoint in self.endpoints:
                    if not endpoint.serving():
                        log.warning(
                            "%s: socket gone (kubelet restart?); serving again", endpoint.path
                        )
                        endpoint.stop()
                        endpoint.serve()
                        if endpoint not in pending:
                            pending.append(endpoint)
                now = identity(self.kubelet_socket)
                if now != kubelet:
                    kubelet = now
                    if now is not None:
                        log.info("%s is new: registering again", self.kubelet_socket)
                        pending = list(self.endpoints)
                if kubelet is not None:
                    pending = [e for e in pending if not self._register(e)]
                if watch is None:
                    watch = _open_watch(self.kubelet_dir)
                timeout = RETRY if pending else POLL
                if watch is None:
                    stop.wait(timeout)
                    continue
                events = watch.read(timeout)
                if any(e.mask & _WATCH_GONE for e in events):
                    watch.close()
                    watch = None
                if any(e.name == KUBELET_SOCKET and e.mask & inotify.IN_CREATE for e in events):
                    kubelet = None  # recreated, even if the new file got the old inode
        finally:
            for endpoint in self.endpoints:
                endpoint.stop()
            if watch is not None:
                watch.close()

    def _register(self, endpoint: Endpoint) -> bool:
        try:
            endpoint.register(self.kubelet_socket)
        except grpc.RpcError as exc:
            log.warning("registering %s failed: %s; retrying", endpoint.resource, exc.details())
            return False
        self.registrations += 1
        return True


def _open_watch(directory: Path) -> inotify.Watch | None:
    try:
        return inotify.Watch(directory, _WATCH)
    except OSError as exc:
        log.warning("cannot watch %s (%s); checking it every %ss", directory, exc, POLL)
        return None
