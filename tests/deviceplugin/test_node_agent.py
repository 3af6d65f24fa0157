"""One node agent per node (`deviceplugin/agent/node.py`): the DRA plugin with the labels, the
holders and the MIG map in one process on one discovery, each MIG change discovered once and
handed to every part, the labels carrying the same health as the taints; and the plugin-less
agent keeping the GPUs' health from their XIDs."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

from deviceplugin import cli
from deviceplugin.agent import holding
from deviceplugin.agent.labels import GPUS_ANNOTATION
from deviceplugin.agent.node import NodeAgent
from deviceplugin.config import Config
from deviceplugin.dra.plugin import DraPlugin
from deviceplugin.gpus import healthfile
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import holders, mig, nodegpus, sim
from testbed.apiserver import ApiServer
from testbed.waiting import until
from tests.deviceplugin.test_discovery import Counted
from tests.deviceplugin.test_dra_plugin import NODE, Cluster, cluster_of


def annotated(api: ApiServer) -> tuple[nodegpus.NodeGpu, ...]:
    node = api.get("nodes", NODE) or {}
    text = (node.get("metadata", {}).get("annotations") or {}).get(GPUS_ANNOTATION)
    return nodegpus.decode(text) if text else ()


def test_the_dra_plugin_its_labels_and_holders_are_one_agent_on_one_discovery(
    tmp_path: Path, socket_dir: Path
) -> None:
    """Before, a DRA node ran the DRA plugin and a plugin-less labeler beside it: two NVML
    discoveries per change, and labels whose health knew nothing of the plugin's taints."""
    machine = sim.with_mig(sim.make_machine(gpus=2), 0, ("3g.40gb",))
    with cluster_of(machine, tmp_path, socket_dir) as c:
        counted = Counted(c.root)
        settings = holding.Settings(
            records_dir=str(tmp_path / "records"),
            pod_resources="/nonexistent",
            publish=True,
            interval=0.2,
        )
        config = replace(c.config, labels=True, recover_after=600.0,
                         mig_map=str(tmp_path / "mig.json"))  # fmt: skip
        plugin = DraPlugin(config, counted, c.api.client(), holders=settings)
        stop = threading.Event()
        thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
        thread.start()
        try:
            until(lambda: len(annotated(c.api)) == 2 and holders.ANNOTATION in node_annotations(c))
            until(lambda: any(d.startswith("gpu-0-mig-3g40gb") for d in c.devices()))
            assert counted.discoveries == 1  # plugin, labels, holders, MIG map: one discovery
            made = c.root.parent / "made"  # the change whole at once (write_node is not)
            sim.write_node(made, sim.create_mig(machine, 0, "3g.40gb"))
            os.rename(c.root, c.root.parent / "before")
            os.rename(made, c.root)
            until(lambda: sum(d.startswith("gpu-0-mig-3g40gb") for d in c.devices()) == 2)
            until(lambda: len(annotated(c.api)[0].mig or ()) == 2)
            until(lambda: sum(map(len, mig.read_map(config.mig_map).values())) == 2)
            assert counted.discoveries == 2  # one MIG change: one discovery, for every part
            sim.inject_fault(c.root, machine.devices[1].uuid, 79)
            until(lambda: "taints" in c.devices()["gpu-1"])
            until(lambda: [g.healthy for g in annotated(c.api)] == [True, False])
        finally:
            stop.set()
            thread.join(timeout=20)
    assert not thread.is_alive()


def node_annotations(c: Cluster) -> dict[str, str]:
    node = c.api.get("nodes", NODE) or {}
    return dict(node.get("metadata", {}).get("annotations") or {})


def test_the_plugin_less_agent_keeps_health_from_xids_across_a_restart(
    tmp_path: Path, sim_node: tuple[Path, sim.Machine]
) -> None:
    """`gpuwire node label --watch` is the node agent without a plugin: before, the GPUs it
    labelled unhealthy were only those the driver no longer reached, so a GPU with a fatal
    XID stayed healthy in gpuwire.io/gpus (and kept its MPS daemon)."""
    root, machine = sim_node
    with ApiServer() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        config = Config(sim=str(root), node_name=NODE, kubeconfig=kubeconfig,
                        label_interval=0.2, recover_after=600.0)  # fmt: skip
        for restart in (False, True):
            run_plugin_less(api, config, machine, restart)


def run_plugin_less(api: ApiServer, config: Config, machine: sim.Machine, restart: bool) -> None:
    """One run of the agent: the first injects the fault, the second starts after it."""
    bad = machine.devices[3].uuid
    stop = threading.Event()
    thread = threading.Thread(target=cli._watch, args=(config, None, stop), daemon=True)
    thread.start()
    try:
        until(lambda: len(annotated(api)) == 4)
        if not restart:
            sim.inject_fault(Path(str(config.sim)), bad, 48)
        until(lambda: [g.uuid for g in annotated(api) if not g.healthy] == [bad])
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive()
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})  # unlabelled


def test_the_plugin_less_agent_rebuilds_a_torn_health_state_from_the_nodes_gpus(
    tmp_path: Path, sim_node: tuple[Path, sim.Machine]
) -> None:
    """The plugin-less agent's health file cut short: not believed, nor is every GPU taken for
    healthy: the GPUs the Node's gpuwire.io/gpus said were unhealthy are unhealthy again (and
    labelled so from the rebuilt state once the Node has forgotten); the bad file is kept
    aside."""
    root, machine = sim_node
    bad = machine.devices[3].uuid
    with ApiServer() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        config = Config(sim=str(root), node_name=NODE, kubeconfig=kubeconfig,
                        label_interval=0.2, recover_after=600.0)  # fmt: skip
        stop = threading.Event()
        thread = threading.Thread(target=cli._watch, args=(config, None, stop), daemon=True)
        thread.start()
        try:
            until(lambda: len(annotated(api)) == 4)
            sim.inject_fault(root, bad, 48)
            until(lambda: [g.uuid for g in annotated(api) if not g.healthy] == [bad])
        finally:
            stop.set()
            thread.join(timeout=20)
        state = Path(config.node_state())
        whole = (state / healthfile.NAME).read_text()
        (state / healthfile.NAME).write_text(whole[: len(whole) // 2])
        agent = NodeAgent(replace(config, labels=True), SimDiscovery(str(root)), str(state))
        agent.discovery.close()
        assert agent.health.unhealthy() == {bad}
        assert [p.name.split(".bad-")[0] for p in state.glob("*.bad-*")] == [healthfile.NAME]
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})  # forgotten
        run_plugin_less(api, config, machine, restart=True)  # labelled unhealthy again
