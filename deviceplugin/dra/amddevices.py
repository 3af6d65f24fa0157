"""An AMD node's GPUs and partitions as DRA devices, with AMD's DRA driver's names. Pure.

AMD's driver (ROCm/k8s-gpu-dra-driver, `docs/driver-attributes.md` and
`cmd/gpu-kubeletplugin/deviceinfo.go`) publishes one device per GPU and one per partition,
named `gpu-<card>-<render>` (the DRM minors), with `type` `amdgpu` for a whole GPU (SPX, or a
GPU without partition modes) and `amdgpu-partition` for a partition (DPX, QPX, CPX), and the
attributes `productName`, `deviceID` (`0x74a1`), `family` (amdgpu's: `AI`, `NV`), `driverVersion`
(a version), `partitionProfile` (`cpx_nps4`, absent where the GPU has no modes), `numaNode`, and
the standard `resource.kubernetes.io/pciBusID` (a partition's is its GPU's: the way to keep
partitions on one GPU or apart) and `pcieRoot`; capacities `memory`, `computeUnits` and
`simdUnits` (a partition's share). Here they are unprefixed, in gpuwire's driver's domain, so
a selector written against `device.attributes["gpu.amd.com"]` selects the same devices with
only the domain changed. gpuwire adds `uuid` (ROCm's `GPU-<unique id>`, what
`AMD_VISIBLE_DEVICES` and the claim's token name), `model` (the model token of its labels) and
`xgmiIsland` (the lowest index among the devices this one reaches over XGMI, itself included:
`nvlinkIsland`'s sibling, for a multi-GPU claim on one hive). AMD devices are never shared: a
claim gets a GPU or partition whole, as KFD's cgroup check gives it.
"""

from __future__ import annotations

from deviceplugin.agent.labels import model_token
from deviceplugin.dra.devices import STANDARD, DraDevice, Entry, Sharing, islands, string, version
from deviceplugin.gpus.amd import AmdNodeGpus
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from gpuwire import amd, dra
from gpuwire.kfd import AmdGpu, AmdNode
from gpuwire.quantity import canonical_mib


def device_type(gpu: AmdGpu) -> str:
    """A partition is a device of a GPU in a mode of more than one (AMD's driver: any mode but
    SPX); a GPU in SPX, or without modes, is a whole GPU."""
    return dra.AMD_PARTITION_TYPE if gpu.parent else dra.AMD_GPU_TYPE


def device_name(gpu: AmdGpu) -> str:
    """`gpu-<card>-<render>`, as AMD's driver names it; `gpu-render<render>` where DRM shows
    the device no card."""
    if gpu.card < 0:
        return f"gpu-render{gpu.device.minor}"
    return f"gpu-{gpu.card}-{gpu.device.minor}"


def driver_version(text: str) -> dict[str, str] | None:
    """amdgpu's version as a version attribute: its leading dotted numbers (`6.12.12`; a
    kernel release `6.1.0-28-amd64` is `6.1.0`)."""
    head = text.strip().split("-", 1)[0]
    return version(head)


def entry(gpu: AmdGpu, found: Gpu, node: AmdNode, island: int) -> Entry:
    d = gpu.device
    attributes: Entry = {
        dra.TYPE: string(device_type(gpu)),
        dra.UUID: string(d.uuid),
        dra.PRODUCT: string(d.product),
        dra.DEVICE_ID: string(f"0x{gpu.device_id:04x}"),
        dra.MODEL: string(model_token(d.product)),
        dra.XGMI_ISLAND: {"int": island},
        STANDARD + "pciBusID": string(d.pci_bus_id),
    }
    family = amd.family(gpu.gfx_target_version)
    if family:
        attributes["family"] = string(family)
    value = driver_version(node.version)
    if value is not None:
        attributes["driverVersion"] = value
    if gpu.partition_type:
        attributes[dra.PARTITION_PROFILE] = string(gpu.partition_type)
    if d.numa_node >= 0:
        attributes["numaNode"] = {"int": d.numa_node}
        attributes[STANDARD + "numaNode"] = {"int": d.numa_node}
    if found.pcie_root:
        attributes[STANDARD + "pcieRoot"] = string(found.pcie_root)
    capacity = {
        dra.MEMORY: {"value": canonical_mib(d.memory_mib)},
        dra.COMPUTE_UNITS: {"value": str(gpu.compute_units)},
        dra.SIMD_UNITS: {"value": str(gpu.simd_count)},
    }
    return {"name": device_name(gpu), "attributes": attributes, "capacity": capacity}


def amd_devices(node: NodeGpus, sharing: Sharing) -> list[DraDevice]:
    """One device per GPU or partition, in AMD's toolkit's order (the index); none on a node
    whose discovery is not AMD's. Sharing does not apply: an AMD device is given whole."""
    if not isinstance(node, AmdNodeGpus):
        return []
    island = islands(node.devices)
    found = {g.device.uuid: g for g in node.gpus}
    out = []
    for gpu in sorted(node.kfd.gpus, key=lambda g: g.device.index):
        e = entry(gpu, found[gpu.device.uuid], node.kfd, island[gpu.device.index])
        out.append(DraDevice(e["name"], gpu.device, e))
    return out
