"""AMD discovery reads the kernel's formats: every simulated AMD node, and real KFD captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import amd, amdsim, kfd
from gpuwire.roots import Roots
from tests.gpuwire import kfd_captures


def written(root: Path, machine: amdsim.AmdMachine) -> kfd.AmdNode:
    amdsim.write_node(root, machine)
    return kfd.discover(Roots(str(root)))


def test_mi210s_on_pcie_are_whole_gpus_reached_through_the_cpus(tmp_path: Path) -> None:
    node = written(tmp_path, amdsim.make_machine(4, "MI210", hive_size=0))
    assert node.version == amdsim.DRIVER_VERSION
    assert node.kfd is not None
    assert (node.kfd.major, node.kfd.minor) == (amdsim.KFD_MAJOR, 0)
    assert [d.index for d in node.devices] == [0, 1, 2, 3]
    assert [d.pci_bus_id for d in node.devices] == [
        "0000:05:00.0", "0000:15:00.0", "0000:65:00.0", "0000:75:00.0"
    ]  # fmt: skip
    for gpu in node.gpus:
        assert (gpu.device.product, gpu.device.memory_mib) == ("AMD Instinct MI210", 65536)
        assert (gpu.compute_units, amd.gfx_name(gpu.gfx_target_version)) == (104, "gfx90a")
        assert (gpu.parent, gpu.partition_type, gpu.hive_id, gpu.healthy) == ("", "", 0, True)
        assert gpu.device.nvlinks == ()
        assert {link.type for link in gpu.links} == {amd.LINK_PCIE}
    # a server's BMC display controller is card0: GPU N is card N+1 but renderD 128+N
    assert [(g.card, g.device.minor) for g in node.gpus] == [(1, 128), (2, 129), (3, 130), (4, 131)]
    assert [d.numa_node for d in node.devices] == [0, 0, 1, 1]
    assert len({d.uuid for d in node.devices}) == 4
    assert all(d.uuid.startswith("GPU-") and len(d.uuid) == 20 for d in node.devices)


def test_mi210_xgmi_hives_link_their_members_only(tmp_path: Path) -> None:
    node = written(tmp_path, amdsim.make_machine(8, "MI210", hive_size=4))
    assert [g.device.nvlinks for g in node.gpus[:2]] == [
        ((1, 1), (2, 1), (3, 1)),
        ((0, 1), (2, 1), (3, 1)),
    ]
    assert node.gpus[4].device.nvlinks == ((5, 1), (6, 1), (7, 1))
    hives = [g.hive_id for g in node.gpus]
    assert len(set(hives[:4])) == len(set(hives[4:])) == 1
    assert hives[0] != hives[4] != 0


def test_mi300x_in_spx_is_eight_whole_gpus_in_one_fully_connected_hive(tmp_path: Path) -> None:
    node = written(tmp_path, amdsim.make_machine(8, "MI300X"))
    assert len(node.devices) == 8
    for gpu in node.gpus:
        d = gpu.device
        assert (d.product, d.memory_mib, gpu.compute_units) == ("AMD Instinct MI300X", 196608, 304)
        assert (gpu.partition_type, gpu.parent, gpu.partition) == ("spx_nps1", "", 0)
        assert [peer for peer, _ in d.nvlinks] == [i for i in range(8) if i != d.index]
        assert amd.family(gpu.gfx_target_version) == "AI"
    # the partition platform devices exist in every mode; in SPX KFD lists none of them
    assert len(list((tmp_path / "sys/devices/platform").glob("amdgpu_xcp_*"))) == 56


MODES = [(c, m) for c, memories in amdsim.VALID_MODES.items() for m in memories]


@pytest.mark.parametrize(("compute", "memory"), MODES, ids=[f"{c}-{m}" for c, m in MODES])
def test_mi300x_in_every_mode_amdgpu_allows_is_its_partitions_each_a_device(
    tmp_path: Path, compute: str, memory: str
) -> None:
    """Every compute and memory mode the simulator has (amdgpu's valid pairs): a partition
    is a device of its own, with its share of the GPU, its parent, its DRM nodes."""
    machine = amdsim.make_machine(8, "MI300X", compute=compute, memory=memory)
    node = written(tmp_path, machine)
    n = amd.COMPUTE_PARTITIONS[compute]
    assert len(node.devices) == 8 * n
    assert [d.index for d in node.devices] == list(range(8 * n))
    first = node.gpus[:n]
    assert {g.device.pci_bus_id for g in first} == {"0000:05:00.0"}
    assert [g.partition for g in first] == list(range(n))
    parent = amd.uuid(machine.gpus[0].unique_id) if n > 1 else ""
    assert {g.parent for g in first} == {parent}
    assert len({g.device.uuid for g in node.gpus}) == 8 * n  # each partition its own unique id
    for gpu in node.gpus:
        # a partition's share: its XCDs of eight, its share of the memory partition
        assert (gpu.compute_units, gpu.device.memory_mib) == (304 // n, 196608 // n)
        assert gpu.partition_type == f"{compute}_{memory}".lower()
    # the first partition keeps the GPU's own DRM nodes; the others are amdgpu_xcp_<n>'s
    assert [(g.card, g.device.minor) for g in first] == [(1 + i, 128 + i) for i in range(n)]
    # what amdgpu lists as the modes the GPU may be put in: the current ones among them
    assert node.modes["0000:05:00.0"] == (("SPX", "DPX", "QPX", "CPX"), ("NPS1", "NPS2", "NPS4"))


def test_a_repartitioned_gpu_shows_its_new_devices(tmp_path: Path) -> None:
    machine = amdsim.make_machine(2, "MI300X")
    assert len(written(tmp_path, machine).devices) == 2
    node = written(tmp_path, amdsim.repartition(machine, "QPX", "NPS4"))
    assert [g.partition_type for g in node.gpus] == ["qpx_nps4"] * 8
    assert [g.compute_units for g in node.gpus] == [76] * 8


def test_a_radeon_without_a_unique_id_is_named_by_its_kfd_gpu_id(tmp_path: Path) -> None:
    node = written(tmp_path, amdsim.make_machine(2, "RX7900XTX"))
    for gpu in node.gpus:
        assert gpu.unique_id == 0
        assert (gpu.device.product, gpu.device.memory_mib) == ("AMD Radeon RX 7900 XTX", 24576)
        assert (gpu.compute_units, amd.family(gpu.gfx_target_version)) == (96, "GC_11_0_0")
        assert gpu.partition_type == ""
        assert gpu.device.nvlinks == ()
    ids = [(tmp_path / kfd_node(g) / "gpu_id").read_text().strip() for g in node.gpus]
    assert [g.device.uuid for g in node.gpus] == [amd.uuid(int(i)) for i in ids]


def kfd_node(gpu: kfd.AmdGpu) -> str:
    return f"{amd.KFD_TOPOLOGY}/nodes/{gpu.node}"


def test_health_is_what_the_kernel_says(tmp_path: Path) -> None:
    machine = amdsim.make_machine(3, "MI210", hive_size=0)
    amdsim.write_node(tmp_path, amdsim.with_ras(machine, 1, 2))
    (tmp_path / "dev/dri/renderD130").unlink()
    problems = [g.problem for g in kfd.discover(Roots(str(tmp_path))).gpus]
    assert problems == ["", "uncorrectable RAS errors: umc 2", "/dev/dri/renderD130 is missing"]


def test_no_topology_is_no_amd_driver(tmp_path: Path) -> None:
    with pytest.raises(kfd.KfdError, match=r"no AMD GPU driver: .*topology/nodes is missing"):
        kfd.discover(Roots(str(tmp_path)))


def test_the_in_tree_driver_is_versioned_by_the_kernel(tmp_path: Path) -> None:
    node = written(tmp_path, amdsim.make_machine(1, "MI210"))
    (tmp_path / amd.MODULE_VERSION).unlink()
    assert kfd.discover(Roots(str(tmp_path))).version == "6.1.0-gpuwire-sim"
    assert node.version == amdsim.DRIVER_VERSION


def test_the_simulated_node_cli_writes_each_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwire import sim

    args = ["--vendor", "amd", "--amd-product", "MI300X", "--gpus", "2"]
    assert sim.main([str(tmp_path / "a"), *args, "--compute-partition", "CPX"]) == 0
    assert len(kfd.discover(Roots(str(tmp_path / "a"))).devices) == 16
    assert "GPU 1: AMD Instinct MI300X bus 0000:15:00.0 NUMA 1, CPX/NPS1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sim.main(
            [str(tmp_path / "b"), *args, "--compute-partition", "SPX", "--memory-partition", "NPS4"]
        )
    assert (
        "MI300X cannot run SPX with NPS4: amdgpu allows SPX with NPS1;" in capsys.readouterr().err
    )


# -- real captures -----------------------------------------------------------------------------


def replayed(tmp_path: Path, capture: dict[str, str]) -> kfd.AmdNode:
    """A capture written where KFD keeps it, with libdrm's names for its device ids."""
    for relative, text in capture.items():
        path = tmp_path / kfd_captures.TOPOLOGY / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / amd.AMDGPU_IDS[0]).parent.mkdir(parents=True)
    (tmp_path / amd.AMDGPU_IDS[0]).write_text(kfd_captures.IDS)
    return kfd.discover(Roots(str(tmp_path)))


