"""The node agent's Prometheus endpoint: each GPU and MIG device, its health, who holds it,
and conflicts. MIG devices have series of their own, which name their parent GPU
(`parent_uuid`, `index`): a MIG device's holders are under its GPU.

Built from the latest `Snapshot` at scrape time, not from gauges set label by label, so a
container that went away leaves no stale series behind. Every series carries `node`. The
allocation series use the Kubernetes labels `namespace`, `pod` and `container` of the holder
(as dcgm-exporter does); scrape with `honor_labels: true` so Prometheus keeps them rather
than renaming them after the agent's own pod.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuwire.devices import Device, MigDevice
from gpuwire.holders import Conflict, NodeHolders

HOLDER_LABELS = ("namespace", "pod", "container", "path")
NAMES = (
    "gpuwire_gpu_info",
    "gpuwire_gpu_health",
    "gpuwire_gpu_allocation",
    "gpuwire_gpu_conflict",
    "gpuwire_mig_device_info",
    "gpuwire_mig_device_health",
    "gpuwire_mig_device_allocation",
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
    mig: tuple[MigDevice, ...] = ()


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
        index |= {m.uuid: str(m.parent_index) for m in snapshot.mig}
        mig = {m.uuid: m for m in snapshot.mig}
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
        mig_info = _family(
            "gpuwire_mig_device_info",
            "A MIG device of this node (value 1): its parent GPU, profile, GPU and compute "
            "instance, memory in MiB.",
            ["node", "uuid", "parent_uuid", "index", "profile", "gi", "ci", "memory"],
        )
        mig_health = _family(
            "gpuwire_mig_device_health",
            "1: the MIG device is healthy, 0: it is not.",
            ["node", "uuid", "parent_uuid", "index"],
        )
        for m in snapshot.mig:
            parent = [node, m.uuid, m.parent_uuid, str(m.parent_index)]
            mig_info.add_metric([*parent, m.profile, str(m.gi), str(m.ci), str(m.memory_mib)], 1)
            mig_health.add_metric(parent, m.uuid not in snapshot.unhealthy)
        mig_allocation = _family(
            "gpuwire_mig_device_allocation",
            "A container holds the MIG device (value 1), under its parent GPU; path as for "
            "gpuwire_gpu_allocation.",
            [*("node", "uuid", "parent_uuid", "index", "profile"), *HOLDER_LABELS],
        )
        for h in snapshot.holders.holders:
            for uuid in h.gpus:
                labels = [h.namespace, h.pod, h.container, h.path]
                if uuid in mig:
                    held = mig[uuid]
                    where = [node, uuid, held.parent_uuid, index[uuid], held.profile]
                    mig_allocation.add_metric([*where, *labels], 1)
                else:
                    allocation.add_metric([node, uuid, index.get(uuid, ""), *labels], 1)
        conflict = _family(
            "gpuwire_gpu_conflict",
            "The GPU is oversubscribed (value 1): kind shared-gpu (held by several containers, "
            "not shared), all-beside-plugin (a plugin-less `all` pod where the plugin "
            "allocates) or gpu-and-mig (a GPU held whole and one of its MIG devices by another).",
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
        yield from (info, health, allocation, conflict, mig_info, mig_health, mig_allocation)
        yield updated


def _family(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def serve(
    metrics: Metrics,
    port: int,
    address: str = "0.0.0.0",  # noqa: S104
    also: Sequence[Collector] = (),
) -> Any:
    """Serve `/metrics` (and what the collectors `also` collect: the MPS daemons') on
    `address:port` in a daemon thread; returns the server (to stop)."""
    registry = CollectorRegistry()
    for collector in (metrics, *also):
        registry.register(collector)
    server, _ = start_http_server(port, address, registry)
    return server
