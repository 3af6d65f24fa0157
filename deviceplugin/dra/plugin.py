"""`gpuwire dra serve` put together: the DRA plugin as a role of the node agent (`agent.node`,
which discovers and follows the node, keeps its health and runs the jobs: labels, holders,
MPS daemons), and what is the role's own: the published devices, the ResourceSlice
publisher, the claims' preparer with its CDI writer and the watch of the shared claims'
reservations, and the kubelet's sockets. What differs per vendor (the devices a node's GPUs
become, a claim's CDI spec) is the node's `vendors.DraVendor`, by its config's `vendor`.

MIG changes reach it from the agent: within a second of instances being created or destroyed
the devices, their health and the slices (at a new pool generation) are the node's again,
without a restart. Its health state is `<plugin dir>/health.json`, beside the checkpoint; one
that is not whole is rebuilt from the taints its slices carry in the API server.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import kubeclient
from deviceplugin.agent import holding, labeler
from deviceplugin.agent.node import NodeAgent, Truth, either, published_health
from deviceplugin.config import Config
from deviceplugin.dra import devices, taints, vendors
from deviceplugin.dra.cdi import CdiWriter
from deviceplugin.dra.claims import ClaimError
from deviceplugin.dra.devices import DraDevice, Sharing
from deviceplugin.dra.endpoint import Endpoint, Sockets
from deviceplugin.dra.prepared import ListClaims, Preparer
from deviceplugin.dra.publisher import Publisher
from deviceplugin.dra.reservations import Reservations
from deviceplugin.dra.service import RegistrationService, add_services
from deviceplugin.dra.shares import Holders
from deviceplugin.gpus.discovery import Discovery, NodeGpus
from gpuwire import hamicore
from gpuwire.dra import DRIVER, TAINT_LOST, TAINT_XID, UUID
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


def claim_lister(api_client: Any) -> ListClaims:
    """Every ResourceClaim the API server has, page by page (a bad checkpoint's rebuild)."""
    client: Any = importlib.import_module("kubernetes.client")
    api = client.ResourceV1Api(api_client)

    def claims() -> list[Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = []
        after = None
        while True:
            response = api.list_resource_claim_for_all_namespaces(
                limit=500, _continue=after, _preload_content=False
            )
            page = json.loads(response.data)
            found += page.get("items") or []
            after = (page.get("metadata") or {}).get("continue")
            if not after:
                return found

    return claims


def published_taints(api_client: Any, node: str) -> Truth:
    """The devices this node's slices carry gpuwire's health taints for (what the plugin
    published before its health state was lost), by UUID; none once the kubelet has wiped
    the slices of a plugin gone for 30 s (the Node's `gpuwire.io/gpus`, with labels on,
    outlives them)."""
    client: Any = importlib.import_module("kubernetes.client")
    api = client.ResourceV1Api(api_client)

    def read() -> dict[str, str]:
        selector = f"spec.driver={DRIVER},spec.nodeName={node}"
        listed = api.list_resource_slice(field_selector=selector, _preload_content=False)
        found = {}
        for obj in json.loads(listed.data).get("items") or ():
            for entry in obj["spec"].get("devices") or ():
                uuid = next(iter((entry.get("attributes") or {}).get(UUID, {}).values()), None)
                for t in entry.get("taints") or ():
                    if uuid and t.get("key") in (TAINT_XID, TAINT_LOST):
                        found[str(uuid)] = f"tainted {t['key']}={t.get('value', '')} as published"
        return found

    return read


class DraPlugin:
    """Everything the DRA plugin runs, built from the config; `run` serves until stopped.
    `holders`: the node agent also keeps who holds which GPU (annotation, metrics)."""

    def __init__(
        self,
        config: Config,
        discovery: Discovery | None = None,
        api_client: Any = None,
        holders: holding.Settings | None = None,
    ) -> None:
        self.config = config
        self.node = labeler.node_name(config.node_name)
        self.api_client = api_client or kubeclient.api_client(config.kubeconfig)
        self.sockets = Sockets(config.kubelet_root, DRIVER)
        plugin_dir = str(self.sockets.plugin_dir)
        client: Any = importlib.import_module("kubernetes.client")
        core = client.CoreV1Api(self.api_client)
        self.vendor = vendors.of(config.vendor)
        self.agent = NodeAgent(
            config,
            discovery or self.vendor.node.discovery(config.sim),
            config.node_state(plugin_dir),
            either(published_taints(self.api_client, self.node), published_health(config, core)),
            holders,
            core,
        )
        node = self.agent.node
        shares = Holders(
            config.hami_library if "hami" in labeler.enforced(config) else None,
            str(self.sockets.plugin_dir),
        )
        if shares.hami_library:
            hamicore.write_preload(shares.state)
        self.sharing = Sharing(config.shared_gpus, shares.enforced)
        self.devices: list[DraDevice] = []
        self.by_name: dict[str, DraDevice] = {}
        self._left_out: dict[str, str | None] = {}
        self._publish(node)
        self.health = self.agent.health
        root = config.driver_root or config.sim or config.host_root
        writer = CdiWriter(
            config.cdi_dir,
            Roots(root),
            config.hook,
            config.ldconfig,
            config.allocation_dir,
            config.grant_key_dir,
            config.host_root,
            shares,
            self.vendor.node.vendor,
            self.vendor.spec,
        )
        self.preparer = Preparer(
            DRIVER,
            self.node,
            claim_reader(self.api_client),
            lambda: self.by_name,
            self.taints,
            writer,
            plugin_dir,
            claim_lister(self.api_client),
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
        log.info("DRA driver %s on node %s (%s GPUs)", DRIVER, self.node, config.vendor)

    def _publish(self, node: NodeGpus) -> None:
        """Make the node's devices the ones published and prepared (each swapped whole); say
        what changed, and which MIG devices are left out and why."""
        self.published = node
        found = devices.devices(node, self.sharing, self.vendor.kinds)
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
        """A MIG change: new devices, and the slices at once."""
        self._publish(node)
        self.publisher.wake.set()

    def taints(self) -> dict[str, Sequence[taints.Taint]]:
        return dict(taints.taints(self.health.causes()))

    def _publish_on_change(self, stop: threading.Event) -> None:
        """Wake the publisher the moment health changes (a fault, a recovery): left to its
        own look every 0.2 s, a fault would wait that long for its taint, and one whose quiet
        period ended first would never be published."""
        for _ in self.health.watch(stop.is_set, poll=0.25):
            self.publisher.wake.set()

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; the sockets are gone when this returns."""
        self.agent.subscribe(self._rediscovered)
        jobs = [
            threading.Thread(target=self.publisher.run, args=(stop,), name="publisher"),
            threading.Thread(target=self._publish_on_change, args=(stop,), name="taints"),
            threading.Thread(target=self.reservations.run, args=(stop,), name="reservations"),
        ]
        for job in jobs:
            job.daemon = True
            job.start()
        try:
            self.agent.run(stop, self.endpoint.run, plugin=True)
        finally:
            self.publisher.wake.set()  # it sees `stop` now, not at its next look
            for job in jobs:
                job.join(timeout=10)