def facts(gpu: kfd.AmdGpu) -> tuple[object, ...]:
    d = gpu.device
    return (gpu.node, d.pci_bus_id, d.product, d.memory_mib, gpu.compute_units, d.uuid)


def test_replays_a_real_workstation_with_three_radeons(tmp_path: Path) -> None:
    """The values are the capture's, worked out by hand: the bus from `location_id`
    (0x6300 → 63:00.0), MiB from the frame-buffer bank, CUs as SIMDs over SIMDs per CU."""
    node = replayed(tmp_path, kfd_captures.WORKSTATION)
    assert [facts(g) for g in node.gpus] == [
        (3, "0000:43:00.0", "AMD GPU 73ef", 8176, 32, "GPU-0000000000043000"),
        (1, "0000:63:00.0", "AMD Radeon VII", 16368, 60, "GPU-0dac90a172da5f19"),
        (2, "0000:66:00.0", "AMD Radeon Pro W7500", 8176, 28, "GPU-0000000000066000"),
    ]
    assert [amd.gfx_name(g.gfx_target_version) for g in node.gpus] == [
        "gfx1032",
        "gfx906",
        "gfx1102",
    ]
    assert [amd.family(g.gfx_target_version) for g in node.gpus] == ["NV", "AI", "GC_11_0_0"]
    # the three reach each other through the CPU only: PCIe to node 0, p2p of weight 40
    for gpu in node.gpus:
        assert gpu.device.nvlinks == ()
        assert gpu.hive_id == 0
        assert next((ln.node_to, ln.type, ln.weight) for ln in gpu.links) == (0, amd.LINK_PCIE, 20)
        assert {ln.weight for ln in gpu.links[1:]} == {40}
    # the capture zeroed the render minors: no device node to give a container
    assert {g.problem for g in node.gpus} == {"KFD names no DRM render node"}
    assert {g.card for g in node.gpus} == {-1}


