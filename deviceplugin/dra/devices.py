"""The node's GPUs and MIG devices as DRA devices: one ResourceSlice `devices[]` entry each.
Pure.

Attribute names are NVIDIA's DRA driver's (`productName`, `uuid`, `architecture`, `brand`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `type`; kubernetes-sigs/
dra-driver-nvidia-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go`), unprefixed and so in this
driver's own domain: a CEL selector written against `device.attributes["gpu.nvidia.com"]`
selects the same devices here with only the domain changed. The standard ones are
`resource.kubernetes.io/pciBusID`, `pcieRoot` and `numaNode` (k8s.io/dynamic-resource-
allocation `deviceattribute`). gpuwire adds `model` (the model token the node labels use:
`a100`, `h100`, `rtx-4090`), `nvlinkIsland` (the lowest index among the GPUs this one reaches
over NVLink, itself included: equal exactly for GPUs a multi-GPU job can use together) and
`shared`; a shared GPU also says which enforced limit profiles hold a claim to its share
there (`hamiLimits`, `mpsLimits`: what the node labels `gpuwire.io/limits.*` say for the
device plugin's path). Capacity `memory` is the GPU's memory.

A GPU marked shared in the node's config allows multiple allocations (consumable capacity,
KEP-5075): its `memory` and `cores` (percent of its streaming multiprocessors) are handed out
per claim under a request policy, so the scheduler packs claims onto it by memory itself.

A GPU in MIG mode is published as its MIG devices, as NVIDIA's driver publishes them (its
`mig.go`): named `gpu-<parent minor>-mig-<profile without dots>-<GPU instance profile
ID>-<placement start>` (what the instance is, not which one: the same name after it is
destroyed and made again in the same place), `type` `mig`, their own `uuid`, `parentUUID`,
`profile`, the parent's product, architecture, versions and PCI attributes, and capacities
`multiprocessors`, `copyEngines`, `decoders`, `encoders`, `jpegEngines`, `ofaEngines`,
`memory` and one `memorySlice<i>` of 1 per memory slice the instance occupies. gpuwire adds
the parent's `model`; not `nvlinkIsland` (a MIG device does no GPU-to-GPU peer-to-peer, over
NVLink or PCIe: NVIDIA MIG user guide, "Deployment Considerations") nor `shared` (a MIG
device is allocated whole). A compute instance smaller than its GPU instance (`1c.3g.40gb`)
is not published: NVIDIA's naming cannot tell two of them apart, and neither NVIDIA's DRA
driver nor the mixed strategy offers them.

Device kinds are data: `KINDS` lists the functions that turn an NVIDIA node into devices; the
slice builder takes whatever they return. An AMD node's kind is `amddevices` (AMD's DRA
driver's names); which a node has is `vendors`'.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.agent.labels import model_token
from deviceplugin.gpus.discovery import Gpu, Mig, NodeGpus
from gpuwire import limits, nvidia
from gpuwire.devices import Device, MigDevice
from gpuwire.dra import CORES as CORES_CAPACITY
from gpuwire.dra import (
    GPU_TYPE,
    ISLAND,
    MEMORY,
    MEMORY_STEP_MIB,
    MIG_TYPE,
    MODEL,
    PRODUCT,
    PROFILE,
    SHARED,
    TYPE,
    UUID,
)
from gpuwire.quantity import canonical_mib

STANDARD = "resource.kubernetes.io/"

# Consumable capacity of a shared GPU: memory in whole GiB (a claim that names none gets
# 1 GiB), cores as a percentage (a claim that names none reserves none: it time-slices).
MEMORY_STEP = canonical_mib(MEMORY_STEP_MIB)
CORES = 100

Entry = dict[str, Any]


@dataclass(frozen=True)
class Sharing:
    """Which GPUs are shared: UUIDs (`GPU-…`) or product-name globs (`*A100*`), any case;
    and the enforced limit profiles whose mechanism holds a claim to its share there."""

    selectors: tuple[str, ...] = ()
    enforced: tuple[str, ...] = ()

    def shares(self, device: Device) -> bool:
        for selector in self.selectors:
            if selector.lower().startswith("gpu-"):
                if selector.lower() == device.uuid.lower():
                    return True
            elif fnmatch.fnmatchcase(device.product.lower(), selector.lower()):
                return True
        return False


@dataclass(frozen=True)
class DraDevice:
    """One published device: its name, the physical GPU it lives on (whose device node a
    container gets), the MIG device it is if it is one, and its slice entry without taints."""

    name: str
    gpu: Device
    entry: Entry = field(compare=False)
    shared: bool = False
    mig: MigDevice | None = None

    @property
    def uuid(self) -> str:
        """Whose health it has: the MIG device's, or the GPU's."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid


def string(value: str) -> dict[str, str]:
    return {"string": value[:64]}


def version(text: str) -> dict[str, str] | None:
    """A dotted version as strict semver: `535.104.05` → `535.104.5`, `12.4` → `12.4.0`
    (what NVIDIA's driver publishes after its lenient parse); None if it is not one."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    return {"version": ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])}


def islands(devices: Sequence[Device]) -> dict[int, int]:
    """Index → the lowest index of its NVLink-connected component."""
    parent = {d.index: d.index for d in devices}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for d in devices:
        for peer, count in d.nvlinks:
            if count > 0 and peer in parent:
                a, b = root(d.index), root(peer)
                parent[max(a, b)] = min(a, b)
    return {i: root(i) for i in parent}


def _capacity(gpu: Device, shared: bool) -> Entry:
    memory = canonical_mib(gpu.memory_mib)
    if not shared:
        return {MEMORY: {"value": memory}}
    step = {"default": MEMORY_STEP, "validRange": {"min": MEMORY_STEP, "step": MEMORY_STEP}}
    cores = {"default": "0", "validRange": {"min": "0", "max": str(CORES), "step": "1"}}
    return {
        MEMORY: {"value": memory, "requestPolicy": step},
        CORES_CAPACITY: {"value": str(CORES), "requestPolicy": cores},
    }


def parent_attributes(gpu: Gpu, node: NodeGpus) -> Entry:
    """What a GPU and each of its MIG devices say of the GPU."""
    d = gpu.device
    major, minor = gpu.compute_capability
    attributes: Entry = {
        PRODUCT: string(d.product),
        "brand": string(gpu.brand or nvidia.brand_of(d.product)),
        "architecture": string(nvidia.architecture(major, minor)),
        MODEL: string(model_token(d.product)),
        STANDARD + "pciBusID": string(d.pci_bus_id),
    }
    for name, text in (
        ("cudaComputeCapability", f"{major}.{minor}"),
        ("driverVersion", node.driver_version),
        ("cudaDriverVersion", node.cuda_version),
    ):
        value = version(text)
        if value is not None:
            attributes[name] = value
    if gpu.pcie_root:
        attributes[STANDARD + "pcieRoot"] = string(gpu.pcie_root)
    if d.numa_node >= 0:
        attributes[STANDARD + "numaNode"] = {"int": d.numa_node}
    return attributes


def gpu_entry(gpu: Gpu, node: NodeGpus, island: int, sharing: Sharing) -> Entry:
    d = gpu.device
    shared = sharing.shares(d)
    attributes: Entry = {
        TYPE: string(GPU_TYPE),
        UUID: string(d.uuid),
        ISLAND: {"int": island},
        SHARED: {"bool": shared},
        **parent_attributes(gpu, node),
    }
    if shared:
        for profile in limits.ENFORCED:
            held = profile in sharing.enforced
            attributes[limits.enforcement_attribute(profile)] = {"bool": held}
    entry: Entry = {"name": device_name(d), "attributes": attributes}
    entry["capacity"] = _capacity(d, shared)
    if shared:
        entry["allowMultipleAllocations"] = True
    return entry


def device_name(gpu: Device) -> str:
    """`gpu-<minor>`, as NVIDIA's driver names a whole GPU."""
    return f"gpu-{gpu.minor}"


