"""The fleet from the cluster: a list + watch of its Nodes.

An admission must not wait on the API server (mutating webhooks run in sequence, on every pod
create), so the webhook lists Nodes once, then follows a watch, and publishes an immutable
`Fleet` snapshot after each event. Readers take `current` without a lock. A watch that
expires (410 Gone) or breaks is followed by a fresh list, with backoff while the API server
is away; until the first list succeeds the webhook is not ready.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client, watch

from webhook.fleet import Fleet

log = logging.getLogger(__name__)
_new_watch: Any = watch.Watch  # untyped in the client


class NodeWatch:
    """The cluster's GPU nodes, kept current by a watch in a background thread."""

    def __init__(self, api: client.CoreV1Api, timeout_seconds: int = 300) -> None:
        self.api: Any = api  # the client's methods are untyped
        self.timeout_seconds = timeout_seconds
        self._current = Fleet()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._nodes: dict[str, Mapping[str, Any]] = {}
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name="gpuwire-node-watch", daemon=True)

    @property
    def current(self) -> Fleet:
        return self._current

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the watch; a watch request still being set up is stopped once it is."""
        self._stop.set()
        deadline = time.monotonic() + 5
        while self._thread.is_alive() and time.monotonic() < deadline:
            if self._watch is not None:
                self._watch.stop()
            self._thread.join(0.05)

    def refresh(self) -> None:
        """Nothing to poll: the watch pushes."""

    def _publish(self) -> None:
        """A new snapshot only when the GPU nodes changed: most events are heartbeats or nodes
        without GPUs, and what admissions resolved against a snapshot is kept with it."""
        found = Fleet.of(self._nodes.values())
        if found != self._current:
            self._current = found

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.5
                self._follow(version)
            except client.ApiException as exc:
                if exc.status == 410:
                    log.info("node watch: history expired (410); relisting")
                else:
                    log.warning("node watch: API error %s %s; relisting", exc.status, exc.reason)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30)
            except Exception as exc:  # the API server away, a reset connection: relist later
                if self._stop.is_set():
                    return
                log.warning("node watch: %s; relisting in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _list(self) -> str:
        response = self.api.list_node(_preload_content=False)
        body = json.loads(response.data)
        self._nodes = {n["metadata"]["name"]: n for n in body.get("items") or []}
        self._publish()
        self._synced.set()
        log.info("node watch: %d GPU node(s) of %d", len(self._current.nodes), len(self._nodes))
        return str(body["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> None:
        """Apply watch events from `version` until the watch ends; returns to relist."""
        while not self._stop.is_set():
            self._watch = _new_watch()
            for event in self._watch.stream(
                self.api.list_node,
                resource_version=version,
                timeout_seconds=self.timeout_seconds,
                allow_watch_bookmarks=True,
            ):
                obj = event["raw_object"]
                version = obj["metadata"].get("resourceVersion", version)
                name = obj["metadata"].get("name")
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._nodes[name] = obj
                elif event["type"] == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    continue  # BOOKMARK: only the version moves
                self._publish()
