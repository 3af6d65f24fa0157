"""GetPreferredAllocation on an AMD node, by AMD's best-effort policy. Pure.

AMD's device plugin documents it (ROCm/k8s-device-plugin `docs/user-guide/resource-allocation.md`,
its allocator's `besteffort_policy.go`): every pair of devices has a score, lower is better,
made of three parts: the same GPU (partitions of one GPU) 10, else 20; joined by XGMI 10, by
PCIe 40, else 50; on one NUMA node 10, else 20. A set's score is the sum over its pairs, and
the set with the lowest score wins. For partitions, first: all of them from one GPU where one
has enough free, the GPU with the fewest free partitions that can hold the request (it is in
use already: the untouched GPUs stay whole, no fragmentation). Ties go to the lowest device
indices, so the answer is deterministic. Devices are named by their unique ids
(`Device.uuid`), which are the device plugin's IDs on AMD nodes.

Links come from KFD's topology (`kfd.AmdGpu.links`): an XGMI io_link between the two KFD nodes
(or partitions of one GPU, which its fabric joins), else a PCIe path (KFD lists one, an
io_link or a p2p_link through the CPUs, for every pair it can reach).
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.plugin.preferred import PreferenceError, search
from gpuwire import amd
from gpuwire.kfd import AmdGpu

SAME_GPU, OTHER_GPU = 10, 20
XGMI, PCIE, OTHER_LINK = 10, 40, 50
SAME_NUMA, OTHER_NUMA = 10, 20


def _gpu_of(gpu: AmdGpu) -> str:
    """The GPU a device is of: its parent, or itself."""
    return gpu.parent or gpu.device.uuid


def pair_score(a: AmdGpu, b: AmdGpu) -> int:
    same = _gpu_of(a) == _gpu_of(b)
    types = {ln.type for ln in a.links if ln.node_to == b.node}
    types |= {ln.type for ln in b.links if ln.node_to == a.node}
    link = OTHER_LINK
    if same or amd.LINK_XGMI in types:
        link = XGMI
    elif amd.LINK_PCIE in types:
        link = PCIE
    numa = a.device.numa_node == b.device.numa_node and a.device.numa_node >= 0
    return (SAME_GPU if same else OTHER_GPU) + link + (SAME_NUMA if numa else OTHER_NUMA)


def preferred(
    gpus: Sequence[AmdGpu], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The device IDs to allocate for one container's request, by device index."""
    by_id = {g.device.uuid: g for g in gpus}
    available = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    unknown = [d for d in (*available, *must) if d not in by_id]
    if unknown:
        raise PreferenceError(f"unknown device {unknown[0]!r}: not a device of this node")
    if any(d not in available for d in must):
        missing = next(d for d in must if d not in available)
        raise PreferenceError(f"must-include device {missing!r} is not among the available")
    if size < max(1, len(must)) or size > len(available):
        raise PreferenceError(
            f"allocation size {size} is out of range: {len(must)} must-include and "
            f"{len(available)} available devices"
        )
    candidates = sorted((by_id[d] for d in available), key=lambda g: g.device.index)
    chosen = _one_gpu(candidates, must, size, by_id) or _best_set(candidates, must, size)
    return [g.device.uuid for g in sorted(chosen, key=lambda g: g.device.index)]


def _one_gpu(
    candidates: list[AmdGpu], must: list[str], size: int, by_id: dict[str, AmdGpu]
) -> list[AmdGpu] | None:
    """All `size` from one partitioned GPU, the one with the fewest free that can hold them
    (and every must-include device); None where no one GPU can."""
    free: dict[str, list[AmdGpu]] = {}
    for g in candidates:
        if g.parent:
            free.setdefault(g.parent, []).append(g)
    parents = {_gpu_of(by_id[d]) for d in must}
    fits = [
        (len(members), members[0].device.index, parent)
        for parent, members in free.items()
        if len(members) >= size and parents <= {parent}
    ]
    if not fits:
        return None
    _, _, parent = min(fits)
    held = [by_id[d] for d in must]
    rest = [g for g in free[parent] if g.device.uuid not in must]
    return held + rest[: size - len(held)]


def _best_set(candidates: list[AmdGpu], must: list[str], size: int) -> list[AmdGpu]:
    """The set of the lowest score (ties: the lowest indices) that holds every must-include."""
    n = range(len(candidates))
    scores = [[pair_score(candidates[i], candidates[j]) for j in n] for i in n]

    def key(chosen: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        total = sum(scores[i][j] for x, i in enumerate(chosen) for j in chosen[x + 1 :])
        return -total, tuple(-candidates[i].device.index for i in sorted(chosen))

    held = [i for i, g in enumerate(candidates) if g.device.uuid in must]
    pool = [i for i in n if i not in held]
    return [candidates[i] for i in search(key, held, pool, size - len(held))]
