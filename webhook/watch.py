"""The fleet from the cluster: its Nodes listed in pages and watched, metadata only.

An admission must not wait on the API server (mutating webhooks run in sequence, on every pod
create), so the webhook keeps the fleet itself: `listwatch.ListWatch` lists the Nodes, then
follows a watch, each Node reduced at once to its `fleet.Node` (a node without GPUs to
nothing). The fleet reads only metadata (labels, annotations), so only metadata is asked for.
A new immutable `Fleet` snapshot is published only when a GPU node's view changed (most events
are status heartbeats and holders annotations, which change none), so what admissions resolved
against a snapshot stays with it; readers take `current` without a lock. Until the first
whole list the webhook is not ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.fleet import Fleet, Node, node_from_object
from webhook.listwatch import PAGE, ListWatch


class NodeWatch(ListWatch[Node]):
    """The cluster's GPU nodes, kept current by a list + watch in a background thread."""

    def __init__(self, api: Any, timeout_seconds: int = 300, page: int = PAGE) -> None:
        """`api`: a `kubernetes.client.CoreV1Api`."""
        self._current = Fleet()
        self._shared: dict[object, Any] = {}  # one object per distinct GPU make-up, profiles
        super().__init__(
            "node watch",
            api.list_node,
            self._node,
            self._snapshot,
            metadata_only=True,
            timeout_seconds=timeout_seconds,
            page=page,
        )

    @property
    def current(self) -> Fleet:
        return self._current

    def refresh(self) -> None:
        """Nothing to poll: the watch pushes."""

    def _node(self, obj: dict[str, Any]) -> Node | None:
        return node_from_object(obj, self._shared)

    def _snapshot(self, nodes: Mapping[str, Node]) -> None:
        self._current = Fleet.of_nodes(nodes.values())
