"""`gpuwire device-plugin serve` put together: discovery, resources, health, one endpoint per
resource under the supervisor, and the background jobs (health events, token sweep, labels,
holders, and following MIG changes).

MIG changes are followed while serving (`discovery.follow`): every second the MIG instances
procfs lists are compared with the last ones (`Discovery.layout`), and on a change (or every
minute) the node is discovered again, once for every job here (`discovery.Latest`). When it
differs, resources get their new devices (ListAndWatch sends them), a resource that appears
gets an endpoint of its own, and one whose devices are all gone stays registered with none.
The node side's MIG map is written from the same discovery, first, and put back every minute
should it be gone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable

from deviceplugin.agent import holding, labeler, labels
from deviceplugin.config import Config
from deviceplugin.gpus import state
from deviceplugin.gpus.backend import open_discovery
from deviceplugin.gpus.discovery import Discovery, Latest, NodeGpus, follow
from deviceplugin.gpus.health import HealthBook, HealthPolicy
from deviceplugin.plugin import sweep
from deviceplugin.plugin.allocate import Strategies
from deviceplugin.plugin.endpoint import Endpoint
from deviceplugin.plugin.resources import Resource
from deviceplugin.plugin.service import DevicePluginService
from deviceplugin.plugin.supervisor import Supervisor
from gpuwire import requirements
from gpuwire.vendor import NVIDIA, of

log = logging.getLogger(__name__)


def resources(config: Config, node: NodeGpus) -> list[Resource]:
    """What the node advertises: whole GPUs by the rules, MIG devices by the MIG strategy."""
    found, advertised = config.resources(node)
    for problem in advertised.problems:
        log.warning("MIG (strategy %s): %s", config.mig_strategy, problem)
    return found


class Endpoints:
    """One endpoint per resource name ever advertised, kept to the latest resources."""

    def __init__(self, config: Config, health: state.HealthState) -> None:
        self.config = config
        self.health = health
        dev_root = config.dev_root or config.sim or "/"
        vendor = of(config.vendor)
        kind = vendor.cdi_kind if config.cdi_kind == NVIDIA.cdi_kind else config.cdi_kind
        self.strategies = Strategies(config.device_specs, config.cdi, kind, dev_root)
        # control devices passed as DeviceSpecs when they exist on the host
        self.control = [n for n in vendor.control_nodes if os.path.exists(f"{dev_root}/dev/{n}")]
        self.by_name: dict[str, Endpoint] = {}

    def update(self, wanted: list[Resource]) -> list[Endpoint]:
        """Give each endpoint its resource's devices now; returns the endpoints that are new."""
        new: list[Endpoint] = []
        names = {r.name for r in wanted}
        for name, endpoint in self.by_name.items():
            if name not in names:
                old = endpoint.service.resource
                endpoint.service.resource = dataclasses.replace(old, gpus=(), mig=())
        for resource in wanted:
            if resource.name not in self.by_name:
                self.by_name[resource.name] = self._endpoint(resource)
                new.append(self.by_name[resource.name])
            elif self.by_name[resource.name].service.resource == resource:
                continue
            self.by_name[resource.name].service.resource = resource
            log.info(
                "%s: %d device(s) × %d replica(s)",
                resource.name,
                len(resource.gpus),
                resource.replicas,
            )
        return new

    def _endpoint(self, resource: Resource) -> Endpoint:
        service = DevicePluginService(
            resource,
            self.health,
            allocation_dir=self.config.allocation_dir,
            grant_key_dir=self.config.grant_key_dir,
            strategies=self.strategies,
            control_nodes=self.control,
            pre_start_check=self.config.pre_start_check,
        )
        return Endpoint(service, self.config.kubelet_dir)


def build(config: Config, discovery: Discovery) -> tuple[Endpoints, state.HealthState, NodeGpus]:
    node = discovery.discover()
    if config.driver_facts is not None:
        requirements.write_facts(config.driver_facts, labels.driver_facts(node))
    policy = HealthPolicy(config.ignored_xids, config.recover_after)
    uuids, children = node.watched()
    health = state.HealthState(HealthBook(policy, uuids, children=children), discovery.alive)
    labeler.write_mig_map(config.mig_map, node)
    endpoints = Endpoints(config, health)
    endpoints.update(resources(config, node))
    if not endpoints.by_name:
        log.warning("no GPUs on this node: nothing to advertise")
    return endpoints, health, node


def rediscovered(
    config: Config, endpoints: Endpoints, supervisor: Supervisor
) -> Callable[[NodeGpus], None]:
    """What a MIG change does: resources, health and the MIG map follow what the node has."""

    def changed(node: NodeGpus) -> None:
        labeler.write_mig_map(config.mig_map, node)  # first: the node side must know it
        for endpoint in endpoints.update(resources(config, node)):
            supervisor.add(endpoint)
        endpoints.health.changed(*node.watched())

    return changed


def run(
    config: Config,
    stop: threading.Event,
    discovery: Discovery | None = None,
    holders: holding.Settings | None = None,
) -> None:
    """Serve until `stop` is set; the sockets are gone when this returns. With `holders`,
    also keep the node's GPU holders (annotation, metrics) up to date; with `mps.root`, an
    MPS control daemon per healthy GPU."""
    discovery = discovery or open_discovery(config.sim, config.vendor)
    endpoints, health, node = build(config, discovery)
    latest = Latest(discovery, node)
    supervisor = Supervisor(list(endpoints.by_name.values()), config.kubelet_dir)
    jobs = [
        threading.Thread(target=state.monitor, args=(discovery, health, stop), name="health"),
        threading.Thread(
            target=sweep.run,
            args=(
                config.allocation_dir,
                config.kubelet_dir,
                config.sweep_grace,
                config.sweep_interval,
                stop,
            ),
            name="sweep",
        ),
        threading.Thread(
            target=follow,
            args=(latest, node, rediscovered(config, endpoints, supervisor), stop),
            name="mig",
        ),
        threading.Thread(
            target=labeler.keep_mig_map, args=(config.mig_map, latest, stop), name="mig-map"
        ),
    ]
    if config.labels:
        jobs.append(
            threading.Thread(
                target=labeler.run, args=(config, latest, stop, health.unhealthy), name="labels"
            )
        )
    daemons = holding.mps_job(config, latest, health.unhealthy, holders)
    if daemons is not None:
        jobs.append(threading.Thread(target=daemons.run, args=(stop,), name="mps"))
    if holders is not None:
        inside = dataclasses.replace(holders, plugin=bool(endpoints.by_name))
        also = [daemons.supervisor] if daemons is not None else []
        watch = holding.job(
            inside, config.node_name, config.kubeconfig, latest, health.unhealthy, also
        )
        jobs.append(threading.Thread(target=watch, args=(stop,), name="holders"))
    for job in jobs:
        job.daemon = True
        job.start()
    try:
        supervisor.run(stop)
    finally:
        stop.set()
        for job in jobs:
            job.join(timeout=5)
        discovery.close()
