"""What amdgpu and KFD show of a node's AMD GPUs, read from sysfs: AMD's discovery.

No library and no daemon, on the start path and in the node agent alike: the kernel says it
all in sysfs, which is where AMD's own tools read it (ROCr's libhsakmt `topology.c`, AMD's
device plugin `internal/pkg/amdgpu/amdgpu.go`).

- KFD's topology, `sys/class/kfd/kfd/topology/nodes/<n>/` (kernel `amdkfd/kfd_topology.c`):
  `properties` (`key value` lines, unsigned decimal; a node with `simd_count 0` is a CPU),
  `gpu_id`, `name`, `mem_banks/<i>/properties` (`heap_type` 1 and 2 are the GPU's own memory),
  `io_links/<i>/properties` and `p2p_links/<i>/properties` (`type` 2 PCIe, 11 XGMI, `node_to`,
  `weight`). One node per GPU, or per partition of a partitioned GPU, each with its DRM render
  node (`drm_render_minor`), its PCI location (`domain`, `location_id`), `unique_id`,
  `hive_id` (one XGMI hive), the SIMDs that make its compute units.
- DRM, `sys/class/drm/{card,renderD}<N>/device`: which card node goes with which render node
  (the same device); a partition's are those of its `amdgpu_xcp_<n>` platform device.
- amdgpu's PCI attributes (`Documentation/gpu/amdgpu/driver-misc.rst`, `ras.rst`): `revision`,
  `numa_node`, `unique_id`, `current_compute_partition` / `current_memory_partition` and
  their `available_*`, `ras/<block>_err_count` (`ue: <n>` uncorrectable, `ce: <n>` corrected).
- libdrm's `amdgpu.ids` names products (`gpuwire.amd.parse_ids`); the driver's version is
  `sys/module/amdgpu/version` (an out-of-tree amdgpu), else the kernel's release (in-tree).

Devices are numbered as AMD's container toolkit numbers them: by PCI bus id, the partitions of
one GPU by partition number (the partition that keeps the GPU's own DRM nodes first, then by
render minor). A device's `minor` is its render minor. Where NVML gives NVIDIA's facts, this
is AMD's equivalent (docs/amd.md lists them).
"""

from __future__ import annotations

import os

from gpuwire import amd
from gpuwire.devices import CharDevice, Device
from gpuwire.roots import Roots
from gpuwire.value import Value

HEAPS = (1, 2)  # HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC, _PRIVATE: the GPU's own memory
MIB = 1 << 20


class KfdError(RuntimeError):
    """No AMD GPU driver, or a KFD topology that cannot be read."""


class Link(Value):
    """One KFD io_link or p2p_link of a GPU: to which KFD node, of which type, how costly."""

    __slots__ = _fields = ("node_to", "type", "weight")
    node_to: int
    type: int  # amd.LINK_PCIE, amd.LINK_XGMI, …
    weight: int  # KFD: PCIe 20, XGMI 15 × hops, else the NUMA distance

    def __init__(self, node_to: int, type: int, weight: int) -> None:
        self._set(node_to=node_to, type=type, weight=weight)


