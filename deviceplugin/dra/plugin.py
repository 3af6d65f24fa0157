"""`gpuwire dra serve` put together: discovery and health (shared with the device plugin), the
published devices, the ResourceSlice publisher, the claims' preparer with its CDI writer and
the watch of the shared claims' reservations, and the kubelet's sockets; optionally the
node's labels.

MIG changes are followed as the device plugin follows them (`discovery.follow`): within a
second of instances being created or destroyed the devices, their health and the slices (at
a new pool generation) are the node's again, without a restart.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import kubeclient
from deviceplugin.agent import labeler
from deviceplugin.config import Config
from deviceplugin.dra import devices, healthfile, taints
from deviceplugin.dra.cdi import CdiWriter
from deviceplugin.dra.claims import ClaimError
from deviceplugin.dra.devices import DraDevice, Sharing
from deviceplugin.dra.endpoint import Endpoint, Sockets
from deviceplugin.dra.prepared import Preparer
from deviceplugin.dra.publisher import Publisher
from deviceplugin.dra.reservations import Reservations
from deviceplugin.dra.service import RegistrationService, add_services
from deviceplugin.dra.shares import Holders
from deviceplugin.gpus import state
from deviceplugin.gpus.backend import open_discovery
from deviceplugin.gpus.discovery import Discovery, Latest, NodeGpus, follow
from deviceplugin.gpus.health import Entries, HealthBook, HealthPolicy
from gpuwire import hamicore
from gpuwire.dra import DRIVER
from gpuwire.roots import Roots

log = logging.getLogger(__name__)


def claim_reader(api_client: Any) -> Any:
    """Reads a ResourceClaim as the API server has it; ClaimError when there is none."""
    client: Any = importlib.import_module("kubernetes.client")
    api = client.ResourceV1Api(api_client)

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        try:
            response = api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        except client.ApiException as exc:
            if exc.status == 404:
                raise ClaimError(f"claim {namespace}/{name} does not exist") from None
            raise
        return dict(json.loads(response.data))

    return read


class DraPlugin:
    """Everything the DRA plugin runs, built from the config; `run` serves until stopped."""

    def __init__(
        self, config: Config, discovery: Discovery | None = None, api_client: Any = None
    ) -> None:
        self.config = config
        self.discovery = discovery or open_discovery(config.sim)
        self.node = labeler.node_name(config.node_name)
        self.api_client = api_client or kubeclient.api_client(config.kubeconfig)
        node = self.discovery.discover()
        self.latest = Latest(self.discovery, node)
        self.sockets = Sockets(config.kubelet_root, DRIVER)
        holders = Holders(
            config.hami_library if "hami" in labeler.enforced(config) else None,
            str(self.sockets.plugin_dir),
        )
        if holders.hami_library:
            hamicore.write_preload(holders.state)
        self.sharing = Sharing(config.shared_gpus, holders.enforced)
        self.devices: list[DraDevice] = []
        self.by_name: dict[str, DraDevice] = {}
        self._left_out: dict[str, str | None] = {}
        self._publish(node)
        policy = HealthPolicy(config.ignored_xids, config.recover_after)
        uuids, children = node.watched()
        book = HealthBook(policy, uuids, children=children)
        plugin_dir = str(self.sockets.plugin_dir)
        book.restore(healthfile.load(plugin_dir, time.monotonic(), time.time()))
        for uuid, (_, causes) in book.entries().items():
            log.warning("GPU %s is unhealthy, as before the restart: %s", uuid,
                        "; ".join(e.detail for e in causes))  # fmt: skip

        def persist(entries: Entries) -> None:
            healthfile.save(plugin_dir, entries, time.monotonic(), time.time())

        self.health = state.HealthState(book, self.discovery.alive, persist=persist)
        root = config.driver_root or config.sim or config.host_root
        writer = CdiWriter(
            config.cdi_dir,
            Roots(root),
            config.hook,
            config.ldconfig,
            config.allocation_dir,
            config.grant_key_dir,
            config.host_root,
            holders,
        )
        self.preparer = Preparer(
            DRIVER,
            self.node,
            claim_reader(self.api_client),
            lambda: self.by_name,
            self.taints,
            writer,
            plugin_dir,
        )
        self.reservations = Reservations(self.api_client, self.preparer)
        self.publisher = Publisher(
            self.api_client, DRIVER, self.node, lambda: self.devices, self.taints
        )
        closing = threading.Event()
        self.endpoint = Endpoint(
            self.sockets,
            lambda server: add_services(
                server, self.preparer, self.health, self.node, lambda: self.devices, closing
            ),
            RegistrationService(DRIVER, str(self.sockets.dra)),
            closing,
        )
        log.info("DRA driver %s on node %s", DRIVER, self.node)

    def _publish(self, node: NodeGpus) -> None:
        """Make the node's devices the ones published and prepared (each swapped whole); say
        what changed, and which MIG devices are left out and why."""
        self.published = node
        found = devices.devices(node, self.sharing)
        left = {m.device.name: devices.unpublished(m) for m in node.mig}
        for name, why in sorted(left.items()):
            if why is not None and self._left_out.get(name) != why:
                log.warning("MIG device %s is not published: %s", name, why)
        if [d.name for d in found] != [d.name for d in self.devices]:
            log.info(
                "%d device(s): %d GPU(s), %d shared, %d MIG device(s)",
                len(found),
                sum(d.mig is None for d in found),
                sum(d.shared for d in found),
                sum(d.mig is not None for d in found),
            )
        self.devices, self.by_name, self._left_out = found, {d.name: d for d in found}, left

    def _rediscovered(self, node: NodeGpus) -> None:
        """A MIG change: new devices, their health, and the slices at once."""
        self._publish(node)
        self.health.changed(*node.watched())
        self.publisher.wake.set()

    def taints(self) -> dict[str, Sequence[taints.Taint]]:
        return dict(taints.taints(self.health.causes()))

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; the sockets are gone when this returns."""
        jobs = [
            threading.Thread(
                target=state.monitor, args=(self.discovery, self.health, stop), name="health"
            ),
            threading.Thread(target=self.publisher.run, args=(stop,), name="publisher"),
            threading.Thread(target=self.reservations.run, args=(stop,), name="reservations"),
            threading.Thread(
                target=follow,
                args=(self.latest, self.published, self._rediscovered, stop),
                name="mig",
            ),
        ]
        if self.config.labels:
            jobs.append(
                threading.Thread(
                    target=labeler.run,
                    args=(self.config, self.latest, stop, self.health.unhealthy),
                    name="labels",
                )
            )
        for job in jobs:
            job.daemon = True
            job.start()
        try:
            self.endpoint.run(stop)
        finally:
            stop.set()
            for job in jobs:
                job.join(timeout=10)
            self.discovery.close()
