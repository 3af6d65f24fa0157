"""What the webhook reads of the cluster, listed in pages and watched (`listwatch.ListWatch`):
the fleet from its Nodes, metadata only; the DRA path's pools from gpuwire's ResourceSlices
and the ResourceClaimTemplates gpuwire made.

An admission must not wait on the API server (mutating webhooks run in sequence, on every pod
create), so the webhook keeps the fleet itself: `listwatch.ListWatch` lists the Nodes, then
follows a watch, each Node reduced at once to its `fleet.Node` (a node without GPUs to
nothing). The fleet reads only metadata (labels, annotations), so only metadata is asked for.
A new immutable `Fleet` snapshot is published only when a GPU node's view changed (most events
are status heartbeats and holders annotations, which change none), so what admissions resolved
against a snapshot stays with it; readers take `current` without a lock. Until the first
whole list the webhook is not ready.

The slices (only the driver `gpu.gpuwire.io`'s, by field selector) are each kept as their
`pools.SliceView` and published as `Pools`; the templates (gpuwire's label) as what
`templates.Known` reads of them. Both are `resource.k8s.io/v1`: on an API server that does
not serve it they count as listed and empty.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpuwire import dra
from webhook import templates
from webhook.fleet import Fleet, Node, node_from_object
from webhook.listwatch import PAGE, ListWatch
from webhook.pools import NO_POOLS, Pools, SliceView, slice_view
from webhook.templates import Known


class NodeWatch(ListWatch[Node, Fleet]):
    """The cluster's GPU nodes, kept current by a list + watch in a background thread."""

    def __init__(self, api: Any, timeout_seconds: int = 300, page: int = PAGE) -> None:
        """`api`: a `kubernetes.client.CoreV1Api`."""
        shared: dict[object, Any] = {}  # one object per distinct GPU make-up, profiles
        super().__init__(
            "node watch",
            api.list_node,
            lambda obj: node_from_object(obj, shared),
            lambda nodes: Fleet.of_nodes(nodes.values()),
            Fleet(),
            metadata_only=True,
            timeout_seconds=timeout_seconds,
            page=page,
        )


class SliceWatch(ListWatch[SliceView, Pools]):
    """gpuwire's ResourceSlices as the pools the DRA path reads (RBAC: list, watch on
    resourceslices)."""

    def __init__(self, api: Any, timeout_seconds: int = 300, page: int = PAGE) -> None:
        """`api`: a `kubernetes.client.ResourceV1Api`."""
        calls = functools.partial(
            api.list_resource_slice, field_selector=f"spec.driver={dra.DRIVER}"
        )
        super().__init__("slice watch", calls, slice_view, _pools, NO_POOLS, metadata_only=False,
                         timeout_seconds=timeout_seconds, page=page, optional=True)  # fmt: skip


def _pools(views: Mapping[str, SliceView]) -> Pools:
    pools = Pools.of_views(views.values())
    pools.warm()
    return pools


class TemplateWatch(ListWatch[templates.Seen, Known]):
    """The ResourceClaimTemplates gpuwire made, in every namespace (RBAC: list, watch on
    resourceclaimtemplates)."""

    def __init__(self, api: Any, timeout_seconds: int = 300, page: int = PAGE) -> None:
        """`api`: a `kubernetes.client.ResourceV1Api`."""
        calls = functools.partial(
            api.list_resource_claim_template_for_all_namespaces, label_selector=templates.SELECTOR
        )
        super().__init__("template watch", calls, templates.seen, _known, Known(),
                         metadata_only=False, timeout_seconds=timeout_seconds, page=page,
                         optional=True)  # fmt: skip


def _known(views: Mapping[str, templates.Seen]) -> Known:
    return Known({(v.namespace, v.name): (v.spec, v.marked) for v in views.values()})
