"""The node every long-running part of a process shares (`discovery.Latest`): one discovery
for all of them after a MIG change, one that lands during a discovery or half-written seen at
the next look; `follow` handing on a changed node once and an equal one never; and the MIG
map put back by its own rule. On the simulated node, whose discoveries are counted (on a
real node each is a walk through NVML)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deviceplugin.agent import labeler
from deviceplugin.gpus import discovery
from deviceplugin.gpus.discovery import Latest, NodeGpus, follow
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import mig, sim
from testbed.waiting import until


class Counted(SimDiscovery):
    """The simulated node's discovery, counting its discoveries."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.discoveries = 0

    def discover(self) -> NodeGpus:
        self.discoveries += 1
        return super().discover()


@pytest.fixture
def mig_node(sim_node: tuple[Path, sim.Machine]) -> tuple[Path, sim.Machine]:
    """GPU 0 in MIG mode with one instance."""
    root, machine = sim_node
    machine = sim.with_mig(machine, 0, ("3g.40gb",))
    sim.write_node(root, machine)
    return root, machine


@contextmanager
def running(job: Callable[[threading.Event], None]) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=job, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def test_one_mig_change_costs_one_discovery_for_every_part(
    mig_node: tuple[Path, sim.Machine],
) -> None:
    root, machine = mig_node
    counted = Counted(root)
    latest = Latest(counted)
    node = latest()
    assert [latest() for _ in range(3)] == [node] * 3  # the labeler, the agent, the follower
    assert counted.discoveries == 1
    sim.write_node(root, sim.create_mig(machine, 0, "3g.40gb"))
    moved = [latest() for _ in range(3)]
    assert counted.discoveries == 2
    assert moved == [moved[0]] * 3
    assert len(moved[0].mig) == 2
    assert latest(within=0) == moved[0]  # older than a caller accepts: discovered again
    assert counted.discoveries == 3


def test_a_mig_change_made_during_a_discovery_is_seen_at_the_next_look(
    mig_node: tuple[Path, sim.Machine],
) -> None:
    root, machine = mig_node
    made = sim.create_mig(machine, 0, "3g.40gb")

    class Overtaken(SimDiscovery):
        def discover(self) -> NodeGpus:
            node = super().discover()
            sim.write_node(root, made)  # the change lands as the discovery returns
            return node

    latest = Latest(Overtaken(root))
    assert len(latest().mig) == 1
    assert len(latest().mig) == 2


def test_an_instance_procfs_shows_before_the_machine_names_it_is_seen_once_it_does(
    mig_node: tuple[Path, sim.Machine],
) -> None:
    """`gpuwire sim` writes procfs's instances first and the machine last; a look between the
    two leaves the new instance for the next look, which must not take it for seen."""
    root, machine = mig_node
    made = sim.create_mig(machine, 0, "3g.40gb")
    latest = Latest(SimDiscovery(root))
    latest()
    sim.write_node(root, made)
    (root / sim.MACHINE).write_text(machine.to_json())  # procfs ahead of the machine
    assert len(latest().mig) == 1
    (root / sim.MACHINE).write_text(made.to_json())
    assert len(latest().mig) == 2


def test_follow_hands_on_a_changed_node_once_and_an_equal_one_never(
    mig_node: tuple[Path, sim.Machine], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery, "LOOK", 0.01)
    monkeypatch.setattr(discovery, "REDISCOVER", 0.05)
    root, machine = mig_node
    counted = Counted(root)
    latest = Latest(counted)
    changes: list[NodeGpus] = []
    node = latest()
    with running(lambda stop: follow(latest, node, changes.append, stop)):
        until(lambda: counted.discoveries >= 5)  # discovered again and again: the same node
        assert changes == []
        made = root.parent / "made"  # the change whole at once: write_node is not atomic
        sim.write_node(made, sim.create_mig(machine, 0, "3g.40gb"))
        os.rename(root, root.parent / "before")
        os.rename(made, root)
        until(lambda: len(changes) == 1)
        seen = counted.discoveries
        until(lambda: counted.discoveries >= seen + 5)
    assert len(changes) == 1
    assert changes[0] == SimDiscovery(root).discover()
    assert len(changes[0].mig) == 2


def test_follow_sees_a_gpu_the_driver_drops_and_lists_again_at_its_next_look(
    sim_node: tuple[Path, sim.Machine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU the driver stops listing (off the bus), and lists again, is a change at the
    next look, not at the next rediscovery (60 s): its health is watched again at once.
    Before: only MIG instances were looked at, and a GPU dropped by a rediscovery while it
    was gone stayed unwatched for up to a minute after it came back."""
    monkeypatch.setattr(discovery, "LOOK", 0.01)
    root, machine = sim_node
    latest = Latest(SimDiscovery(root))
    changes: list[NodeGpus] = []
    gone = sim.Machine(machine.driver_version, machine.cuda_version, machine.gpus[1:])
    node = latest()
    with running(lambda stop: follow(latest, node, changes.append, stop)):
        (root / sim.MACHINE).write_text(gone.to_json())
        until(lambda: len(changes) == 1, timeout=5)
        (root / sim.MACHINE).write_text(machine.to_json())
        until(lambda: len(changes) == 2, timeout=5)
    assert [len(c.devices) for c in changes] == [len(machine.gpus) - 1, len(machine.gpus)]


def test_the_mig_map_is_put_back_when_it_is_gone(
    mig_node: tuple[Path, sim.Machine], tmp_path: Path
) -> None:
    """A map that failed to be written or was removed (a cleaned /run) does not wait for a
    MIG change: the device plugin writes it again on its own rule."""
    root, _ = mig_node
    path = tmp_path / "run" / "mig-devices"
    latest = Latest(SimDiscovery(root))
    with running(lambda stop: labeler.keep_mig_map(str(path), latest, stop, 0.01)):
        until(path.exists)
        path.unlink()
        until(path.exists)
    ((parent, names),) = mig.read_map(str(path)).items()
    assert [uuid for uuid, *_ in names.values()] == [m.uuid for m in latest().mig_devices]
    assert parent == latest().devices[0].uuid
