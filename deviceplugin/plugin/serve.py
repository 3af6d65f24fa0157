"""`gpuwire device-plugin serve` put together: the device plugin as a role of the node agent
(`agent.node`, which discovers and follows the node, keeps its health and runs the jobs):
resources, one endpoint per resource under the supervisor, and the token sweep.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from deviceplugin.agent import holding
from deviceplugin.agent.node import NodeAgent
from deviceplugin.config import Config
from deviceplugin.gpus import state
from deviceplugin.gpus.discovery import Discovery, NodeGpus
from deviceplugin.plugin import sweep
from deviceplugin.plugin.allocate import Strategies
from deviceplugin.plugin.endpoint import Endpoint
from deviceplugin.plugin.resources import Resource
from deviceplugin.plugin.service import DevicePluginService
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.vendors import of

log = logging.getLogger(__name__)


def resources(config: Config, node: NodeGpus) -> list[Resource]:
    """What the node advertises, by its vendor's naming (NVIDIA's: whole GPUs by the rules,
    MIG devices by the MIG strategy)."""
    found, advertised = of(config.vendor).resources(config, node)
    for problem in advertised.problems:
        log.warning("MIG (strategy %s): %s", config.mig_strategy, problem)
    return found


class Endpoints:
    """One endpoint per resource name ever advertised, kept to the latest resources."""

    def __init__(self, config: Config, health: state.HealthState) -> None:
        self.config = config
        self.health = health
        dev_root = config.dev_root or config.sim or "/"
        self.vendor = of(config.vendor)
        vendor = self.vendor.vendor
        # the config's default kind (unset) is the node's vendor's
        kind = vendor.cdi_kind if config.cdi_kind == Config.cdi_kind else config.cdi_kind
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
            vendor=self.vendor,
            allocation_dir=self.config.allocation_dir,
            grant_key_dir=self.config.grant_key_dir,
            strategies=self.strategies,
            control_nodes=self.control,
            pre_start_check=self.config.pre_start_check,
        )
        return Endpoint(service, self.config.kubelet_dir)


def run(
    config: Config,
    stop: threading.Event,
    discovery: Discovery | None = None,
    holders: holding.Settings | None = None,
) -> None:
    """Serve until `stop` is set, as the role of a node agent of its own; the sockets are
    gone when this returns. With `holders`, the agent also keeps the node's GPU holders
    (annotation, metrics) up to date; with `mps.root`, an MPS control daemon per healthy GPU."""
    discovery = discovery or of(config.vendor).discovery(config.sim)
    agent = NodeAgent(config, discovery, config.node_state(), holders=holders)
    serve_on(config, agent, stop)


def serve_on(config: Config, agent: NodeAgent, stop: threading.Event) -> None:
    """Serve the node `agent` keeps, until `stop` is set; the sockets are gone when this
    returns. Resources follow the node's MIG changes (ListAndWatch sends them), a resource
    that appears gets an endpoint of its own, one whose devices are all gone stays registered
    with none."""
    endpoints = Endpoints(config, agent.health)
    endpoints.update(resources(config, agent.node))
    if not endpoints.by_name:
        log.warning("no GPUs on this node: nothing to advertise")
    supervisor = Supervisor(list(endpoints.by_name.values()), config.kubelet_dir)

    def changed(node: NodeGpus) -> None:
        for endpoint in endpoints.update(resources(config, node)):
            supervisor.add(endpoint)

    agent.subscribe(changed)
    sweeping = threading.Thread(
        target=sweep.run,
        args=(config.allocation_dir, config.kubelet_dir, config.sweep_grace,
              config.sweep_interval, stop),
        name="sweep",
        daemon=True,
    )  # fmt: skip
    sweeping.start()
    agent.run(stop, supervisor.run, plugin=bool(endpoints.by_name))
    sweeping.join(timeout=5)
