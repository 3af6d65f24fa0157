"""The node agent: one per node, whichever role it plays (the kubelet device plugin, the DRA
plugin, or neither, plugin-less), and what its roles and jobs share.

It discovers the node once and follows it (`gpus.discovery.follow`: within a second of a MIG
change, one discovery for everything, handed on only when the node is other than it was):
the MIG map is written first (the node side must know a MIG device before anything offers
it), then each role that subscribed gets the node, then the health book watches its devices.
It keeps the node's health (the discovery's events, recovery after the quiet period) on disk
(`gpus.healthfile`), so that a restart forgets no fault. The jobs read the same node and
health: the labels and `gpuwire.io/gpus`, who holds which GPU and its metrics, the MPS
control daemons, the MIG map kept, the driver facts.

A health file that is not whole or not what was written is rebuilt from what the API server
was last told (`truth`: the DRA plugin's published taints, else the Node's `gpuwire.io/gpus`),
every GPU it named unhealthy counted from now; where that cannot be read the agent does not
start (the file stays, for the next try).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from deviceplugin import statefile
from deviceplugin.agent import holding, labeler, labels
from deviceplugin.config import Config
from deviceplugin.gpus import healthfile, state
from deviceplugin.gpus.discovery import Discovery, HealthEvent, Latest, NodeGpus, follow
from deviceplugin.gpus.health import Entries, HealthBook, HealthPolicy
from gpuwire import nodegpus, requirements

log = logging.getLogger(__name__)

# What the API server holds of the node's health: device UUID → how it was published unhealthy.
Truth = Callable[[], Mapping[str, str]]


def published_health(config: Config, api: Any = None) -> Truth:
    """The GPUs and MIG devices the Node's `gpuwire.io/gpus` says are unhealthy (what the
    labels job last published)."""

    def read() -> dict[str, str]:
        core = api or labeler.core_api(config.kubeconfig)
        name = labeler.node_name(config.node_name)
        text = (core.read_node(name).metadata.annotations or {}).get(labels.GPUS_ANNOTATION)
        found = {}
        for gpu in nodegpus.decode(text) if text else ():
            for uuid, healthy in (
                (gpu.uuid, gpu.healthy),
                *((m.uuid, m.healthy) for m in gpu.mig or ()),
            ):
                if not healthy:
                    found[uuid] = f"unhealthy in node {name}'s {labels.GPUS_ANNOTATION}"
        return found

    return read


def either(*truths: Truth) -> Truth:
    """What any of them says is unhealthy."""
    return lambda: {u: why for truth in reversed(truths) for u, why in truth().items()}


class NodeAgent:
    def __init__(
        self,
        config: Config,
        discovery: Discovery,
        state_dir: str,
        truth: Truth | None = None,
        holders: holding.Settings | None = None,
        api: Any = None,
    ) -> None:
        """`holders`: also keep who holds which GPU (annotation, metrics) up to date; `api`:
        the CoreV1Api every job writes the Node with (else one of the config's kubeconfig)."""
        self.config = config
        self.api = api
        self.discovery = discovery
        self.state_dir = state_dir
        self.holders = holders
        self.node = discovery.discover()
        self.latest = Latest(discovery, self.node)
        if config.driver_facts is not None:
            requirements.write_facts(config.driver_facts, labels.driver_facts(self.node))
        labeler.write_mig_map(config.mig_map, self.node)
        self.health = self._health(truth or published_health(config, api))
        self._subscribers: list[Callable[[NodeGpus], None]] = []

    def _health(self, truth: Truth) -> state.HealthState:
        policy = HealthPolicy(self.config.ignored_xids, self.config.recover_after)
        uuids, children = self.node.watched()
        book = HealthBook(policy, uuids, children=children)
        try:
            kept = healthfile.load(self.state_dir, time.monotonic(), time.time())
        except statefile.StateError as exc:
            log.error("%s; rebuilding it from what the API server was told", exc)
            now = time.monotonic()
            kept = {u: (now, (HealthEvent(u, None, why),)) for u, why in truth().items()}
            statefile.set_aside(healthfile.path(self.state_dir))
        book.restore(kept)
        for uuid, (_, causes) in book.entries().items():
            log.warning("GPU %s is unhealthy, as before the restart: %s", uuid,
                        "; ".join(e.detail for e in causes))  # fmt: skip

        def persist(entries: Entries) -> None:
            healthfile.save(self.state_dir, entries, time.monotonic(), time.time())

        health = state.HealthState(book, self.discovery.alive, persist=persist)
        persist(book.entries())  # a rebuilt state is on disk before anything reads it
        return health

    def subscribe(self, changed: Callable[[NodeGpus], None]) -> None:
        """Have `changed` called with the node each time it changes (a MIG change)."""
        self._subscribers.append(changed)

    def _changed(self, node: NodeGpus) -> None:
        labeler.write_mig_map(self.config.mig_map, node)  # first: the node side must know it
        self.node = node
        for changed in self._subscribers:
            changed(node)
        self.health.changed(*node.watched())

    def run(
        self, stop: threading.Event, serve: Callable[[threading.Event], None], plugin: bool
    ) -> None:
        """Run the jobs and `serve` (a role's serving loop) until `stop` is set or `serve`
        returns; `plugin`: a plugin allocates on this node (holders' view of it)."""
        unhealthy = self.health.unhealthy
        jobs = [
            threading.Thread(
                target=state.monitor, args=(self.discovery, self.health, stop), name="health"
            ),
            threading.Thread(
                target=follow, args=(self.latest, self.node, self._changed, stop), name="mig"
            ),
            threading.Thread(
                target=labeler.keep_mig_map,
                args=(self.config.mig_map, self.latest, stop),
                name="mig-map",
            ),
        ]
        if self.config.labels:
            jobs.append(
                threading.Thread(
                    target=labeler.run,
                    args=(self.config, self.latest, stop, unhealthy, self.api),
                    name="labels",
                )
            )
        daemons = holding.mps_job(self.config, self.latest, unhealthy, self.holders)
        if daemons is not None:
            jobs.append(threading.Thread(target=daemons.run, args=(stop,), name="mps"))
        if self.holders is not None:
            settings = dataclasses.replace(self.holders, plugin=plugin)
            also = [daemons.supervisor] if daemons is not None else []
            watch = holding.job(
                settings, self.config.node_name, self.config.kubeconfig, self.latest, unhealthy,
                also, self.api,
            )  # fmt: skip
            jobs.append(threading.Thread(target=watch, args=(stop,), name="holders"))
        for job in jobs:
            job.daemon = True
            job.start()
        try:
            serve(stop)
        finally:
            stop.set()
            for job in jobs:
                job.join(timeout=10)
            self.discovery.close()
