"""GetPreferredAllocation on 8-GPU topologies, with answers worked out by hand from the rules
in deviceplugin/plugin/preferred.py: NVLinks within the set, then free replicas, then links lost to
the GPUs left available, then NUMA, then PCIe bus distance, then lowest indices.

Every node: DGX A100 bus numbers 07 0f 47 4e 87 90 b7 bd, GPUs 0-3 on NUMA node 0, 4-7 on 1.
"""

from __future__ import annotations

import itertools
import random

import pytest

from deviceplugin.plugin.preferred import PreferenceError, preferred
from deviceplugin.plugin.resources import Resource
from gpuwire.devices import Device

BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def node(links: dict[tuple[int, int], int], n: int = 8) -> tuple[Device, ...]:
    def peers(i: int) -> tuple[tuple[int, int], ...]:
        return tuple(sorted((b if a == i else a, c) for (a, b), c in links.items() if i in (a, b)))

    return tuple(
        Device(
            index=i,
            minor=i,
            uuid=f"GPU-{i}",
            pci_bus_id=f"{i // 8:04x}:{BUSES[i % 8]:02x}:00.0",
            product="NVIDIA A100-SXM4-80GB",
            numa_node=0 if i % 8 < 4 else 1,
            nvlinks=peers(i),
        )
        for i in range(n)
    )


