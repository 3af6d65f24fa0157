"""`gpuwire device-plugin serve` put together: discovery, resources, health, one endpoint per
resource under the supervisor, and the background jobs (health events, token sweep, labels).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from deviceplugin import agent, labels, mps, state, sweep
from deviceplugin.allocate import Strategies
from deviceplugin.backend import open_discovery
from deviceplugin.config import Config
from deviceplugin.discovery import Discovery
from deviceplugin.endpoint import Endpoint
from deviceplugin.health import HealthBook, HealthPolicy
from deviceplugin.service import DevicePluginService
from deviceplugin.supervisor import Supervisor
from gpuwire import nvidia, requirements

log = logging.getLogger(__name__)

# Control devices passed as DeviceSpecs when they exist on the host.
CONTROL_NODES = tuple(
    name for name, _, _ in (nvidia.CTL_NODE, *nvidia.UVM_NODES, nvidia.MODESET_NODE)
)


def build(config: Config, discovery: Discovery) -> tuple[list[Endpoint], state.HealthState]:
    node = discovery.discover()
    if config.driver_facts is not None:
        requirements.write_facts(config.driver_facts, labels.driver_facts(node))
    resources = config.resources(node.devices)
    policy = HealthPolicy(config.ignored_xids, config.recover_after)
    uuids = frozenset(d.uuid for d in node.devices)
    health = state.HealthState(HealthBook(policy, uuids), discovery.alive)
    dev_root = config.dev_root or config.sim or "/"
    strategies = Strategies(config.device_specs, config.cdi, config.cdi_kind, dev_root)
    control = [n for n in CONTROL_NODES if os.path.exists(os.path.join(dev_root, "dev", n))]
    endpoints = []
    for resource in resources:
        service = DevicePluginService(
            resource,
            health,
            allocation_dir=config.allocation_dir,
            grant_key_dir=config.grant_key_dir,
            strategies=strategies,
            control_nodes=control,
            pre_start_check=config.pre_start_check,
        )
        endpoints.append(Endpoint(service, config.kubelet_dir))
        log.info(
            "%s: %d GPU(s) × %d replica(s)", resource.name, len(resource.gpus), resource.replicas
        )
    if not endpoints:
        log.warning("no GPUs on this node: nothing to advertise")
    return endpoints, health


def run(
    config: Config,
    stop: threading.Event,
    discovery: Discovery | None = None,
    holders: agent.Settings | None = None,
) -> None:
    """Serve until `stop` is set; the sockets are gone when this returns. With `holders`,
    also keep the node's GPU holders (annotation, metrics) up to date; with `mps.root`, an
    MPS control daemon per healthy GPU."""
    discovery = discovery or open_discovery(config.sim)
    endpoints, health = build(config, discovery)
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
    ]
    if config.labels:
        from deviceplugin import labeler

        jobs.append(
            threading.Thread(
                target=labeler.run, args=(config, discovery, stop, health.unhealthy), name="labels"
            )
        )
    if holders is not None:
        inside = dataclasses.replace(holders, plugin=bool(endpoints))
        watch = agent.job(inside, config.node_name, config.kubeconfig, discovery, health.unhealthy)
        jobs.append(threading.Thread(target=watch, args=(stop,), name="holders"))
    daemons = mps.job(config, discovery, health.unhealthy)
    if daemons is not None:
        jobs.append(threading.Thread(target=daemons, args=(stop,), name="mps"))
    for job in jobs:
        job.daemon = True
        job.start()
    try:
        Supervisor(endpoints, config.kubelet_dir).run(stop)
    finally:
        stop.set()
        for job in jobs:
            job.join(timeout=5)
        discovery.close()
