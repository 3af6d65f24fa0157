"""The MIG profiles of the GPU models the simulated node offers, and where instances go.

Facts (NVIDIA MIG user guide, "Supported MIG Profiles"; NVIDIA/mig-parted
`deployments/systemd/config-default.yaml` for the counts; `nvidia-smi mig -lgip` listings
for IDs, SMs and engines): memory is cut in eight slices and SMs in seven; a profile takes
`memory_slices` of the eight at one of its `starts` and `slices` of the seven; at most
`max` instances of it fit a GPU. GPU instance ids follow the memory placement as a binary
tree over the eight slices (the whole GPU 0; halves 1, 2; quarters 3–6; eighths 7–14: the 15
GPU instances per GPU of the driver's capability table), which is what `nvidia-smi mig -lgi`
shows on A100 (seven 1g.5gb are GI 7–13, two 3g.20gb GI 1 and 2). MiB are NVML's
`memorySizeMB` (A100: go-nvml's mock GPUs; H100: an `-lgip` capture); H200's MiB, SMs and
engines, and Hopper engines, are **not confirmed** (chosen so that NVIDIA's profile naming,
`gpuwire.mig.profile_name`, gives the documented names).

Only what the simulated node and the NVML stand-in need: a real node's profiles come from
NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7

# NVML's GPU_INSTANCE_PROFILE_* enum values (nvml.h)
PROFILE_1_SLICE, PROFILE_2_SLICE, PROFILE_3_SLICE, PROFILE_4_SLICE, PROFILE_7_SLICE = 0, 1, 2, 3, 4
PROFILE_1_SLICE_REV1, PROFILE_1_SLICE_REV2 = 7, 9
# COMPUTE_INSTANCE_PROFILE_*: the compute instance spanning a whole GPU instance of G slices
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


@dataclass(frozen=True)
class Profile:
    name: str  # 1g.10gb
    enum: int  # NVML GPU_INSTANCE_PROFILE_*
    id: int  # the profile ID nvidia-smi shows (`info.id`)
    slices: int  # compute slices of seven
    memory_slices: int  # of eight
    memory_mib: int
    multiprocessors: int
    max: int  # instances per GPU
    copy: int  # engines: copy, decoder, encoder, JPEG, OFA
    decoder: int
    encoder: int
    jpeg: int
    ofa: int

    @property
    def starts(self) -> tuple[int, ...]:
        """The memory slices an instance may start at: one per instance that fits, aligned
        to its size (the one `+me` instance may take any 1g place)."""
        places = COMPUTE_SLICES if self.enum == PROFILE_1_SLICE_REV1 else self.max
        return tuple(range(0, places * self.memory_slices, self.memory_slices))

    def gpu_instance(self, start: int) -> int:
        """The GPU instance id of an instance placed at memory slice `start`."""
        return MEMORY_SLICES // self.memory_slices - 1 + start // self.memory_slices


def _table(rows: str, mib: tuple[int, int, int, int]) -> tuple[Profile, ...]:
    """`name enum id slices memory_slices sms max ce dec enc jpeg ofa` rows; MiB by the
    number of memory slices (1, 2, 4, 8)."""
    by_slices = dict(zip((1, 2, 4, 8), mib, strict=True))
    out = []
    for row in rows.strip().splitlines():
        name, *numbers = row.split()
        enum, pid, slices, mem, *rest = map(int, numbers)
        out.append(Profile(name, enum, pid, slices, mem, by_slices[mem], *rest))
    return tuple(out)


_AMPERE = """
1g.{1}gb     0 19 1 1 14 7  1 0 0 0 0
1g.{1}gb+me  7 20 1 1 14 1  1 1 0 1 1
1g.{2}gb     9 15 1 2 14 4  1 1 0 0 0
2g.{2}gb     1 14 2 2 28 3  2 1 0 0 0
3g.{4}gb     2  9 3 4 42 2  3 2 0 0 0
4g.{4}gb     3  5 4 4 56 1  4 2 0 0 0
7g.{8}gb     4  0 7 8 98 1  7 5 0 1 1
"""
_HOPPER = """
1g.{1}gb     0 19 1 1 16 7  1 1 0 1 0
1g.{1}gb+me  7 20 1 1 16 1  1 1 0 1 1
1g.{2}gb     9 15 1 2 26 4  1 1 0 1 0
2g.{2}gb     1 14 2 2 32 3  2 2 0 2 0
3g.{4}gb     2  9 3 4 60 2  3 3 0 3 0
4g.{4}gb     3  5 4 4 64 1  4 4 0 4 0
7g.{8}gb     4  0 7 8 132 1 8 7 0 7 1
"""


def _named(rows: str, gb: tuple[int, int, int, int]) -> str:
    for slices, size in zip(("{1}", "{2}", "{4}", "{8}"), gb, strict=True):
        rows = rows.replace(slices, str(size))
    return rows


_A100_40 = _table(_named(_AMPERE, (5, 10, 20, 40)), (4864, 9856, 19968, 40192))
PROFILES: dict[str, tuple[Profile, ...]] = {
    "NVIDIA A100-SXM4-40GB": _A100_40,
    "NVIDIA A100-PCIE-40GB": _A100_40,
    "NVIDIA A100-SXM4-80GB": _table(_named(_AMPERE, (10, 20, 40, 80)), (9856, 19968, 40192, 80384)),
    "NVIDIA H100 80GB HBM3": _table(_named(_HOPPER, (10, 20, 40, 80)), (9984, 20096, 40448, 81152)),
    "NVIDIA H200": _table(_named(_HOPPER, (18, 35, 71, 141)), (17664, 35584, 71424, 143104)),
}

# mig-parted's `all-balanced` per model: what `gpuwire sim node --mig 0=balanced` lays out.
BALANCED = {
    "NVIDIA A100-SXM4-40GB": ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"),
    "NVIDIA A100-PCIE-40GB": ("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"),
    "NVIDIA A100-SXM4-80GB": ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
    "NVIDIA H100 80GB HBM3": ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
    "NVIDIA H200": ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"),
}


class PlacementError(ValueError):
    """A GPU instance that does not fit; the message says what is there."""


def profiles(product: str) -> tuple[Profile, ...]:
    """The profiles of a model; none for a GPU without MIG."""
    return PROFILES.get(product, ())


def profile(product: str, name: str) -> Profile:
    for p in profiles(product):
        if p.name == name:
            return p
    offered = ", ".join(p.name for p in profiles(product)) or "none (no MIG)"
    raise PlacementError(f"{product} has no MIG profile {name!r}; its profiles: {offered}")


def place(product: str, name: str, taken: list[tuple[str, int]]) -> int:
    """Where a new instance of profile `name` starts, beside the instances `taken`
    ((profile name, start) each): the lowest free placement, as the driver picks one."""
    wanted = profile(product, name)
    used = [(profile(product, n), start) for n, start in taken]
    if sum(1 for p, _ in used if p.name == name) >= wanted.max:
        raise PlacementError(f"{name}: a {product} holds at most {wanted.max} of it")
    busy = {s for p, start in used for s in range(start, start + p.memory_slices)}
    compute = sum(p.slices for p, _ in used)
    if compute + wanted.slices > COMPUTE_SLICES:
        raise PlacementError(
            f"{name}: needs {wanted.slices} compute slices, {COMPUTE_SLICES - compute} are free"
        )
    for start in wanted.starts:
        if busy.isdisjoint(range(start, start + wanted.memory_slices)):
            return start
    free = sorted(set(range(MEMORY_SLICES)) - busy)
    raise PlacementError(f"{name}: no free placement; free memory slices: {free or 'none'}")
