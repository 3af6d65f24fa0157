"""MIG in the device plugin: NVIDIA's strategies (none, single, mixed), discovery through
NVML and on the simulated node agreeing with the runtime side's procfs, MIG changes picked
up while serving, and health per MIG device; driven by the kubelet stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from deviceplugin.api import api_pb2
from deviceplugin.config import Config
from deviceplugin.gpus.discovery import HealthEvent, NodeGpus
from deviceplugin.gpus.health import HealthBook, HealthPolicy
from deviceplugin.gpus.nvml import NvmlDiscovery
from deviceplugin.gpus.simulated import SimDiscovery
from deviceplugin.plugin import migstrategy
from gpuwire import cli, mig, sim
from gpuwire.driver import discover
from gpuwire.roots import Roots
from testbed.kubelet import Kubelet
from testbed.nvml import StandIn
from tests.deviceplugin.support import serving

GPU = "nvidia.com/gpu"


def node_with(tmp_path: Path, layout: dict[int, tuple[str, ...]], gpus: int = 4) -> Path:
    machine = sim.make_machine(gpus=gpus)
    for index, profiles in layout.items():
        machine = sim.with_mig(machine, index, profiles)
    root = tmp_path / "node"
    sim.write_node(root, machine)
    return root


def found(root: Path) -> NodeGpus:
    return SimDiscovery(root).discover()


@pytest.fixture
def config(tmp_path: Path, socket_dir: Path) -> Config:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "key-1").write_text("cluster secret")
    return Config(
        kubelet_dir=str(socket_dir),
        allocation_dir=str(tmp_path / "allocations"),
        grant_key_dir=str(keys),
        mig_map=str(tmp_path / "run/mig-devices"),
        recover_after=None,
    )


@pytest.fixture
def kubelet(config: Config) -> Iterator[Kubelet]:
    with Kubelet(Path(config.kubelet_dir)) as k:
        yield k


# -- discovery: NVML, the simulated node and procfs say the same ----------------------------


def test_nvml_and_the_simulated_node_and_procfs_find_the_same_mig_devices(tmp_path: Path) -> None:
    root = node_with(tmp_path, {0: ("balanced",), 1: ("1g.10gb+me", "3g.40gb"), 2: ()})
    machine = sim.load_machine(root)
    nvml = StandIn.of_machine(machine).module()
    through_nvml = NvmlDiscovery(nvml, proc=str(root), sysfs=str(root / "sys")).discover()
    assert through_nvml == found(root)
    assert [g.mig_enabled for g in through_nvml.gpus] == [True, True, True, False]
    profiles = sorted(m.device.profile for m in through_nvml.mig)
    assert profiles == ["1g.10gb", "1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "3g.40gb"]
    # the runtime side: procfs alone, named by the map the node agent writes from NVML
    path = str(tmp_path / "mig-devices")
    mig.write_map(path, through_nvml.mig_devices)
    procfs = discover(Roots(str(root)), ("utility",)).mig
    assert mig.identify(procfs, mig.read_map(path)) == through_nvml.mig_devices


def test_nvml_skips_empty_slots_and_names_an_instance_event(tmp_path: Path) -> None:
    root = node_with(tmp_path, {0: ("1g.10gb", "2g.20gb")}, gpus=1)
    stand_in = StandIn.of_machine(sim.load_machine(root))
    gpu = stand_in.gpus[0]
    gpu.mig = [None, gpu.mig[0], None, gpu.mig[1]]  # NVML's slots need not be dense
    nvml = NvmlDiscovery(stand_in.module(), proc=str(root))
    devices = nvml.discover().mig_devices
    assert [d.profile for d in devices] == ["2g.20gb", "1g.10gb"]  # by GPU instance
    stand_in.xid(gpu, 79, (devices[1].gi, devices[1].ci))
    stand_in.xid(gpu, 48)
    assert nvml.wait_events(0.1) == [
        HealthEvent(devices[1].uuid, 79, f"XID 79 on MIG GI {devices[1].gi} CI 0")
    ]
    assert nvml.wait_events(0.1) == [HealthEvent(gpu.uuid, 48, "XID 48")]
    assert nvml.alive(devices[0].uuid)
    gpu.mig = [gpu.mig[3]]  # the 2g.20gb destroyed
    assert not nvml.alive(devices[0].uuid)


def test_an_xid_on_a_gpu_marks_its_mig_devices_and_one_on_a_mig_device_only_it(
    tmp_path: Path,
) -> None:
    node = found(node_with(tmp_path, {0: ("1g.10gb", "2g.20gb")}))
    uuids, children = node.watched()
    a, b = node.mig_devices
    book = HealthBook(HealthPolicy(), uuids, children=children)
    assert book.record([HealthEvent(b.uuid, 79, "")], 0.0) == {b.uuid}
    parent = node.devices[0].uuid
    assert book.record([HealthEvent(parent, 79, "")], 0.0) == {parent, a.uuid, b.uuid}
    book.track(frozenset(uuids - {a.uuid}), children)  # `a` destroyed
    assert book.unhealthy() == {parent, b.uuid}


# -- strategies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ({0: ("1g.10gb",), 1: ("2g.20gb",)}, "more than one MIG device type present on node"),
        ({0: ("1g.10gb",)}, "the same migEnabled value (MIG is off on GPU 1, 2, 3)"),
        ({i: ("1g.10gb",) for i in range(3)} | {3: ()}, "GPU 3 is in MIG mode but has no MIG"),
    ],
)
def test_single_strategy_rules_are_nvidias(
    tmp_path: Path, layout: dict[int, tuple[str, ...]], problem: str
) -> None:
    advertised = migstrategy.advertise(found(node_with(tmp_path, layout)), "single", GPU)
    assert (advertised.gpus, advertised.mig, advertised.invalid) == ((), {GPU: ()}, True)
    assert any(problem in p for p in advertised.problems)


def test_strategies_on_one_node(tmp_path: Path) -> None:
    node = found(node_with(tmp_path, {0: ("3g.40gb", "1g.10gb", "1g.10gb+me"), 1: ()}))
    none = migstrategy.advertise(node, "none", GPU)
    assert none.gpus == node.devices
    mixed = migstrategy.advertise(node, "mixed", GPU)
    assert mixed.gpus == node.devices[2:]
    assert {k: [m.profile for m in v] for k, v in mixed.mig.items()} == {
        "nvidia.com/mig-1g.10gb": ["1g.10gb"],
        "nvidia.com/mig-1g.10gb.me": ["1g.10gb+me"],
        "nvidia.com/mig-3g.40gb": ["3g.40gb"],
    }
    assert mixed.problems == ("GPU 1 is in MIG mode but has no MIG devices yet",)
    assert not migstrategy.whole("1c.3g.40gb")


# -- through the kubelet ---------------------------------------------------------------------


def test_mixed_resources_reach_the_kubelet_and_allocate_mig_devices(
    tmp_path: Path, config: Config, kubelet: Kubelet
) -> None:
    root = node_with(tmp_path, {0: ("balanced",)})
    node = found(root)
    small = [m for m in node.mig_devices if m.profile == "1g.10gb"]
    with serving(replace(config, sim=str(root), mig_strategy="mixed", device_specs=True)):
        whole = kubelet.plugin(GPU)
        assert [d.ID for d in whole.devices] == [d.uuid for d in node.devices[1:]]
        ones = kubelet.plugin("nvidia.com/mig-1g.10gb")
        assert sorted(d.ID for d in ones.devices) == sorted(m.uuid for m in small)
        assert kubelet.plugin("nvidia.com/mig-3g.40gb").capacity == 1
        ids, answer = kubelet.admit("nvidia.com/mig-1g.10gb", 1)
    (chosen,) = [m for m in small if m.uuid == ids[0]]
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == chosen.uuid
    specs = [d.container_path for d in answer.devices]
    assert specs[-3:] == [
        "/dev/nvidia0",
        f"/dev/nvidia-caps/nvidia-cap{chosen.gi_cap}",
        f"/dev/nvidia-caps/nvidia-cap{chosen.ci_cap}",
    ]
    assert mig.read_map(config.mig_map)[node.devices[0].uuid][(chosen.gi, chosen.ci)][0] == ids[0]


def test_none_strategy_advertises_whole_gpus_mig_or_not(
    tmp_path: Path, config: Config, kubelet: Kubelet
) -> None:
    root = node_with(tmp_path, {0: ("balanced",)})
    node = found(root)
    with serving(replace(config, sim=str(root))):  # the default strategy
        plugin_ = kubelet.plugin(GPU)
        assert [d.ID for d in plugin_.devices] == [d.uuid for d in node.devices]
        ids, _ = kubelet.admit(GPU, 4)
    assert sorted(ids) == sorted(d.uuid for d in node.devices)
    assert not any(r.resource_name.startswith("nvidia.com/mig-") for r in kubelet.registrations)
    assert mig.read_map(config.mig_map)  # the node side can name the MIG devices all the same


def test_single_strategy_advertises_identical_mig_devices_as_gpus(
    tmp_path: Path, config: Config, kubelet: Kubelet
) -> None:
    root = node_with(tmp_path, {i: ("2g.20gb", "2g.20gb") for i in range(4)})
    with serving(replace(config, sim=str(root), mig_strategy="single")):
        plugin_ = kubelet.plugin(GPU)
        assert plugin_.capacity == 8
        assert all(d.ID.startswith("MIG-") for d in plugin_.devices)
        ids, answer = kubelet.admit(GPU, 2)
    parents = {m.uuid: m.parent_index for m in found(root).mig_devices}
    assert parents[ids[0]] == parents[ids[1]]  # two MIG devices of one GPU: closest
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)


def test_mig_changes_are_picked_up_while_serving(
    tmp_path: Path, config: Config, kubelet: Kubelet
) -> None:
    """A GPU in MIG mode without MIG devices yet: nothing, then what is created, then less
    when some is destroyed; a new profile registers a resource of its own. No restart."""
    root = node_with(tmp_path, {0: ()}, gpus=1)
    with serving(replace(config, sim=str(root), mig_strategy="single")):
        plugin_ = kubelet.plugin(GPU)
        assert plugin_.capacity == 0  # MIG on, no MIG devices yet: NVIDIA's plugin fails here
        seen = len(plugin_.snapshots)
        args = ["sim", "mig", str(root), "--gpu", "0", "--create", "1g.10gb", "--create"]
        assert cli.main([*args, "1g.10gb"]) == 0
        created = kubelet.next_snapshot(plugin_, seen)
        made = found(root).mig_devices
        assert sorted(d.ID for d in created) == sorted(m.uuid for m in made)
        assert len(mig.read_map(config.mig_map)[made[0].parent_uuid]) == 2
        seen = len(plugin_.snapshots)
        assert cli.main(["sim", "mig", str(root), "--gpu", "0", "--destroy", str(made[0].gi)]) == 0
        assert [d.ID for d in kubelet.next_snapshot(plugin_, seen)] == [made[1].uuid]
    with serving(replace(config, sim=str(root), mig_strategy="mixed")):
        assert kubelet.plugin("nvidia.com/mig-1g.10gb").capacity == 1
        assert cli.main(["sim", "mig", str(root), "--gpu", "0", "--create", "3g.40gb"]) == 0
        bigger = kubelet.plugin("nvidia.com/mig-3g.40gb")
        assert bigger.capacity == 1
        ids, _ = kubelet.admit("nvidia.com/mig-3g.40gb", 1)
        assert ids == [d.ID for d in bigger.devices]


def test_an_xid_on_the_parent_gpu_marks_its_mig_devices_unhealthy(
    tmp_path: Path, config: Config, kubelet: Kubelet
) -> None:
    root = node_with(tmp_path, {0: ("1g.10gb", "1g.10gb"), 1: ("1g.10gb",)}, gpus=2)
    node = found(root)
    first, second, other = node.mig_devices
    with serving(replace(config, sim=str(root), mig_strategy="single")):
        plugin_ = kubelet.plugin(GPU)
        seen = len(plugin_.snapshots)
        assert cli.main(["sim", "fault", str(root), "--gpu", first.uuid, "--xid", "79"]) == 0
        health = {d.ID: d.health for d in kubelet.next_snapshot(plugin_, seen)}
        assert health == {first.uuid: "Unhealthy", second.uuid: "Healthy", other.uuid: "Healthy"}
        seen = len(plugin_.snapshots)
        assert cli.main(["sim", "fault", str(root), "--gpu", "0", "--xid", "79"]) == 0
        health = {d.ID: d.health for d in kubelet.next_snapshot(plugin_, seen)}
        assert health == {first.uuid: "Unhealthy", second.uuid: "Unhealthy", other.uuid: "Healthy"}
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[second.uuid])]
        )
        with pytest.raises(Exception, match="is unhealthy"):
            plugin_.stub.Allocate(request, timeout=5)


# -- GPU Feature Discovery's MIG labels ------------------------------------------------------


def mig_labels(root: Path, strategy: str) -> dict[str, str]:
    from deviceplugin.agent.labeler import wanted

    return wanted(Config(mig_strategy=strategy), found(root))


def test_single_strategy_labels_describe_the_mig_devices(tmp_path: Path) -> None:
    root = node_with(tmp_path, {i: ("3g.40gb", "3g.40gb") for i in range(2)}, gpus=2)
    out = mig_labels(root, "single")
    assert {k: v for k, v in out.items() if k.startswith("nvidia.com/") and "cuda" not in k} == {
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "40192",
        "nvidia.com/gpu.multiprocessors": "42",
        "nvidia.com/gpu.slices.gi": "3",
        "nvidia.com/gpu.slices.ci": "3",
        "nvidia.com/gpu.engines.copy": "3",
        "nvidia.com/gpu.engines.decoder": "2",
        "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "0",
        "nvidia.com/gpu.engines.ofa": "0",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    assert out["gpuwire.io/gpu.mig.3g.40gb"] == "4"
    invalid = mig_labels(node_with(tmp_path / "x", {0: ("1g.10gb",), 1: ()}, gpus=2), "single")
    assert invalid["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert (invalid["nvidia.com/gpu.count"], invalid["nvidia.com/gpu.memory"]) == ("0", "0")


def test_mixed_strategy_labels_per_profile_and_stale_ones_go(tmp_path: Path) -> None:
    from deviceplugin.agent.labels import GFD_KEYS, MIG_PREFIX, OWN_PREFIX, changes

    out = mig_labels(node_with(tmp_path, {0: ("balanced",)}), "mixed")
    assert out["nvidia.com/mig.strategy"] == "mixed"
    assert out["nvidia.com/mig-1g.10gb.count"] == "2"
    assert out["nvidia.com/mig-1g.10gb.memory"] == "9856"
    assert out["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    assert out["nvidia.com/mig-2g.20gb.multiprocessors"] == "28"
    assert out["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # the whole GPUs'
    before = {**out, "nvidia.com/mig-7g.80gb.count": "1", "nvidia.com/mig.config": "x"}
    patch = changes(before, out, (*GFD_KEYS, MIG_PREFIX, OWN_PREFIX))
    assert patch == {"nvidia.com/mig-7g.80gb.count": None}  # mig-manager's own key stays
