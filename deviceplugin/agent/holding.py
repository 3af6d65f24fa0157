"""The node agent's view of who holds which GPU, kept up to date: read the container records
(sweeping those of dead containers) and the kubelet's pod-resources, then publish the node
annotation `gpuwire.io/holders` when it changed and hand the snapshot to the metrics.

It runs beside the device plugin (`gpuwire device-plugin serve --holders`) or beside the
labeler on plugin-less nodes (`gpuwire node label --watch --holders`). On a node without a
kubelet socket (a test bench) it reads the records alone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.registry import Collector

from deviceplugin.agent import labeler, metrics, mps, podresources
from deviceplugin.agent.metrics import Metrics, Snapshot
from deviceplugin.config import Config
from deviceplugin.dra.devices import Sharing
from deviceplugin.dra.devices import devices as dra_devices
from deviceplugin.gpus.discovery import NodeGpus
from gpuwire import holders, records
from gpuwire.devices import Device, MigDevice
from gpuwire.dra import DRIVER

log = logging.getLogger(__name__)

RESYNC = 300.0  # after this long the published value is compared with the node's again


@dataclass(frozen=True)
class Settings:
    records_dir: str = records.DEFAULT_DIR
    pod_resources: str = podresources.SOCKET
    host_root: str = "/"  # where the host's files are seen (runtime state dirs in records)
    interval: float = 10.0
    grace: float = 60.0  # a record younger than this is kept: its container may be starting
    publish: bool = False  # the node annotation
    metrics_port: int | None = None
    plugin: bool = False  # the agent runs in the device plugin: a plugin allocates here


def observe(
    settings: Settings,
    gpus: Sequence[Device],
    now: float,
    mig: Sequence[MigDevice] = (),
    dra_names: Mapping[str, str] | None = None,
) -> holders.NodeHolders:
    """The node's holders now; records of containers that are gone are removed on the way.
    `dra_names`: the node's DRA device names → the GPU or MIG UUID each is."""
    live, removed = records.sweep(settings.records_dir, settings.grace, now, settings.host_root)
    if removed:
        log.info("removed %d record(s) of containers that are gone: %s", len(removed), removed)
    assignments: list[holders.Assignment] = []
    allocatable: podresources.Allocatable = []
    claimed: list[holders.Claimed] = []
    if os.path.exists(settings.pod_resources):
        assignments, allocatable, claimed = podresources.read(settings.pod_resources)
    ours = [c for c in claimed if c.driver == DRIVER]
    return holders.node_holders(gpus, live, assignments, allocatable, settings.plugin, mig, ours,
                                dra_names)  # fmt: skip


class Publisher:
    """Patches the annotation only when its value changes (or the node lost it)."""

    def __init__(self, api: Any, node: str) -> None:
        self.api = api
        self.node = node
        self._published: str | None = None
        self._checked = 0.0

    def publish(self, value: str, now: float) -> bool:
        """Make the node carry `value`; whether a PATCH was sent."""
        if value == self._published and now - self._checked < RESYNC:
            return False
        self._published = None  # unknown until the node says or the PATCH succeeds
        annotations = self.api.read_node(self.node).metadata.annotations or {}
        sent = annotations.get(holders.ANNOTATION) != value
        if sent:
            patch = {"metadata": {"annotations": {holders.ANNOTATION: value}}}
            self.api.patch_node(self.node, patch, _content_type=labeler.MERGE_PATCH)
            log.info("node %s: %s updated", self.node, holders.ANNOTATION)
        self._published, self._checked = value, now
        return sent