def gpu_devices(node: NodeGpus, sharing: Sharing) -> list[DraDevice]:
    """One device per GPU, in index order; not a GPU in MIG mode, which a container can use
    only through its MIG devices (NVIDIA's driver publishes none for it either)."""
    island = islands(node.devices)
    out = []
    for gpu in sorted(node.gpus, key=lambda g: g.device.index):
        if gpu.mig_enabled:
            continue
        entry = gpu_entry(gpu, node, island[gpu.device.index], sharing)
        out.append(DraDevice(entry["name"], gpu.device, entry, sharing.shares(gpu.device)))
    return out


def mig_name(gpu: Device, m: Mig) -> str:
    """`gpu-0-mig-1g10gb-19-0`, `gpu-0-mig-1g10gb-me-20-0`: NVIDIA's name (its profile made a
    DNS label: dots dropped, anything else outside `[a-z0-9-]` a dash)."""
    profile = "".join(c if c.isalnum() else "-" for c in m.device.profile.lower().replace(".", ""))
    return f"gpu-{gpu.minor}-mig-{profile.strip('-')}-{m.profile_id}-{m.placement[0]}"


def mig_entry(gpu: Gpu, m: Mig, node: NodeGpus) -> Entry:
    start, size = m.placement
    copy, decoders, encoders, jpeg, ofa = m.engines
    counts = {
        "multiprocessors": m.multiprocessors,
        "copyEngines": copy,
        "decoders": decoders,
        "encoders": encoders,
        "jpegEngines": jpeg,
        "ofaEngines": ofa,
    }
    capacity: Entry = {name: {"value": str(n)} for name, n in counts.items()}
    capacity[MEMORY] = {"value": canonical_mib(m.device.memory_mib)}
    capacity |= {f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)}
    attributes: Entry = {
        TYPE: string(MIG_TYPE),
        UUID: string(m.device.uuid),
        "parentUUID": string(gpu.device.uuid),
        PROFILE: string(m.device.profile),
        **parent_attributes(gpu, node),
    }
    return {"name": mig_name(gpu.device, m), "attributes": attributes, "capacity": capacity}


def unpublished(m: Mig) -> str | None:
    """Why a MIG device is not published, if it is not."""
    if not m.whole:
        return "its compute instance is smaller than its GPU instance"
    if m.profile_id < 0 or not m.device.uuid:
        return "NVML did not say its GPU instance's profile (does the plugin run as root?)"
    return None


def _smallest_first(m: Mig) -> tuple[int, int, int]:
    return m.device.slices, m.device.memory_mib, m.placement[0]


def mig_devices(node: NodeGpus, sharing: Sharing) -> list[DraDevice]:
    """Each MIG device of each GPU in MIG mode (`unpublished` ones left out): GPUs in index
    order, each GPU's smallest first, as NVIDIA's names sort, because the allocator takes the
    first device that fits in slice order. Sharing is for whole GPUs only."""
    out = []
    for gpu in sorted(node.gpus, key=lambda g: g.device.index):
        if not gpu.mig_enabled:
            continue
        for m in sorted(node.mig_of(gpu.device.uuid), key=_smallest_first):
            if unpublished(m) is None:
                entry = mig_entry(gpu, m, node)
                out.append(DraDevice(entry["name"], gpu.device, entry, mig=m.device))
    return out


Kind = Callable[[NodeGpus, Sharing], list[DraDevice]]
KINDS: tuple[Kind, ...] = (gpu_devices, mig_devices)


def devices(node: NodeGpus, sharing: Sharing, kinds: Sequence[Kind] = KINDS) -> list[DraDevice]:
    """Every device of every kind, in kind order; names are unique within the pool."""
    out = [device for kind in kinds for device in kind(node, sharing)]
    names = [d.name for d in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"device names must be unique in a pool: {', '.join(duplicates)}")
    return out
