"""Discovery on the simulated node: the machine as written, and faults injected with
`gpuwire sim fault` delivered like NVML XID events (only those after start)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from deviceplugin.gpus.backend import open_discovery
from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import cli, sim


def test_discovers_the_inventory(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    node = open_discovery(str(root)).discover()
    assert node.devices == machine.devices
    assert [g.compute_capability for g in node.gpus] == [(8, 0)] * 4
    assert (node.driver_version, node.cuda_version) == (sim.DEFAULT_DRIVER, sim.DEFAULT_CUDA)


def test_faults_after_start_arrive_as_xid_events(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    uuid = machine.devices[2].uuid
    sim.inject_fault(root, uuid, 48)  # before the plugin started: history
    discovery = SimDiscovery(root)
    assert discovery.wait_events(0.01) == []
    assert cli.main(["sim", "fault", str(root), "--gpu", "2", "--xid", "79"]) == 0
    assert discovery.wait_events(0.01) == [HealthEvent(uuid, 79, "XID 79")]
    discovery.close()


def test_a_waiting_reader_wakes_on_the_append(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    discovery = SimDiscovery(root)
    got: list[HealthEvent] = []
    waiter = threading.Thread(target=lambda: got.extend(discovery.wait_events(30)))
    waiter.start()
    time.sleep(0.1)
    sim.inject_fault(root, machine.devices[0].uuid, 31)
    waiter.join(timeout=30)
    assert got == [HealthEvent(machine.devices[0].uuid, 31, "XID 31")]
    discovery.close()


def test_malformed_and_partial_lines(sim_node: tuple[Path, sim.Machine]) -> None:
    root, _ = sim_node
    discovery = SimDiscovery(root)
    events = root / sim.EVENTS
    with open(events, "a") as f:
        f.write('not json\n{"uuid": "GPU-x"}\n{"uuid": "GPU-y", "xid": 79')
    assert discovery.wait_events(0.01) == []
    with open(events, "a") as f:
        f.write("}\n")
    assert discovery.wait_events(0.01) == [HealthEvent("GPU-y", 79, "XID 79")]


def test_alive_follows_the_inventory(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    discovery = SimDiscovery(root)
    assert discovery.alive(machine.devices[3].uuid)
    smaller = sim.make_machine(gpus=3)
    sim.write_node(root, smaller)
    assert not discovery.alive(machine.devices[3].uuid)