class AmdGpu(Value):
    """One KFD GPU node: a whole GPU, or one partition of a partitioned GPU, which is a device
    of its own (its render node, compute units and memory) with its GPU as `parent`."""

    __slots__ = _fields = (
        "device",
        "node",
        "card",
        "device_id",
        "revision",
        "gfx_target_version",
        "simd_count",
        "compute_units",
        "unique_id",
        "hive_id",
        "parent",
        "partition",
        "compute_partition",
        "memory_partition",
        "links",
        "problem",
    )
    device: Device  # index, minor (render minor), uuid, bus id, product, MiB, NUMA, XGMI peers
    node: int  # its KFD node
    card: int  # /dev/dri/card<N>; -1 where DRM shows none
    device_id: int  # PCI device id (0x74a1)
    revision: int  # PCI revision; -1 where unknown
    gfx_target_version: int  # 90402 (gfx942)
    simd_count: int
    compute_units: int
    unique_id: int  # KFD's; 0 where the GPU reports none
    hive_id: int  # 0: in no XGMI hive
    parent: str  # a partition's GPU (its uuid); "" for a whole GPU
    partition: int  # its number within its GPU (0 for a whole GPU)
    compute_partition: str  # SPX, CPX, …; "" where the GPU cannot be partitioned
    memory_partition: str  # NPS1, NPS4, …; ""
    links: tuple[Link, ...]
    problem: str  # why it is unhealthy; "" when healthy

    def __init__(
        self,
        device: Device,
        node: int,
        card: int = -1,
        device_id: int = 0,
        revision: int = -1,
        gfx_target_version: int = 0,
        simd_count: int = 0,
        compute_units: int = 0,
        unique_id: int = 0,
        hive_id: int = 0,
        parent: str = "",
        partition: int = 0,
        compute_partition: str = "",
        memory_partition: str = "",
        links: tuple[Link, ...] = (),
        problem: str = "",
    ) -> None:
        self._set(
            device=device,
            node=node,
            card=card,
            device_id=device_id,
            revision=revision,
            gfx_target_version=gfx_target_version,
            simd_count=simd_count,
            compute_units=compute_units,
            unique_id=unique_id,
            hive_id=hive_id,
            parent=parent,
            partition=partition,
            compute_partition=compute_partition,
            memory_partition=memory_partition,
            links=links,
            problem=problem,
        )

    @property
    def healthy(self) -> bool:
        return not self.problem

    @property
    def partition_type(self) -> str:
        """`cpx_nps4`, `spx_nps1`; "" for a GPU without partition modes (MI210, Radeon)."""
        if not self.compute_partition or not self.memory_partition:
            return ""
        return amd.partition_type(self.compute_partition, self.memory_partition)


class AmdNode:
    """Everything AMD discovery found on a node: the driver's version, `/dev/kfd`, the GPUs
    (partitions included), and the partition modes each GPU may be put in."""

    __slots__ = ("gpus", "kfd", "modes", "roots", "version")
    mig = ()  # no MIG: a partition is a device of its own

    def __init__(
        self,
        roots: Roots,
        version: str,
        gpus: tuple[AmdGpu, ...],
        kfd: CharDevice | None,
        modes: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
    ) -> None:
        self.roots = roots
        self.version = version
        self.gpus = gpus
        self.kfd = kfd  # None: no /dev/kfd (or no kfd major) on this node
        self.modes = modes or {}  # bus id → (compute modes, memory modes) it offers

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(g.device for g in self.gpus)

    def _key(self) -> tuple[object, ...]:
        return self.version, self.gpus, tuple(sorted(self.modes.items()))

    def __eq__(self, other: object) -> bool:
        """Equal when they found the same (where they were read from aside)."""
        return isinstance(other, AmdNode) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def gpu(self, device: Device) -> AmdGpu:
        return next(g for g in self.gpus if g.device == device)

    def render_node(self, gpu: AmdGpu) -> CharDevice:
        name = f"dri/renderD{gpu.device.minor}"
        return CharDevice(name, amd.DRM_MAJOR, gpu.device.minor, f"{self.roots.dev}/dev/{name}")

    def card_node(self, gpu: AmdGpu) -> CharDevice | None:
        if gpu.card < 0:
            return None
        name = f"dri/card{gpu.card}"
        return CharDevice(name, amd.DRM_MAJOR, gpu.card, f"{self.roots.dev}/dev/{name}")


# -- pure parsers of the kernel's formats -------------------------------------------------


def parse_properties(text: str) -> dict[str, int]:
    """KFD's `key value` lines → key → value; the first line of a key counts, lines that are
    not a key and an unsigned decimal are skipped (as AMD's device plugin reads them)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        value = value.strip()
        if key and value.isdigit() and key not in found:
            found[key] = int(value)
    return found


def bus_id(domain: int, location_id: int) -> str:
    """KFD's PCI location → the GPU's bus id. `location_id` is `(bus << 8) | devfn`; on a
    partitioned GPU the partition number is OR-ed into it (its low bits on older kernels,
    bits 31:28 on newer), so the function is taken as 0, as AMD's device plugin does: every
    partition names its GPU."""
    bus, device = (location_id >> 8) & 0xFF, (location_id >> 3) & 0x1F
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def parse_ras(text: str) -> int:
    """`ue: <n>\\nce: <m>` of a RAS error count file → the uncorrectable errors."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "ue" and value.strip().isdigit():
            return int(value.strip())
    return 0