class Agent:
    """One pass: observe, publish, update the metrics. `run` repeats it."""

    def __init__(
        self,
        settings: Settings,
        node: str,
        gpus: Callable[[], Sequence[Device]],
        unhealthy: Callable[[], frozenset[str]],
        api: Any = None,
        metrics: Metrics | None = None,
        mig: Callable[[], Sequence[MigDevice]] = tuple,
        dra_names: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.settings = settings
        self.node = node
        self.gpus = gpus
        self.mig = mig
        self.dra_names = dra_names
        self.unhealthy = unhealthy
        self.publisher = Publisher(api, node) if settings.publish else None
        self.metrics = metrics
        self._conflicts: tuple[holders.Conflict, ...] = ()

    def step(self, now: float) -> Snapshot:
        gpus, mig = tuple(self.gpus()), tuple(self.mig())
        held = observe(self.settings, gpus, now, mig, self.dra_names())
        found = tuple(holders.conflicts(held, {m.uuid: m.parent_uuid for m in mig}))
        names = {g.uuid: f"GPU {g.index}" for g in gpus}
        names |= {m.uuid: f"MIG {m.profile} of GPU {m.parent_index}" for m in mig}
        for conflict in found:
            if conflict not in self._conflicts:  # once, when it starts; the metric stays
                log.warning("conflict on node %s: %s", self.node, conflict.explain(names))
        for conflict in self._conflicts:
            if conflict not in found:
                log.info("conflict on node %s is over: %s", self.node, conflict.explain(names))
        self._conflicts = found
        snapshot = Snapshot(self.node, gpus, self.unhealthy(), held, found, now, mig)
        if self.metrics is not None:
            self.metrics.update(snapshot)
        if self.publisher is not None:
            self.publisher.publish(holders.encode(held), now)
        return snapshot

    def run(self, stop: threading.Event) -> None:
        """Step every `interval` seconds until `stop` is set; failures are logged and retried."""
        while not stop.is_set():
            try:
                self.step(time.time())
            except Exception as exc:  # the kubelet or the API server may be away
                log.warning("GPU holders of node %s not updated: %s", self.node, exc)
            stop.wait(self.settings.interval)


def of_node(
    settings: Settings,
    node: str,
    found: Callable[[], NodeGpus],
    unhealthy: Callable[[], frozenset[str]],
    api: Any = None,
    metrics: Metrics | None = None,
) -> Agent:
    """The agent of the node `found()` discovers: its GPUs, its MIG devices and the DRA names
    pod-resources lists claims' devices by (the DRA plugin's names for them)."""
    return Agent(
        settings,
        node,
        lambda: found().devices,
        unhealthy,
        api,
        metrics,
        lambda: found().mig_devices,
        lambda: {d.name: d.uuid for d in dra_devices(found(), Sharing())},
    )


def job(
    settings: Settings,
    node_name: str | None,
    kubeconfig: str | None,
    found: Callable[[], NodeGpus],
    unhealthy: Callable[[], frozenset[str]],
    also: Sequence[Collector] = (),
    api: Any = None,
) -> Callable[[threading.Event], None]:
    """The agent as a background job of the node agent: `job(...)(stop)` runs it on the node
    `found()` gives (the process's `discovery.Latest`), with the metrics endpoint (if a port
    is set, with the series of `also` too) up until `stop`; `api`: the CoreV1Api to publish
    with (else one of `kubeconfig`)."""
    if settings.publish:
        api = api or labeler.core_api(kubeconfig)
    collector = Metrics() if settings.metrics_port is not None else None
    agent = of_node(settings, labeler.node_name(node_name), found, unhealthy, api, collector)

    def run(stop: threading.Event) -> None:
        server = None
        if collector is not None and settings.metrics_port is not None:
            server = metrics.serve(collector, settings.metrics_port, also=also)
            log.info("metrics on :%d/metrics", settings.metrics_port)
        try:
            agent.run(stop)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    return run


def mps_job(
    config: Config,
    found: Callable[[], NodeGpus],
    unhealthy: Callable[[], frozenset[str]],
    settings: Settings | None,
) -> mps.Job | None:
    """The MPS daemons' job (`deviceplugin.agent.mps`), reading the container records where
    this job reads them (who is joined to which daemon)."""
    where = settings or Settings()
    node = labeler.node_name(config.node_name)
    return mps.job(config, found, unhealthy, where.records_dir, where.host_root, node)
