"""Preferred allocation on AMD nodes by AMD's best-effort rules, on the simulated topologies:
MI210 in XGMI hives and on PCIe, MI300X in CPX (eight partitions per GPU, one hive)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.plugin.amdpreferred import pair_score, preferred
from deviceplugin.plugin.preferred import PreferenceError
from gpuwire import amdsim, kfd
from gpuwire.roots import Roots


def node(root: Path, machine: amdsim.AmdMachine) -> kfd.AmdNode:
    amdsim.write_node(root, machine)
    return kfd.discover(Roots(str(root)))


@pytest.fixture(scope="module")
def hives(tmp_path_factory: pytest.TempPathFactory) -> kfd.AmdNode:
    """Eight MI210: GPUs 0-3 in one XGMI hive on NUMA node 0, 4-7 in another on node 1."""
    return node(tmp_path_factory.mktemp("hives"), amdsim.make_machine(8, "MI210", hive_size=4))


@pytest.fixture(scope="module")
def pcie(tmp_path_factory: pytest.TempPathFactory) -> kfd.AmdNode:
    """Four MI210 on PCIe only: 0-1 on NUMA node 0, 2-3 on node 1."""
    return node(tmp_path_factory.mktemp("pcie"), amdsim.make_machine(4, "MI210", hive_size=0))


@pytest.fixture(scope="module")
def cpx(tmp_path_factory: pytest.TempPathFactory) -> kfd.AmdNode:
    """Eight MI300X in CPX/NPS4: 64 partitions, eight per GPU, one XGMI hive."""
    machine = amdsim.make_machine(8, "MI300X", compute="CPX", memory="NPS4")
    return node(tmp_path_factory.mktemp("cpx"), machine)


def ask(
    found: kfd.AmdNode, available: list[int], size: int, must: tuple[int, ...] = ()
) -> list[int]:
    ids = [found.gpus[i].device.uuid for i in available]
    answer = preferred(found.gpus, ids, [found.gpus[i].device.uuid for i in must], size)
    index = {g.device.uuid: g.device.index for g in found.gpus}
    return [index[u] for u in answer]


def test_the_pair_scores_are_amds(hives: kfd.AmdNode, pcie: kfd.AmdNode, cpx: kfd.AmdNode) -> None:
    g = hives.gpus
    assert pair_score(g[0], g[1]) == 20 + 10 + 10  # other GPU, XGMI, same NUMA node
    assert pair_score(g[0], g[4]) == 20 + 40 + 20  # other GPU, PCIe through the CPUs, other node
    assert pair_score(pcie.gpus[0], pcie.gpus[1]) == 20 + 40 + 10
    assert pair_score(cpx.gpus[0], cpx.gpus[1]) == 10 + 10 + 10  # partitions of one GPU


def test_xgmi_before_pcie_and_one_numa_node(hives: kfd.AmdNode, pcie: kfd.AmdNode) -> None:
    assert ask(hives, list(range(8)), 2) == [0, 1]
    assert ask(hives, list(range(8)), 4) == [0, 1, 2, 3]  # one whole hive
    assert ask(hives, [0, 4, 5], 2) == [4, 5]  # a hive pair beats two lone GPUs
    assert ask(hives, [0, 2, 5, 6], 2) == [0, 2]  # ties: the lowest indices
    assert ask(hives, [0, 1, 4, 5], 3) == [0, 1, 4]
    assert ask(pcie, [0, 2, 3], 2) == [2, 3]  # PCIe only: the pair on one NUMA node


def test_must_include_devices_are_kept(hives: kfd.AmdNode) -> None:
    assert ask(hives, list(range(8)), 2, must=(5,)) == [4, 5]


def test_partitions_of_one_gpu_first(cpx: kfd.AmdNode) -> None:
    assert ask(cpx, list(range(64)), 4) == [0, 1, 2, 3]
    assert ask(cpx, list(range(64)), 8) == list(range(8))


def test_the_gpu_with_the_fewest_free_partitions_that_can_hold_them(cpx: kfd.AmdNode) -> None:
    """GPU 0 has two partitions free, GPU 1 five, the others all eight."""
    free = [6, 7, *range(11, 16), *range(16, 64)]
    assert ask(cpx, free, 2) == [6, 7]
    assert ask(cpx, free, 4) == [11, 12, 13, 14]  # GPU 1: the others stay whole
    assert ask(cpx, free, 6) == list(range(16, 22))  # GPU 2: the first with six free


def test_more_than_a_gpu_holds_fills_one_then_its_nearest(cpx: kfd.AmdNode) -> None:
    """Ten partitions: eight of GPU 0 and two of GPU 1, both on NUMA node 0 (XGMI joins them
    all); the search is a heuristic there, 64 choose 10 being too many sets."""
    assert ask(cpx, list(range(64)), 10) == [*range(8), 8, 9]


def test_a_bad_request_names_what_is_wrong(hives: kfd.AmdNode) -> None:
    with pytest.raises(PreferenceError, match="unknown device 'GPU-x': not a device of this node"):
        preferred(hives.gpus, ["GPU-x"], [], 1)
    with pytest.raises(PreferenceError, match="allocation size 3 is out of range"):
        ask(hives, [0, 1], 3)
