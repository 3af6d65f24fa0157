"""The node agent's Prometheus endpoint: each GPU, its health, who holds it, and conflicts.

Built from the latest `Snapshot` at scrape time, not from gauges set label by label, so a
container that went away leaves no stale series behind. Every series carries `node`. The
allocation series use the Kubernetes labels `namespace`, `pod` and `container` of the holder
(as dcgm-exporter does); scrape with `honor_labels: true` so Prometheus keeps them rather
than renaming them after the agent's own pod.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuwire.devices import Device
from gpuwire.holders import Conflict, NodeHolders

NAMES = (
    "gpuwire_gpu_info",
    "gpuwire_gpu_health",
    "gpuwire_gpu_allocation",
    "gpuwire_gpu_conflict",
    "gpuwire_inventory_updated_timestamp_seconds",
)


@dataclass(frozen=True)
class Snapshot:
    """What the agent last learnt about its node."""

    node: str
    gpus: tuple[Device, ...]
    unhealthy: frozenset[str]
    holders: NodeHolders
    conflicts: tuple[Conflict, ...]
    taken: float = field(default_factory=time.time)


class Metrics(Collector):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def update(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return
        node, gpus = snapshot.node, snapshot.gpus
        index = {g.uuid: str(g.index) for g in gpus}
        info = _family(
            "gpuwire_gpu_info",
            "A GPU of this node (value 1); memory in MiB.",
            ["node", "uuid", "index", "product", "memory"],
        )
        health = _family(
            "gpuwire_gpu_health", "1: the GPU is healthy, 0: it is not.", ["node", "uuid", "index"]
        )
        for g in gpus:
            info.add_metric([node, g.uuid, index[g.uuid], g.product, str(g.memory_mib)], 1)
            health.add_metric([node, g.uuid, index[g.uuid]], g.uuid not in snapshot.unhealthy)
        allocation = _family(
            "gpuwire_gpu_allocation",
            "A container holds the GPU (value 1); path: plugin (device plugin allocation) or "
            "plugin-less (granted by annotation).",
            ["node", "uuid", "index", "namespace", "pod", "container", "path"],
        )
        for h in snapshot.holders.holders:
            for uuid in h.gpus:
                labels = [h.namespace, h.pod, h.container, h.path]
                allocation.add_metric([node, uuid, index.get(uuid, ""), *labels], 1)
        conflict = _family(
            "gpuwire_gpu_conflict",
            "The GPU is oversubscribed (value 1): kind shared-gpu (held by several containers, "
            "not shared) or all-beside-plugin (a plugin-less `all` pod where the plugin "
            "allocates).",
            ["node", "uuid", "index", "kind"],
        )
        flagged = sorted({(u, c.kind) for c in snapshot.conflicts for u in c.gpus})
        for uuid, kind in flagged:
            conflict.add_metric([node, uuid, index.get(uuid, ""), kind], 1)
        updated = _family(
            "gpuwire_inventory_updated_timestamp_seconds",
            "When the agent last read its node's holders (Unix time).",
            ["node"],
        )
        updated.add_metric([node], snapshot.taken)
        yield from (info, health, allocation, conflict, updated)


def _family(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def serve(metrics: Metrics, port: int, address: str = "0.0.0.0") -> Any:  # noqa: S104
    """Serve `/metrics` on `address:port` in a daemon thread; returns the server (to stop)."""
    registry = CollectorRegistry()
    registry.register(metrics)
    server, _ = start_http_server(port, address, registry)
    return server