def gpu_uuid(unique_id: int, gpu_id: int, bus: str) -> str:
    """A device's name: ROCm's `GPU-<unique_id>`; a GPU that reports no unique id (consumer
    GPUs, some partitions) by KFD's `gpu_id`, else by its bus id, in the same form."""
    if unique_id:
        return amd.uuid(unique_id)
    if gpu_id:
        return amd.uuid(gpu_id)
    return amd.uuid(int(bus.replace(":", "").replace(".", ""), 16))


# -- the filesystem -------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _numbered(path: str) -> list[str]:
    return sorted((e for e in _entries(path) if e.isdigit()), key=int)


def _properties_of(path: str) -> dict[str, int]:
    text = _read(f"{path}/properties")
    return parse_properties(text) if text is not None else {}


class KfdNode(Value):
    """One topology node as sysfs lists it, before it is made a device."""

    __slots__ = _fields = ("node", "properties", "gpu_id", "name", "banks", "links")
    node: int
    properties: dict[str, int]
    gpu_id: int
    name: str
    banks: tuple[dict[str, int], ...]
    links: tuple[Link, ...]

    def __init__(
        self,
        node: int,
        properties: dict[str, int],
        gpu_id: int,
        name: str,
        banks: tuple[dict[str, int], ...],
        links: tuple[Link, ...],
    ) -> None:
        self._set(
            node=node, properties=properties, gpu_id=gpu_id, name=name, banks=banks, links=links
        )

    @property
    def is_gpu(self) -> bool:
        """KFD's rule: a node without SIMDs is a CPU (its `gpu_id` is 0 too)."""
        return self.properties.get("simd_count", 0) > 0

    @property
    def memory_bytes(self) -> int:
        """The GPU's own memory: its frame-buffer banks, else `local_mem_size`."""
        own = sum(b.get("size_in_bytes", 0) for b in self.banks if b.get("heap_type") in HEAPS)
        return own or self.properties.get("local_mem_size", 0)


def read_topology(sys_root: str) -> tuple[KfdNode, ...]:
    """Every node of KFD's topology under `sys_root`, by node number; KfdError where there is
    no topology (no amdgpu, or KFD not loaded)."""
    top = f"{sys_root}/{amd.KFD_TOPOLOGY}"
    if not os.path.isdir(f"{top}/nodes"):
        raise KfdError(f"no AMD GPU driver: {top}/nodes is missing (is the amdgpu module loaded?)")
    nodes = []
    for entry in _numbered(f"{top}/nodes"):
        base = f"{top}/nodes/{entry}"
        properties = _properties_of(base)
        gpu_id = (_read(f"{base}/gpu_id") or "0").strip()
        banks = tuple(
            _properties_of(f"{base}/mem_banks/{b}") for b in _numbered(f"{base}/mem_banks")
        )
        links = []
        for kind in ("io_links", "p2p_links"):
            for i in _numbered(f"{base}/{kind}"):
                p = _properties_of(f"{base}/{kind}/{i}")
                if "node_to" in p:
                    links.append(Link(p["node_to"], p.get("type", 0), p.get("weight", 0)))
        nodes.append(
            KfdNode(
                int(entry),
                properties,
                int(gpu_id) if gpu_id.isdigit() else 0,
                (_read(f"{base}/name") or "").strip(),
                banks,
                tuple(links),
            )
        )
    return tuple(nodes)