def test_replays_a_real_mi300x_of_an_eight_gpu_hive(tmp_path: Path) -> None:
    (gpu,) = replayed(tmp_path, kfd_captures.MI300X).gpus
    assert facts(gpu) == (
        4,
        "0000:26:00.0",
        "AMD Instinct MI300X",
        196592,
        304,
        "GPU-4da18c0d44793f03",
    )
    assert (amd.gfx_name(gpu.gfx_target_version), gpu.hive_id) == ("gfx942", 7773567030725891371)
    # seven XGMI peers of weight 15 (one hop each: fully connected), none of them captured
    xgmi = [ln for ln in gpu.links if ln.type == amd.LINK_XGMI]
    assert sorted(ln.node_to for ln in xgmi) == [2, 4, 5, 6, 7, 8, 9]
    assert {ln.weight for ln in xgmi} == {15}
    assert gpu.device.nvlinks == ()


MI350X = (5, "0000:83:00.0", "AMD Instinct MI350X", 294896, 256, "GPU-47d7adbab7939d69")
RX9070 = (6, "0000:83:00.0", "AMD GPU 7550", 16304, 64, "GPU-284aa5078a11a6b4")


@pytest.mark.parametrize(
    ("name", "expected", "gfx"), [("mi350x", MI350X, "gfx950"), ("rx9070", RX9070, "gfx1201")]
)
def test_replays_real_single_gpu_captures(
    tmp_path: Path, name: str, expected: tuple[object, ...], gfx: str
) -> None:
    (gpu,) = replayed(tmp_path, kfd_captures.CAPTURES[name]).gpus
    assert facts(gpu) == expected
    assert amd.gfx_name(gpu.gfx_target_version) == gfx
