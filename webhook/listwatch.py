"""A resource's objects, each kept only as what a view makes of it: listed in pages, then watched.

What the webhook reads of the cluster (Nodes for the fleet; the DRA path's ResourceSlices)
lives as long as the process and is read on every admission, so it is kept small and is never
the client's model objects: the answers are read as raw JSON (orjson), each object is reduced
at once to its view (None: not of interest, nothing kept), and the JSON is dropped. The
protocol is client-go's reflector's ("Efficient detection of changes", "Retrieving large
results sets in chunks": kubernetes.io/docs/reference/using-api/api-concepts/):

- list with `limit` (PAGE) and follow `continue` until the list ends; every page comes from
  the snapshot of the first, and the watch starts at its `resourceVersion`. A page is parsed
  whole, and the views made of it stay spread over the memory its parse took, so a page's
  size is the RSS above what is kept: 100 where client-go's pager asks for 500 (at 10,000
  Nodes and their ResourceSlices, 250 cost 20 MiB more at ready: bench/webhook.py). A page
  that fails (a `continue` token expired: 410) restarts the list; the views of a list are
  published only once it is whole, so a reader never sees half.
- watch from that version with bookmarks; ADDED/MODIFIED/DELETED change the views, a
  BOOKMARK only the version; a watch that ends is resumed from the last version, one whose
  history is gone (410 Expired, an ERROR event or an answer) is followed by a new list, any
  other failure by a new list after a backoff (0.5 s doubling to 30 s).
- `metadata_only` asks for PartialObjectMetadata, as client-go's metadata client does
  (`application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json`
  for a list, `as=PartialObjectMetadata` for a watch: k8s.io/client-go/metadata/metadata.go),
  so spec and status (a Node's images, conditions) never cross the wire; a server that
  ignores it answers full objects, whose metadata is the same.

- `optional`: a resource the API server may not serve (404: `resource.k8s.io/v1` before
  Kubernetes 1.34) counts as listed and empty (synced), and is listed again every minute.

`snapshot(views)` makes `current`, what readers get, from the watch thread, after each whole
list and after each event that changed a view (views compare equal: a heartbeat that changes
nothing of a view makes nothing new); it gets the live mapping, to read at once, never to
keep. Until the first list, `current` is `empty`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import orjson
from kubernetes import client

log = logging.getLogger(__name__)

View = TypeVar("View")
Snapshot = TypeVar("Snapshot")
Obj = dict[str, Any]
PAGE = 100
LIST_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
WATCH_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
CONNECT_SECONDS = 10.0
NOT_SERVED_RETRY = 60.0


class NotServed(Exception):
    """The API server does not serve the resource (404)."""


class Expired(Exception):
    """The watch's history or the list's snapshot is gone (410): list again, at once."""


def _key(meta: Mapping[str, Any]) -> str:
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a watch answer (one JSON event each), as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line)
    if buffer.strip():
        yield buffer


class ListWatch(Generic[View, Snapshot]):
    """The views of one resource's objects, and the snapshot readers get of them, kept
    current by a background thread.

    `list_call` is the generated client's list function for the resource (it lists and, with
    `watch=True`, watches: `CoreV1Api.list_node`, `ResourceV1Api.list_resource_slice`); `view`
    makes what is kept of an object, or None."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        view: Callable[[Obj], View | None],
        snapshot: Callable[[Mapping[str, View]], Snapshot],
        empty: Snapshot,
        *,
        metadata_only: bool,
        timeout_seconds: int = 300,
        page: int = PAGE,
        optional: bool = False,
    ) -> None:
        self.name = name
        self._call = list_call
        self._view = view
        self._snapshot = snapshot
        self._current = empty
        self._accept = (LIST_METADATA, WATCH_METADATA) if metadata_only else (None, None)
        self.timeout_seconds = timeout_seconds
        self.page = page
        self.optional = optional
        self.views: dict[str, View] = {}
        self.listed = 0  # objects the last whole list held, views or not
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"gpuwire-{name}", daemon=True)

    @property
    def current(self) -> Snapshot:
        return self._current

    def refresh(self) -> None:
        """Nothing to poll: the watch pushes."""

    @property
    def synced(self) -> bool:
        """Whether a whole list has been published."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread, interrupting a list or watch answer being read."""
        self._stop.set()
        deadline = time.monotonic() + 5
        while self._thread.is_alive() and time.monotonic() < deadline:
            response = self._response
            if response is not None:
                response.shutdown()
            self._thread.join(0.05)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.5
                self._follow(version)
            except Expired as exc:
                log.info("%s: %s; listing again", self.name, exc)
            except NotServed:
                self._stop.wait(NOT_SERVED_RETRY)
            except Exception as exc:  # the API server away, a reset connection: list later
                if self._stop.is_set():
                    return
                why = (
                    f"API error {exc.status} {exc.reason}"
                    if isinstance(exc, client.ApiException)
                    else exc
                )
                log.warning("%s: %s; listing again in %.1fs", self.name, why, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30)

    def _request(self, accept: str | None, **query: Any) -> Any:
        """An answer, unread; 410 raised as Expired."""
        headers = {"Accept": accept} if accept else None
        try:
            self._response = self._call(_preload_content=False, _headers=headers, **query)
        except client.ApiException as exc:
            if exc.status == 410:
                raise Expired(f"410 {exc.reason}") from exc
            raise
        return self._response

    def _list(self) -> str:
        """Every page into new views, published once whole; the list's resourceVersion."""
        views: dict[str, View] = {}
        token, listed = None, 0
        timeout = (CONNECT_SECONDS, self.timeout_seconds)
        while True:
            try:
                answer = self._request(
                    self._accept[0], limit=self.page, _continue=token, _request_timeout=timeout
                )
            except client.ApiException as exc:
                if exc.status != 404 or not self.optional:
                    raise
                self.views, self.listed = {}, 0
                self._current = self._snapshot(self.views)
                self._synced.set()
                log.info("%s: not served by the API server; none", self.name)
                raise NotServed from exc
            body = orjson.loads(answer.data)
            answer.release_conn()
            self._response = answer = None  # the page goes as soon as its views are made
            for obj in body.get("items") or ():
                listed += 1
                made = self._view(obj)
                if made is not None:
                    views[_key(obj["metadata"])] = made
            meta = body["metadata"]
            del body
            token = meta.get("continue")
            if not token:
                break
        self.views, self.listed = views, listed
        self._current = self._snapshot(views)
        self._synced.set()
        log.info("%s: %d kept of %d listed", self.name, len(views), listed)
        return str(meta["resourceVersion"])

    def _follow(self, version: str) -> None:
        """Apply watch events from `version`, resuming ended watches; returns on stop."""
        while not self._stop.is_set():
            answer = self._request(
                self._accept[1],
                watch=True,
                resource_version=version,
                timeout_seconds=self.timeout_seconds,
                allow_watch_bookmarks=True,
                _request_timeout=(CONNECT_SECONDS, self.timeout_seconds + 30),
            )
            try:
                for line in _lines(answer):
                    version = self._apply(orjson.loads(line), version)
            finally:
                self._response = None
                answer.release_conn()

    def _apply(self, event: Obj, version: str) -> str:
        """One watch event applied; the version to resume from."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code, message = obj.get("code"), obj.get("message", "")
            if code == 410:
                raise Expired(f"watch: {message}")
            raise RuntimeError(f"watch error {code}: {message}")
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or version)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return version  # BOOKMARK: only the version moves
        key = _key(meta)
        made = self._view(obj) if kind != "DELETED" else None
        kept = self.views.get(key)
        if (made is None and kept is None) or made == kept:
            return version
        if made is None:
            del self.views[key]
        else:
            self.views[key] = made
        self._current = self._snapshot(self.views)
        return version