def read_drm(sys_root: str) -> dict[int, tuple[int, str]]:
    """Render minor → (card minor or -1, the device's sysfs directory), from the DRM class:
    a card and a render node of one device go together."""
    base = f"{sys_root}/{amd.DRM_CLASS}"
    by_device: dict[str, dict[str, int]] = {}
    for name in _entries(base):
        for prefix in ("renderD", "card"):
            number = name[len(prefix) :]
            if name.startswith(prefix) and number.isdigit():
                device = os.path.realpath(f"{base}/{name}/device")
                by_device.setdefault(device, {})[prefix] = int(number)
    return {
        kinds["renderD"]: (kinds.get("card", -1), device)
        for device, kinds in by_device.items()
        if "renderD" in kinds
    }


def _pci_text(pci: str | None, name: str) -> str:
    return ((_read(f"{pci}/{name}") if pci else None) or "").strip()


def _listed(text: str) -> tuple[str, ...]:
    """The modes an `available_*` file lists: amdgpu joins them with ", " (`SPX, DPX, QPX,
    CPX`; `amdgpu_gfx.c`, `amdgpu_gmc.c` `available_memory_partition_show`)."""
    return tuple(mode.strip().upper() for mode in text.split(","))


def _problem(pci: str | None, node: KfdNode, render: int, dev_root: str) -> str:
    """What the kernel says is wrong with a GPU, or ""."""
    # older kernels print no gfx_target_version at all (libhsakmt then looked the GFX
    # version up by device id; a real capture, tests/deviceplugin/amd_dumps/vega10-old-kernel):
    # only a version KFD prints as 0 says the GPU is unusable
    if node.properties.get("gfx_target_version", 1) <= 0:
        return "KFD reports no GFX version"
    if render < amd.RENDER_MINOR_BASE:
        return "KFD names no DRM render node"
    if not os.path.exists(f"{dev_root}/dev/dri/renderD{render}"):
        return f"/dev/dri/renderD{render} is missing"
    errors = []
    for name in sorted(_entries(f"{pci}/ras") if pci else []):
        if name.endswith("_err_count"):
            count = parse_ras(_read(f"{pci}/ras/{name}") or "")
            if count:
                errors.append(f"{name.removesuffix('_err_count')} {count}")
    return f"uncorrectable RAS errors: {', '.join(errors)}" if errors else ""


def _int(text: str, base: int = 10) -> int | None:
    try:
        return int(text, base)
    except ValueError:
        return None


def _driver_version(roots: Roots) -> str:
    version = (_read(f"{roots.sys}/{amd.MODULE_VERSION}") or "").strip()
    if version:
        return version
    return (_read(f"{roots.proc}/proc/sys/kernel/osrelease") or "").strip()


def _product_table(roots: Roots) -> dict[tuple[int, int], str]:
    for relative in amd.AMDGPU_IDS:
        text = _read(f"{roots.driver}/{relative}")
        if text is not None:
            return amd.parse_ids(text)
    return {}


def _kfd_node(roots: Roots) -> CharDevice | None:
    from gpuwire.driver import parse_proc_devices

    majors = parse_proc_devices(_read(f"{roots.proc}/proc/devices") or "")
    path = f"{roots.dev}/dev/{amd.KFD_NODE}"
    major = majors.get(amd.KFD_MAJOR_NAME)
    return CharDevice(amd.KFD_NODE, major, 0, path) if major and os.path.exists(path) else None


class PciFacts(Value):
    """What a GPU's PCI device says, shared by each of its KFD nodes."""

    __slots__ = _fields = ("revision", "numa_node", "unique_id", "compute", "memory")
    revision: int  # -1: unknown
    numa_node: int  # -1: none
    unique_id: int  # amdgpu's `unique_id`: the GPU's own, a partition's parent; 0: none
    compute: str  # current_compute_partition; "" where the GPU has no partition modes
    memory: str  # current_memory_partition

    def __init__(
        self, revision: int, numa_node: int, unique_id: int, compute: str, memory: str
    ) -> None:
        self._set(
            revision=revision,
            numa_node=numa_node,
            unique_id=unique_id,
            compute=compute,
            memory=memory,
        )