NVSWITCH = node({(a, b): 12 for a, b in itertools.combinations(range(8), 2)})
# DGX-1 (V100) hybrid cube mesh: two fully linked quads, NV1/NV2 links, joined i ↔ i+4
CUBE_MESH = node(
    {
        (0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2,
        (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
        (0, 4): 2, (1, 5): 2, (2, 6): 1, (3, 7): 1,
    }
)  # fmt: skip
ISLANDS = node(
    {(a, b): 4 for quad in ((0, 1, 2, 3), (4, 5, 6, 7)) for a, b in itertools.combinations(quad, 2)}
)
PCIE = node({})


def ask(
    devices: tuple[Device, ...],
    available: list[int],
    size: int,
    must: tuple[int, ...] = (),
    exact_limit: int | None = None,
) -> list[int]:
    resource = Resource("nvidia.com/gpu", devices)
    kw = {} if exact_limit is None else {"exact_limit": exact_limit}
    ids = preferred(
        resource, [f"GPU-{i}" for i in available], [f"GPU-{i}" for i in must], size, **kw
    )
    return [int(i.removeprefix("GPU-")) for i in ids]


ALL = list(range(8))
CASES = [
    # NVSwitch: links tie everywhere → NUMA, then bus distance (87..bd spans 54 < 07..4e's 71)
    ("nvswitch 4/8", NVSWITCH, ALL, 4, (), [4, 5, 6, 7]),
    ("nvswitch 2/{0,4,5,6}: NUMA pair nearest", NVSWITCH, [0, 4, 5, 6], 2, (), [4, 5]),
    ("nvswitch must 0: NUMA neighbour", NVSWITCH, ALL, 2, (0,), [0, 1]),
    ("nvswitch 8/8", NVSWITCH, ALL, 8, (), ALL),
    # cube mesh: NV2 pairs first; of those, same NUMA; then bus (b7-bd: 6)
    ("cube 2/8", CUBE_MESH, ALL, 2, (), [6, 7]),
    ("cube 4/8: a quad (9 links)", CUBE_MESH, ALL, 4, (), [4, 5, 6, 7]),
    ("cube must 0, 2: NV2 on NUMA", CUBE_MESH, ALL, 2, (0,), [0, 3]),
    ("cube must 0, 3: 0-2-3 has 5", CUBE_MESH, ALL, 3, (0,), [0, 2, 3]),
    ("cube 2/{1,2,5,6}: fewest lost", CUBE_MESH, [1, 2, 5, 6], 2, (), [5, 6]),
    # islands: fragmentation decides where links tie
    ("islands 2/{1,2,4,5,6}: keep 4-5-6", ISLANDS, [1, 2, 4, 5, 6], 2, (), [1, 2]),
    ("islands 3/{0,1,4..7}: one island", ISLANDS, [0, 1, 4, 5, 6, 7], 3, (), [5, 6, 7]),
    ("islands 4/8: a whole island", ISLANDS, ALL, 4, (), [4, 5, 6, 7]),
    ("islands 1/{0,4,5}: peers gone", ISLANDS, [0, 4, 5], 1, (), [0]),
    ("islands must 4, 2/{0,1,4}: bus", ISLANDS, [0, 1, 4], 2, (4,), [1, 4]),
    # PCIe only: NUMA node, then bus distance
    ("pcie 2/{1,3,4,5}", PCIE, [1, 3, 4, 5], 2, (), [4, 5]),
    ("pcie 2/8: b7-bd beats 47-4e", PCIE, ALL, 2, (), [6, 7]),
    ("pcie 4/{0,1,2,4,5,6}: 3+1, least spread", PCIE, [0, 1, 2, 4, 5, 6], 4, (), [2, 4, 5, 6]),
    ("pcie 1/8: lowest index", PCIE, ALL, 1, (), [0]),
]


@pytest.mark.parametrize("search", ["exhaustive", "heuristic"])
@pytest.mark.parametrize(
    ("devices", "available", "size", "must", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_answers(
    devices: tuple[Device, ...],
    available: list[int],
    size: int,
    must: tuple[int, ...],
    expected: list[int],
    search: str,
) -> None:
    """Both searches give the same answer on 8 GPUs (the heuristic is forced with limit 0)."""
    limit = None if search == "exhaustive" else 0
    assert ask(devices, available, size, must, exact_limit=limit) == expected


def test_heuristic_on_16_gpus_matches_exhaustive_search() -> None:
    """Two 8-GPU NVLink islands (pairs doubly linked) on a 16-GPU node: the heuristic (the
    default beyond EXACT_LIMIT) lands on an answer as good as the exhaustive search's."""
    links = {}
    for base in (0, 8):
        for a, b in itertools.combinations(range(base, base + 8), 2):
            links[(a, b)] = 2 if b == a + 1 and a % 2 == 0 else 1
    devices = node(links, 16)
    rng = random.Random(7)
    for _ in range(12):
        available = sorted(rng.sample(range(16), rng.randint(6, 16)))
        size = rng.randint(2, min(8, len(available)))
        fast = ask(devices, available, size, exact_limit=0)
        exact = ask(devices, available, size, exact_limit=10**9)
        assert _links(devices, fast) == _links(devices, exact), (available, size)


def _links(devices: tuple[Device, ...], chosen: list[int]) -> int:
    return sum(devices[a].links_to(b) for a, b in itertools.combinations(chosen, 2))


def test_8_of_16_on_nvswitch_takes_one_numa_node() -> None:
    """8 of 16 (12870 candidate sets, so the heuristic): links tie, so the 8 GPUs of one NUMA
    node (4-7 and 12-15: the closer buses within each PCI domain)."""
    devices = node({(a, b): 12 for a, b in itertools.combinations(range(16), 2)}, 16)
    assert ask(devices, list(range(16)), 8) == [4, 5, 6, 7, 12, 13, 14, 15]


SHARED = Resource("nvidia.com/gpu", ISLANDS[:4], replicas=4)


def ids(*pairs: tuple[int, int]) -> list[str]:
    return [f"GPU-{g}::{r}" for g, r in pairs]


def test_replicas_go_to_distinct_gpus() -> None:
    """Two replicas on two GPUs (all pairs alike here but for the bus: 47-4e is closest)."""
    available = SHARED.ids()
    assert preferred(SHARED, available, [], 2) == ids((2, 0), (3, 0))


def test_replicas_prefer_the_least_loaded_gpu() -> None:
    # GPU 0 has one replica free, GPU 3 all four: a single replica goes to GPU 3
    available = ids((0, 3), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3), (3, 0), (3, 1), (3, 2), (3, 3))
    assert preferred(SHARED, available, [], 1) == ids((3, 0))


def test_more_replicas_than_gpus_stack_on_the_emptiest() -> None:
    available = ids((0, 0), (0, 1), (1, 0), (1, 1), (1, 2))
    assert preferred(SHARED, available, [], 3) == ids((0, 0), (1, 0), (1, 1))


def test_must_include_replica_is_kept() -> None:
    available = SHARED.ids()
    answer = preferred(SHARED, available, ids((2, 3)), 2)
    assert answer == ids((2, 3), (3, 0))


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (["GPU-0", "GPU-x"], [], 1, "unknown device 'GPU-x': not a device of nvidia.com/gpu"),
        (["GPU-0"], ["GPU-1"], 1, "must-include device 'GPU-1' is not among the available"),
        (["GPU-0", "GPU-1"], [], 3, "allocation size 3 is out of range"),
        (["GPU-0", "GPU-1"], ["GPU-0", "GPU-1"], 1, "allocation size 1 is out of range"),
        (["GPU-0"], [], 0, "allocation size 0 is out of range"),
    ],
)
def test_bad_requests_say_what_is_wrong(
    available: list[str], must: list[str], size: int, message: str
) -> None:
    with pytest.raises(PreferenceError, match=message):
        preferred(Resource("nvidia.com/gpu", PCIE), available, must, size)
