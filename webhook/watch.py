"""What the webhook reads of the cluster, kept current: a list + watch of one resource.

An admission must not wait on the API server (mutating webhooks run in sequence, on every pod
create), so the webhook lists a resource once, then follows a watch, and publishes an
immutable snapshot after each event: the Nodes as the `Fleet`, gpuwire's ResourceSlices as
its `Pools`, gpuwire's ResourceClaimTemplates as the ones it knows exist. Readers take
`current` without a lock. A watch that expires (410 Gone) or breaks is followed by a fresh
list, with backoff while the API server is away; until the first list succeeds the webhook
is not ready. A resource the API server does not serve (404: `resource.k8s.io/v1` before
Kubernetes 1.34) counts as listed and empty, and is listed again every minute.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes import client, watch

from webhook.fleet import Fleet

log = logging.getLogger(__name__)
_new_watch: Any = watch.Watch  # untyped in the client
Snapshot = TypeVar("Snapshot")
NOT_SERVED_RETRY = 60.0


class ListWatch(Generic[Snapshot]):
    """One resource's objects, kept current by a watch in a background thread, as the
    snapshot `snapshot` makes of them (`empty` before the first list). `list_call` is the
    generated client's list function, `selectors` its `field_selector`/`label_selector`."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        snapshot: Callable[[Iterable[Mapping[str, Any]]], Snapshot],
        empty: Snapshot,
        timeout_seconds: int = 300,
        **selectors: str,
    ) -> None:
        self.name = name
        self.list_call = list_call
        self.snapshot = snapshot
        self.selectors = selectors
        self.timeout_seconds = timeout_seconds
        self._current = empty
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._objects: dict[str, Mapping[str, Any]] = {}
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"gpuwire-{name}", daemon=True)

    @property
    def current(self) -> Snapshot:
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
        """A new snapshot only when it differs: most events are heartbeats or objects the
        snapshot leaves out, and what admissions worked out against a snapshot is kept with
        it."""
        found = self.snapshot(self._objects.values())
        if found != self._current:
            self._current = found

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.5
                if version is None:
                    self._stop.wait(NOT_SERVED_RETRY)
                    continue
                self._follow(version)
            except client.ApiException as exc:
                if exc.status == 410:
                    log.info("%s: history expired (410); relisting", self.name)
                else:
                    log.warning("%s: API error %s %s; relisting", self.name, exc.status, exc.reason)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30)
            except Exception as exc:  # the API server away, a reset connection: relist later
                if self._stop.is_set():
                    return
                log.warning("%s: %s; relisting in %.1fs", self.name, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _list(self) -> str | None:
        """List and publish; the version to watch from, None where the API server does not
        serve the resource."""
        try:
            response = self.list_call(_preload_content=False, **self.selectors)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            self._objects = {}
            self._publish()
            self._synced.set()
            log.info("%s: not served by the API server; none", self.name)
            return None
        body = json.loads(response.data)
        self._objects = {_key(o["metadata"]): o for o in body.get("items") or []}
        self._publish()
        self._synced.set()
        log.info("%s: %d object(s) listed", self.name, len(self._objects))
        return str(body["metadata"]["resourceVersion"])

    def _follow(self, version: str) -> None:
        """Apply watch events from `version` until the watch ends; returns to relist."""
        while not self._stop.is_set():
            self._watch = _new_watch()
            for event in self._watch.stream(
                self.list_call,
                resource_version=version,
                timeout_seconds=self.timeout_seconds,
                allow_watch_bookmarks=True,
                **self.selectors,
            ):
                obj = event["raw_object"]
                version = obj["metadata"].get("resourceVersion", version)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._objects[_key(obj["metadata"])] = obj
                elif event["type"] == "DELETED":
                    self._objects.pop(_key(obj["metadata"]), None)
                else:
                    continue  # BOOKMARK: only the version moves
                self._publish()


def _key(meta: Mapping[str, Any]) -> str:
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta.get("name"))


class NodeWatch(ListWatch[Fleet]):
    """The cluster's GPU nodes (RBAC: get, list, watch on nodes)."""

    def __init__(self, api: client.CoreV1Api, timeout_seconds: int = 300) -> None:
        calls: Any = api  # the client's methods are untyped
        super().__init__("node watch", calls.list_node, Fleet.of, Fleet(), timeout_seconds)