def read_pci(pci: str | None) -> PciFacts:
    revision = _int(_pci_text(pci, "revision"), 16)
    numa = _int(_pci_text(pci, "numa_node"))
    return PciFacts(
        -1 if revision is None else revision,
        -1 if numa is None else numa,
        _int(_pci_text(pci, "unique_id"), 16) or 0,
        _pci_text(pci, "current_compute_partition").upper(),
        _pci_text(pci, "current_memory_partition").upper(),
    )


def _render(node: KfdNode) -> int:
    return node.properties.get("drm_render_minor", 0)


def discover(roots: Roots) -> AmdNode:
    """The AMD GPUs under `roots` (sysfs under `roots.sys`, device nodes under `roots.dev`,
    the product table under `roots.driver`), numbered as AMD's container toolkit numbers them."""
    drm = read_drm(roots.sys)
    names = _product_table(roots)
    by_bus: dict[str, list[KfdNode]] = {}
    for node in read_topology(roots.sys):
        if node.is_gpu:
            p = node.properties
            by_bus.setdefault(bus_id(p.get("domain", 0), p.get("location_id", 0)), []).append(node)
    ordered: list[tuple[str, KfdNode, PciFacts, str, str, int, str]] = []
    modes: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for bus, members in sorted(by_bus.items()):
        pci_dir = f"{roots.sys}/{amd.PCI_DEVICES}/{bus}"
        pci = os.path.realpath(pci_dir) if os.path.isdir(pci_dir) else None
        facts = read_pci(pci)
        if facts.compute:
            modes[bus] = (
                _listed(_pci_text(pci, "available_compute_partition")),
                _listed(_pci_text(pci, "available_memory_partition")),
            )
        # the partition that keeps the GPU's own DRM nodes first, then by render minor
        members.sort(key=lambda n: (drm.get(_render(n), (-1, ""))[1] != pci, _render(n)))
        ids = [n.properties.get("unique_id", 0) for n in members]
        shared = len(set(ids)) < len(ids)  # older kernels give each partition the GPU's id
        gpu = gpu_uuid(facts.unique_id or ids[0], members[0].gpu_id, bus)
        parent = gpu if len(members) > 1 else ""
        for number, node in enumerate(members):
            own = gpu_uuid(node.properties.get("unique_id", 0), node.gpu_id, bus)
            uuid = f"{gpu}-p{number}" if shared else own
            problem = _problem(pci, node, _render(node), roots.dev)
            ordered.append((bus, node, facts, uuid, parent, number, problem))
    index_of = {entry[1].node: i for i, entry in enumerate(ordered)}
    gpus = []
    for i, (bus, node, facts, uuid, parent, number, problem) in enumerate(ordered):
        p = node.properties
        render = _render(node)
        peers = {
            index_of[link.node_to]
            for link in node.links
            if link.type == amd.LINK_XGMI and link.node_to in index_of
        } - {i}
        simd_per_cu = p.get("simd_per_cu", 0)
        device = Device(
            index=i,
            minor=render,
            uuid=uuid,
            pci_bus_id=bus,
            product=amd.product_name(names, p.get("device_id", 0), facts.revision),
            memory_mib=node.memory_bytes // MIB,
            numa_node=facts.numa_node,
            nvlinks=tuple((peer, 1) for peer in sorted(peers)),
        )
        gpus.append(
            AmdGpu(
                device,
                node.node,
                card=drm.get(render, (-1, ""))[0],
                device_id=p.get("device_id", 0),
                revision=facts.revision,
                gfx_target_version=p.get("gfx_target_version", 0),
                simd_count=p.get("simd_count", 0),
                compute_units=p.get("simd_count", 0) // simd_per_cu if simd_per_cu else 0,
                unique_id=p.get("unique_id", 0),
                hive_id=p.get("hive_id", 0),
                parent=parent,
                partition=number,
                compute_partition=facts.compute,
                memory_partition=facts.memory,
                links=node.links,
                problem=problem,
            )
        )
    return AmdNode(roots, _driver_version(roots), tuple(gpus), _kfd_node(roots), modes)
