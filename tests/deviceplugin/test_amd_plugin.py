"""The device plugin and node agent on an AMD node: AMD's discovery from sysfs, AMD's resource
naming, the kubelet stand-in's registration, preferred allocation and Allocate over real unix
sockets, health from the kernel's RAS counts, AMD's labels."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from deviceplugin.agent import labeler
from deviceplugin.config import Config
from deviceplugin.gpus.amd import AmdDiscovery
from deviceplugin.plugin import amdresources
from deviceplugin.vendors import AMD_NODE
from gpuwire import allocation, amdsim, nodegpus
from gpuwire.grant import KeyRing
from testbed.kubelet import Kubelet
from tests.deviceplugin.support import serving

RESOURCE = "amd.com/gpu"


def written(root: Path, machine: amdsim.AmdMachine) -> Path:
    amdsim.write_node(root, machine)
    return root


@pytest.fixture
def cpx(tmp_path: Path) -> Path:
    """Two MI300X in CPX/NPS4: sixteen partitions."""
    machine = amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS4")
    return written(tmp_path / "node", machine)


@pytest.fixture
def config(tmp_path: Path, socket_dir: Path, cpx: Path) -> Config:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "key-1").write_text("cluster secret")
    return Config(
        kubelet_dir=str(socket_dir),
        sim=str(cpx),
        vendor="amd",
        allocation_dir=str(tmp_path / "allocations"),
        grant_key_dir=str(keys),
        device_specs=True,
        recover_after=0.3,
    )


def test_single_naming_is_amd_com_gpu_mixed_a_resource_per_partition_type(
    cpx: Path, tmp_path: Path
) -> None:
    node = AmdDiscovery(str(cpx)).discover()
    single, _ = AMD_NODE.resources(Config(vendor="amd"), node)
    assert [(r.name, len(r.gpus)) for r in single] == [(RESOURCE, 16)]
    mixed, _ = AMD_NODE.resources(Config(vendor="amd", amd_naming="mixed"), node)
    assert [(r.name, len(r.gpus)) for r in mixed] == [("amd.com/cpx_nps4", 16)]
    mi210 = written(tmp_path / "mi210", amdsim.make_machine(2, "MI210"))
    whole, _ = AMD_NODE.resources(
        Config(vendor="amd", amd_naming="mixed"), AmdDiscovery(str(mi210)).discover()
    )
    assert [(r.name, len(r.gpus)) for r in whole] == [(RESOURCE, 2)]  # no partition modes


def test_single_naming_refuses_two_partition_types(tmp_path: Path) -> None:
    machine = amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS4")
    spx = replace(machine.gpus[1], compute="SPX", memory="NPS1")
    machine = replace(machine, gpus=(machine.gpus[0], spx))
    node = AmdDiscovery(str(written(tmp_path, machine))).discover()
    with pytest.raises(amdresources.NamingError, match=r"partitioned in 2 ways \(cpx_nps4"):
        AMD_NODE.resources(Config(vendor="amd"), node)
    mixed, _ = AMD_NODE.resources(Config(vendor="amd", amd_naming="mixed"), node)
    assert [(r.name, len(r.gpus)) for r in mixed] == [
        ("amd.com/cpx_nps4", 8),
        ("amd.com/spx_nps1", 1),
    ]


def test_the_kubelet_gets_partitions_of_one_gpu_and_a_proof(
    config: Config, cpx: Path, socket_dir: Path
) -> None:
    found = AmdDiscovery(str(cpx)).discover()
    with Kubelet(socket_dir) as kubelet, serving(config):
        plugin = kubelet.plugin(RESOURCE)
        assert (plugin.capacity, plugin.allocatable) == (16, 16)
        ids, answer = kubelet.admit(RESOURCE, 3, pod_uid="pod-a")
    devices = {d.uuid: d for d in found.devices}
    assert sorted(devices[i].index for i in ids) == [0, 1, 2]  # one GPU's, AMD's rules
    assert answer.envs["AMD_VISIBLE_DEVICES"] == ",".join(ids)
    assert "NVIDIA_VISIBLE_DEVICES" not in answer.envs
    specs = [d.container_path for d in answer.devices]
    assert specs == ["/dev/kfd", *(f"/dev/dri/renderD{devices[i].minor}" for i in ids)]
    [mount] = answer.mounts
    token = allocation.token_of(mount.container_path)
    assert token is not None
    proof = allocation.read(config.allocation_dir, token, KeyRing.load(config.grant_key_dir))
    assert (proof.resource, proof.devices) == (RESOURCE, tuple(sorted(ids)))


def test_an_uncorrectable_error_makes_the_gpu_unhealthy(cpx: Path) -> None:
    discovery = AmdDiscovery(str(cpx))
    node = discovery.discover()
    assert discovery.wait_events(0) == []
    amdsim.write_node(cpx, amdsim.with_ras(amdsim.load_machine(cpx), 1, 1))
    events = discovery.wait_events(2)
    sick = [d.uuid for d in node.devices if d.pci_bus_id == "0000:15:00.0"]
    assert sorted(e.uuid for e in events if e.uuid) == sorted(sick)  # each partition of GPU 1
    assert {e.detail for e in events} == {"uncorrectable RAS errors: umc 1"}
    assert not discovery.alive(sick[0])
    assert discovery.alive(node.devices[0].uuid)


def test_the_node_agent_writes_amds_labels_and_every_partition(cpx: Path) -> None:
    config = Config(vendor="amd", amd_naming="mixed", sim=str(cpx))
    node = AmdDiscovery(str(cpx)).discover()
    wanted = labeler.wanted(config, node)
    assert wanted["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X"
    assert wanted["amd.com/gpu.compute-memory-partition"] == "cpx_nps4"
    assert (wanted["amd.com/gpu.cu-count"], wanted["amd.com/gpu.vram"]) == ("38", "24G")
    assert (wanted["gpuwire.io/gpu.count"], wanted["gpuwire.io/gpu.vendor"]) == ("16", "amd")
    assert not any(k.startswith("nvidia.com/") for k in wanted)
    (value,) = labeler.node_annotations(config, node).values()
    gpus = nodegpus.decode(value)
    assert {(g.vendor, g.resource) for g in gpus} == {("amd", "amd.com/cpx_nps4")}
    assert {g.parent for g in gpus[:8]} == {node.kfd.gpus[0].parent}  # GPU 0's partitions
