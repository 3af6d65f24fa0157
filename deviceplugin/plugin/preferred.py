"""GetPreferredAllocation: which of the available devices a container should get. Pure.

Replica IDs collapse onto their physical GPU; a container gets as many distinct GPUs as it
asks for devices (while there are GPUs), then extra replicas on the least loaded of them.
Among sets of GPUs that include every must-include device, the best set has, in order:
1. the most NVLinks between its GPUs;
2. the most free replicas (shared GPUs: the least loaded; equal for whole GPUs);
3. the fewest NVLinks to GPUs that stay available, so the next request still finds a
   connected set (a 1-GPU request takes the GPU whose partner is already gone);
4. the most pairs on one NUMA node;
5. its pairs closest on the PCIe bus (bus number distance; another PCI domain is farthest);
6. the lowest GPU indices, so the answer is deterministic.
Small searches are exhaustive; larger ones (an 8-of-16 choice has 12870 candidate sets) grow
the best set greedily from every seed GPU, then swap GPUs in and out while that improves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb
from typing import Any

from deviceplugin.plugin.resources import Resource
from gpuwire.devices import Device

EXACT_LIMIT = 5000  # candidate sets scored exhaustively; beyond, the heuristic
_NUMA = 10**6  # a shared NUMA node outweighs any sum of PCIe closeness (< 2016 pairs × 256)

Key = tuple[int, int, int, int, tuple[int, ...]]


class PreferenceError(ValueError):
    """A preferred-allocation request that cannot be answered."""


def _bus(device: Device) -> tuple[int, int]:
    domain, bus, _ = device.pci_bus_id.split(":", 2)
    return int(domain, 16), int(bus, 16)


def _links(a: Device, b: Device) -> int:
    return max(a.links_to(b.index), b.links_to(a.index))


def _nearness(a: Device, b: Device) -> int:
    """Same NUMA node first, then PCIe closeness, as one number."""
    same_numa = a.numa_node == b.numa_node and a.numa_node >= 0
    (dom_a, bus_a), (dom_b, bus_b) = _bus(a), _bus(b)
    distance = abs(bus_a - bus_b) if dom_a == dom_b else 256
    return same_numa * _NUMA + (256 - distance)


@dataclass
class _Scorer:
    """Scores sets of candidate GPUs (positions in `gpus`)."""

    gpus: Sequence[Device]
    free: Sequence[int]  # free replicas per candidate

    def __post_init__(self) -> None:
        n = range(len(self.gpus))
        self.links = [[_links(self.gpus[i], self.gpus[j]) if i != j else 0 for j in n] for i in n]
        self.near = [[_nearness(self.gpus[i], self.gpus[j]) for j in n] for i in n]
        self.degree = [sum(row) for row in self.links]

    def key(self, chosen: Sequence[int]) -> Key:
        """Bigger is better; the order of the module docstring."""
        links = near = 0
        for x, i in enumerate(chosen):
            for j in chosen[x + 1 :]:
                links += self.links[i][j]
                near += self.near[i][j]
        load = sum(self.free[i] for i in chosen)
        lost = sum(self.degree[i] for i in chosen) - 2 * links  # links to GPUs left out
        order = tuple(-index for index in sorted(self.gpus[i].index for i in chosen))
        return links, load, -lost, near, order


def search(
    key: Callable[[Sequence[int]], Any],
    must: list[int],
    pool: list[int],
    need: int,
    exact_limit: int = EXACT_LIMIT,
) -> list[int]:
    """`must` and the `need` items of `pool` that make the best set by `key` (bigger is
    better): every set where there are at most `exact_limit`, else grown greedily from every
    seed, then items swapped in and out while that improves it. Shared by every vendor's
    preferred allocation (`amdpreferred`)."""
    if comb(len(pool), need) <= exact_limit:
        best = max(combinations(pool, need), key=lambda extra: key(must + list(extra)))
        return must + list(best)
    seeds = [[*must, p] for p in pool] if need else [must]
    found: list[int] | None = None
    for seed in seeds:
        chosen = _swap(key, _grow(key, seed, pool, len(must) + need), len(must), pool)
        if found is None or key(chosen) > key(found):
            found = chosen
    assert found is not None
    return found


def _grow(
    key: Callable[[Sequence[int]], Any], chosen: list[int], pool: list[int], size: int
) -> list[int]:
    chosen = list(chosen)
    while len(chosen) < size:
        rest = [p for p in pool if p not in chosen]
        chosen.append(max(rest, key=lambda p: key([*chosen, p])))
    return chosen


def _swap(
    key: Callable[[Sequence[int]], Any], chosen: list[int], fixed: int, pool: list[int]
) -> list[int]:
    improved = True
    while improved:
        improved = False
        current = key(chosen)
        for out in range(fixed, len(chosen)):
            for p in pool:
                if p in chosen:
                    continue
                trial = [*chosen[:out], p, *chosen[out + 1 :]]
                if key(trial) > current:
                    chosen, current, improved = trial, key(trial), True
    return chosen


def preferred(
    resource: Resource,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    exact_limit: int = EXACT_LIMIT,
) -> list[str]:
    """The device IDs to allocate for one container's request, sorted by GPU index."""
    available = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    gpu_of = _check(resource, available, must, size)
    free_ids: dict[str, list[str]] = {}  # per GPU, the IDs not already must-include
    for device_id in available:
        if device_id not in must:
            free_ids.setdefault(gpu_of[device_id].uuid, []).append(device_id)
    gpus = sorted({g.uuid: g for g in gpu_of.values()}.values(), key=lambda g: g.index)
    position = {g.uuid: i for i, g in enumerate(gpus)}
    scorer = _Scorer(gpus, [len(free_ids.get(g.uuid, ())) for g in gpus])
    must_gpus = sorted({position[gpu_of[d].uuid] for d in must})
    pool = sorted(position[u] for u in free_ids if position[u] not in must_gpus)
    # as many distinct GPUs as devices asked for, while there are GPUs
    need = min(len(must_gpus) + size - len(must), len(gpus)) - len(must_gpus)
    chosen = search(scorer.key, must_gpus, pool, need, exact_limit)
    remaining = {gpus[i].uuid: list(free_ids.get(gpus[i].uuid, ())) for i in chosen}
    answer = list(must)
    for i in chosen:  # one ID on each GPU the must-include IDs do not cover
        if i not in must_gpus:
            answer.append(remaining[gpus[i].uuid].pop(0))
    while len(answer) < size:  # then replicas where most are left (ties: lowest index)
        uuid = max(remaining, key=lambda u: (len(remaining[u]), -position[u]))
        answer.append(remaining[uuid].pop(0))
    return sorted(answer, key=lambda d: (position[gpu_of[d].uuid], d))


def _check(
    resource: Resource, available: list[str], must: list[str], size: int
) -> dict[str, Device]:
    """The GPU of every ID; PreferenceError names the first thing wrong with the request."""
    gpu_of = {}
    for device_id in available + must:
        gpu = resource.gpu_of(device_id)
        if gpu is None:
            raise PreferenceError(f"unknown device {device_id!r}: not a device of {resource.name}")
        gpu_of[device_id] = gpu
    missing = [d for d in must if d not in available]
    if missing:
        raise PreferenceError(f"must-include device {missing[0]!r} is not among the available")
    if size < max(1, len(must)) or size > len(available):
        raise PreferenceError(
            f"allocation size {size} is out of range: {len(must)} must-include and "
            f"{len(available)} available devices"
        )
    return gpu_of
