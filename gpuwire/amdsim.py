"""The simulated AMD GPU node: a host root laid out as amdgpu and KFD lay out a real one.

`gpuwire sim node DIR --vendor amd` writes, in the kernel's formats (`gpuwire.kfd` says
where each comes from): KFD's topology (`sys/class/kfd/kfd/topology`: a CPU node per NUMA
node, then a node per GPU or partition with `properties`, `gpu_id`, `name`, `mem_banks`,
`io_links` and `p2p_links`), the DRM class (`sys/class/drm/card<N>`, `renderD<N>`, each a
link into its device's directory), each GPU's PCI directory (`vendor`, `device`, `revision`,
`numa_node`, `unique_id`, `mem_info_vram_total`, partition modes where the product has them,
`ras/*_err_count`), the partition platform devices `amdgpu_xcp_<n>` (seven per partitionable
GPU, made at driver load in every mode: idle ones are absent from KFD), `sys/module/amdgpu`,
`/proc/devices` (`kfd`'s major is dynamic), `/dev/kfd` and `/dev/dri/*` (character devices
with those majors when run as root: opened in a container they give ENXIO where the cgroup
allows them and EPERM where it does not), and libdrm's `amdgpu.ids`.

Like a real server it has a BMC's display controller as `card0` (ASPEED, no render node), so
card and render numbers of a GPU do not line up. Products (`PRODUCTS`): MI210 (PCIe, or XGMI
hives of up to four over bridges), MI300X (one XGMI hive of eight, fully connected; SPX, DPX,
QPX or CPX compute partitions with the NPS modes amdgpu allows each), and a Radeon RX 7900
XTX (a consumer GPU that reports no unique id). How KFD links partitions is as real CPX
captures show it (XGMI: weight 13 to the partitions of their own GPU, 41 to other GPUs'),
not documented; inferred: the order of DRM minors (a GPU's own, then its seven partition
devices', which the MI308X capture's render minors, 128-131 and 136-139, fit).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwire import amd, exits

KFD_MAJOR = 234  # dynamic on a real node: readers take it from /proc/devices
DRIVER_VERSION = "6.12.12"  # amdgpu's out-of-tree version (sys/module/amdgpu/version)
TOPOLOGY = amd.KFD_TOPOLOGY
XCP_PER_GPU = 7  # partition platform devices per partitionable GPU (XCP 0 is the GPU's own)
BMC_CARD = 0  # the ASPEED display controller of a server's BMC: card0, no render node
# Bus numbers of an 8-GPU MI300X platform, then evenly spaced ones.
_BUSES = (0x05, 0x15, 0x65, 0x75, 0x85, 0x95, 0xE5, 0xF5)
# Modes amdgpu allows together on a GFX 9.4.3 part (`__aqua_vanjaram_is_valid_mode`).
VALID_MODES = {
    "SPX": ("NPS1",),
    "DPX": ("NPS1", "NPS2"),
    "QPX": ("NPS1", "NPS4"),
    "CPX": ("NPS1", "NPS4"),
}
# The memory modes its firmware supports, which amdgpu lists in `available_memory_partition`
# (`amdgpu_gmc.c`: `gmc.supported_nps_modes`): all of the above, as an MI300X on a current
# VBIOS lists them (`NPS1, NPS2, NPS4`; an older VBIOS lists no NPS2, AMD's partitioning docs).
MEMORY_MODES = tuple(m for m in amd.MEMORY_PARTITIONS if any(m in v for v in VALID_MODES.values()))


@dataclass(frozen=True)
class Product:
    """An AMD GPU model as KFD and amdgpu report it (ROCm's GPU specifications table)."""

    name: str  # as libdrm's amdgpu.ids names it
    device_id: int
    revision: int
    gfx_target_version: int
    simd_count: int  # of the whole GPU
    simd_per_cu: int
    xcc: int  # compute dies (XCDs) of the whole GPU
    vram_gib: int
    kfd_name: str
    pci_class: int
    partitionable: bool = False
    unique_id: bool = True  # whether the GPU reports one (consumer GPUs often do not)
    max_hive: int = 0  # most GPUs one XGMI hive joins; 0: PCIe only


PRODUCTS = {
    "MI210": Product(
        "AMD Instinct MI210", 0x740F, 0x02, 90010, 416, 4, 1, 64, "aldebaran", 0x038000,
        max_hive=4,
    ),
    "MI300X": Product(
        "AMD Instinct MI300X", 0x74A1, 0x00, 90402, 1216, 4, 8, 192, "ip discovery", 0x120000,
        partitionable=True, max_hive=8,
    ),
    "RX7900XTX": Product(
        "AMD Radeon RX 7900 XTX", 0x744C, 0xC8, 110000, 192, 2, 1, 24, "ip discovery", 0x030000,
        unique_id=False,
    ),
}  # fmt: skip
DEFAULT_PRODUCT = "MI300X"


@dataclass(frozen=True)
class SimAmdGpu:
    """One simulated GPU: which product, where, and how it is partitioned."""

    product: str  # a PRODUCTS key
    bus: str  # 0000:05:00.0
    numa_node: int
    unique_id: int  # the GPU's own (amdgpu's PCI `unique_id`); 0: reports none
    hive_id: int  # 0: in no XGMI hive
    compute: str = ""  # SPX, CPX, …; "" for a product without partition modes
    memory: str = ""  # NPS1, NPS4, …
    ras_ue: int = 0  # uncorrectable errors in its memory (umc) so far

    @property
    def model(self) -> Product:
        return PRODUCTS[self.product]

    @property
    def partitions(self) -> int:
        return amd.COMPUTE_PARTITIONS[self.compute] if self.compute else 1

    def partition_id(self, number: int) -> int:
        """A partition's own unique id (as recent kernels give each one), the GPU's for a
        whole GPU."""
        if self.partitions == 1 or not self.unique_id:
            return self.unique_id
        return _id(f"{self.unique_id:x}/partition/{number}")


@dataclass(frozen=True)
class AmdMachine:
    driver_version: str
    gpus: tuple[SimAmdGpu, ...]

    def to_json(self) -> str:
        body = {"driver_version": self.driver_version, "gpus": [g.__dict__ for g in self.gpus]}
        return json.dumps({"vendor": amd.VENDOR, **body}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> AmdMachine:
        raw = json.loads(text)
        return cls(raw["driver_version"], tuple(SimAmdGpu(**g) for g in raw["gpus"]))


class AmdSimError(ValueError):
    """A machine the simulated node cannot have; the message says what it can."""


def _id(text: str) -> int:
    """A stable 64-bit id from a name (the simulated unique ids and hive ids)."""
    return uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuwire-sim/amd/{text}").int >> 64


def make_machine(
    gpus: int = 8,
    product: str = DEFAULT_PRODUCT,
    hive_size: int | None = None,
    compute: str = "SPX",
    memory: str = "NPS1",
    seed: str = "gpuwire",
) -> AmdMachine:
    """`gpus` GPUs of `product`: the first half on NUMA node 0; XGMI hives of `hive_size`
    GPUs in bus order (None: the product's largest; 0: PCIe only); partition modes on a
    product that has them."""
    model = PRODUCTS.get(product)
    if model is None:
        raise AmdSimError(f"unknown product {product!r}: accepted are {', '.join(PRODUCTS)}")
    size = model.max_hive if hive_size is None else hive_size
    if size < 0 or size > model.max_hive:
        raise AmdSimError(
            f"{product} joins XGMI hives of at most {model.max_hive} GPU(s), not {size}"
        )
    if model.partitionable and memory not in VALID_MODES.get(compute, ()):
        valid = "; ".join(f"{c} with {', '.join(m)}" for c, m in VALID_MODES.items())
        raise AmdSimError(f"{product} cannot run {compute} with {memory}: amdgpu allows {valid}")
    out = []
    for i in range(gpus):
        bus = _BUSES[i] if gpus <= len(_BUSES) else 0x05 + i * (0xF0 // max(gpus, 1))
        hive = f"{seed}/hive/{i // size}" if size > 1 else ""
        out.append(
            SimAmdGpu(
                product,
                f"0000:{bus:02x}:00.0",
                0 if i < (gpus + 1) // 2 else 1,
                _id(f"{seed}/{i}") if model.unique_id else 0,
                _id(hive) if hive else 0,
                compute if model.partitionable else "",
                memory if model.partitionable else "",
            )
        )
    return AmdMachine(DRIVER_VERSION, tuple(out))


def repartition(machine: AmdMachine, compute: str, memory: str) -> AmdMachine:
    """Every partitionable GPU in new modes (what AMD's Device Config Manager does to idle
    GPUs): its KFD nodes are replaced at once."""
    for g in machine.gpus:
        if g.model.partitionable and memory not in VALID_MODES.get(compute, ()):
            raise AmdSimError(f"{g.product} cannot run {compute} with {memory}")
    gpus = tuple(
        replace(g, compute=compute, memory=memory) if g.model.partitionable else g
        for g in machine.gpus
    )
    return replace(machine, gpus=gpus)


def with_ras(machine: AmdMachine, index: int, errors: int) -> AmdMachine:
    """GPU `index` with `errors` more uncorrectable memory errors (amdgpu's RAS counts)."""
    gpus = tuple(
        replace(g, ras_ue=g.ras_ue + errors) if i == index else g
        for i, g in enumerate(machine.gpus)
    )
    return replace(machine, gpus=gpus)


# -- the layout ------------------------------------------------------------------------------


class Minors:
    """Where each GPU's DRM nodes are: its own card and render node, then its partitions'
    (the platform devices amdgpu_xcp_<n>, numbered host-wide)."""

    def __init__(self, machine: AmdMachine) -> None:
        self.card: dict[tuple[int, int], int] = {}  # (gpu, partition) → card minor
        self.render: dict[tuple[int, int], int] = {}
        self.xcp: dict[tuple[int, int], int] = {}  # (gpu, partition ≥ 1) → amdgpu_xcp_<n>
        card, render, xcp = BMC_CARD + 1, amd.RENDER_MINOR_BASE, 0
        for i, g in enumerate(machine.gpus):
            for number in range(1 + (XCP_PER_GPU if g.model.partitionable else 0)):
                self.card[(i, number)], self.render[(i, number)] = card, render
                card, render = card + 1, render + 1
                if number:
                    self.xcp[(i, number)] = xcp
                    xcp += 1


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def _symlink(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _char_device(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if os.geteuid() == 0:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
    else:  # a placeholder: without root no test can open it anyway
        path.write_bytes(b"")


def _lines(pairs: list[tuple[str, int]]) -> str:
    return "".join(f"{k} {v}\n" for k, v in pairs)


def pci_path(g: SimAmdGpu) -> str:
    """Where sysfs keeps a GPU: behind a root port of its socket's root complex."""
    bus = int(g.bus.split(":")[1], 16)
    root = 0x00 if g.numa_node == 0 else 0x80
    return f"pci0000:{root:02x}/0000:{root:02x}:{bus % 8:02x}.1/{g.bus}"


@dataclass(frozen=True)
class _Node:
    """A KFD GPU node about to be written: which GPU, which partition."""

    gpu: int
    partition: int
    number: int  # its KFD node number


def _kfd_nodes(machine: AmdMachine, cpus: int) -> list[_Node]:
    out, number = [], cpus
    for i, g in enumerate(machine.gpus):
        for p in range(g.partitions):
            out.append(_Node(i, p, number))
            number += 1
    return out


def _gpu_properties(g: SimAmdGpu, p: int, render: int, links: int, p2p: int) -> str:
    model = g.model
    share = g.partitions
    domain, bus, _ = g.bus.split(":")
    location = int(bus, 16) << 8 | (p if share > 1 else 0)  # the partition in its low bits
    pairs = [
        ("cpu_cores_count", 0),
        ("simd_count", model.simd_count // share),
        ("mem_banks_count", 1),
        ("caches_count", 0),
        ("io_links_count", links),
        ("p2p_links_count", p2p),
        ("cpu_core_id_base", 0),
        ("simd_id_base", 2147487744),
        ("max_waves_per_simd", 8),
        ("lds_size_in_kb", 64),
        ("gds_size_in_kb", 0),
        ("num_gws", 64),
        ("wave_front_size", 64 if model.gfx_target_version < 100000 else 32),
        ("array_count", 4),
        ("simd_arrays_per_engine", 1),
        ("cu_per_simd_array", 10),
        ("simd_per_cu", model.simd_per_cu),
        ("max_slots_scratch_cu", 32),
        ("gfx_target_version", model.gfx_target_version),
        ("vendor_id", amd.PCI_VENDOR),
        ("device_id", model.device_id),
        ("location_id", location),
        ("domain", int(domain, 16)),
        ("drm_render_minor", render),
        ("hive_id", g.hive_id),
        ("num_sdma_engines", 2),
        ("num_sdma_xgmi_engines", 6 if g.hive_id else 0),
        ("num_sdma_queues_per_engine", 8),
        ("num_cp_queues", 24),
        ("max_engine_clk_fcompute", 2100),
        ("local_mem_size", 0),
        ("fw_version", 192),
        ("capability", 2893521536),
        ("capability2", 1),
        ("debug_prop", 1511),
        ("sdma_fw_version", 25),
        ("unique_id", g.partition_id(p)),
        ("num_xcc", model.xcc // share),
        ("max_engine_clk_ccompute", 2400),
    ]
    return _lines(pairs)


def _link(node_from: int, node_to: int, kind: int, weight: int) -> str:
    return _lines(
        [
            ("type", kind),
            ("version_major", 0),
            ("version_minor", 0),
            ("node_from", node_from),
            ("node_to", node_to),
            ("weight", weight),
            ("min_latency", 0),
            ("max_latency", 0),
            ("min_bandwidth", 64000 if kind == amd.LINK_XGMI else 0),
            ("max_bandwidth", 64000 if kind == amd.LINK_XGMI else 32000),
            ("recommended_transfer_size", 0),
            ("flags", 1),
        ]
    )


PCIE_WEIGHT, XGMI_WEIGHT = 20, 15  # KFD's io_link weights
# a partition's XGMI links, as real CPX captures show them (MI300X, MI308X;
# tests/deviceplugin/amd_dumps): to its own GPU's partitions, to other GPUs'
SIBLING_WEIGHT, PARTITION_PEER_WEIGHT = 13, 41
PEER_WEIGHT = {True: 40, False: 52}  # a p2p_link through the CPUs: one socket, or two


def _xgmi_weight(n: _Node, m: _Node, g: SimAmdGpu) -> int:
    """The weight of the XGMI link from KFD node `n` (of GPU `g`) to `m`."""
    if g.partitions == 1:
        return XGMI_WEIGHT
    return SIBLING_WEIGHT if m.gpu == n.gpu else PARTITION_PEER_WEIGHT


def _write_topology(root: Path, machine: AmdMachine, minors: Minors) -> None:
    top = root / TOPOLOGY
    shutil.rmtree(top, ignore_errors=True)  # a repartition replaces all of it at once
    sockets = sorted({g.numa_node for g in machine.gpus} | {0})
    nodes = _kfd_nodes(machine, len(sockets))
    for cpu in sockets:
        base = top / "nodes" / str(cpu)
        mine = [n for n in nodes if machine.gpus[n.gpu].numa_node == cpu]
        cpu_pairs = [("cpu_cores_count", 96), ("simd_count", 0), ("mem_banks_count", 1)]
        cpu_pairs += [("io_links_count", len(mine)), ("gfx_target_version", 0)]
        cpu_pairs += [("drm_render_minor", 0)]
        _write(base / "properties", _lines(cpu_pairs))
        _write(base / "gpu_id", "0\n")
        _write(base / "name", "\n")
        _write(
            base / "mem_banks/0/properties", _lines([("heap_type", 0), ("size_in_bytes", 1 << 39)])
        )
        for i, n in enumerate(mine):
            _write(
                base / f"io_links/{i}/properties", _link(cpu, n.number, amd.LINK_PCIE, PCIE_WEIGHT)
            )
    for n in nodes:
        g = machine.gpus[n.gpu]
        base = top / "nodes" / str(n.number)
        xgmi = [
            m
            for m in nodes
            if m is not n and g.hive_id and machine.gpus[m.gpu].hive_id == g.hive_id
        ]
        peers = [m for m in nodes if m is not n and m not in xgmi]
        links = [_link(n.number, g.numa_node, amd.LINK_PCIE, PCIE_WEIGHT)]
        links += [_link(n.number, m.number, amd.LINK_XGMI, _xgmi_weight(n, m, g)) for m in xgmi]
        same = {m.number: machine.gpus[m.gpu].numa_node == g.numa_node for m in peers}
        p2p = [_link(n.number, m.number, amd.LINK_PCIE, PEER_WEIGHT[same[m.number]]) for m in peers]
        render = minors.render[(n.gpu, n.partition)]
        _write(base / "properties", _gpu_properties(g, n.partition, render, len(links), len(p2p)))
        _write(base / "gpu_id", f"{_id(f'{g.bus}/{n.partition}') & 0xFFFF}\n")
        _write(base / "name", f"{g.model.kfd_name}\n")
        vram = g.model.vram_gib * (1 << 30) // g.partitions
        _write(
            base / "mem_banks/0/properties",
            _lines(
                [
                    ("heap_type", 1),
                    ("size_in_bytes", vram),
                    ("flags", 0),
                    ("width", 8192),
                    ("mem_clk_max", 1300),
                ]
            ),
        )
        for i, text in enumerate(links):
            _write(base / f"io_links/{i}/properties", text)
        for i, text in enumerate(p2p):
            _write(base / f"p2p_links/{i}/properties", text)
        (base / "caches").mkdir(exist_ok=True)
    _write(top / "generation_id", "1\n")
    _write(top / "system_properties", "platform_oem 0\nplatform_id 0\nplatform_rev 0\n")


def _drm_device(root: Path, device_dir: str, kind: str, minor: int) -> None:
    """A DRM node of a device: its directory under the device, the class link to it, its
    `device` link back, and the character device."""
    name = f"{kind}{minor}"
    base = root / "sys/devices" / device_dir / "drm" / name
    _write(base / "dev", f"{amd.DRM_MAJOR}:{minor}\n")
    _symlink(base / "device", "../..")
    _symlink(root / amd.DRM_CLASS / name, f"../../devices/{device_dir}/drm/{name}")
    _char_device(root / "dev/dri" / name, amd.DRM_MAJOR, minor)


def _write_pci(root: Path, g: SimAmdGpu) -> None:
    base = root / "sys/devices" / pci_path(g)
    model = g.model
    for name, value in (
        ("vendor", f"{amd.PCI_VENDOR:#06x}"),
        ("device", f"{model.device_id:#06x}"),
        ("revision", f"{model.revision:#04x}"),
        ("class", f"{model.pci_class:#08x}"),
        ("numa_node", str(g.numa_node)),
        ("mem_info_vram_total", str(model.vram_gib << 30)),
    ):
        _write(base / name, value + "\n")
    if g.unique_id:
        _write(base / "unique_id", f"{g.unique_id:016x}\n")
    if g.compute:
        _write(base / "current_compute_partition", g.compute + "\n")
        _write(base / "available_compute_partition", ", ".join(VALID_MODES) + "\n")
        _write(base / "current_memory_partition", g.memory + "\n")
        _write(base / "available_memory_partition", ", ".join(MEMORY_MODES) + "\n")
    for block, ue in (("umc", g.ras_ue), ("gfx", 0), ("sdma", 0)):
        _write(base / "ras" / f"{block}_err_count", f"ue: {ue}\nce: 0\n")
    _symlink(root / amd.PCI_DEVICES / g.bus, f"../../../devices/{pci_path(g)}")
    _symlink(
        root / "sys/module/amdgpu/drivers/pci:amdgpu" / g.bus, f"../../../../devices/{pci_path(g)}"
    )


IDS = "# List of AMDGPU IDs (gpuwire simulated node: the products it simulates)\n\n1.0.0\n"


def write_node(root: str | os.PathLike[str], machine: AmdMachine) -> None:
    """Write the host root for `machine` under `root` (idempotent: files are replaced)."""
    root = Path(root)
    minors = Minors(machine)
    shutil.rmtree(root / amd.DRM_CLASS, ignore_errors=True)
    shutil.rmtree(root / "dev/dri", ignore_errors=True)
    bmc = "pci0000:00/0000:00:1c.0/0000:02:00.0"  # the BMC's VGA: a card without a render node
    _write(root / "sys/devices" / bmc / "vendor", "0x1a03\n")
    _drm_device(root, bmc, "card", BMC_CARD)
    for i, g in enumerate(machine.gpus):
        _write_pci(root, g)
        _drm_device(root, pci_path(g), "card", minors.card[(i, 0)])
        _drm_device(root, pci_path(g), "renderD", minors.render[(i, 0)])
        for (gpu, number), xcp in minors.xcp.items():
            if gpu == i:
                platform = f"platform/amdgpu_xcp_{xcp}"
                _drm_device(root, platform, "card", minors.card[(i, number)])
                _drm_device(root, platform, "renderD", minors.render[(i, number)])
    _write_topology(root, machine, minors)
    _write(root / amd.MODULE_VERSION, machine.driver_version + "\n")
    _write(root / "proc/sys/kernel/osrelease", "6.1.0-gpuwire-sim\n")
    _write(
        root / "proc/devices",
        "Character devices:\n  1 mem\n  5 /dev/tty\n"
        f"{amd.DRM_MAJOR} drm\n{KFD_MAJOR} {amd.KFD_MAJOR_NAME}\n\nBlock devices:\n  8 sd\n",
    )
    _char_device(root / "dev" / amd.KFD_NODE, KFD_MAJOR, 0)
    products = sorted({g.model for g in machine.gpus}, key=lambda m: m.device_id)
    ids = "".join(f"{m.device_id:04X},\t{m.revision:02X},\t{m.name}\n" for m in products)
    _write(root / amd.AMDGPU_IDS[0], IDS + ids)
    _write(root / MACHINE, machine.to_json())


MACHINE = "var/lib/gpuwire-sim/amd.json"


def check_root(root: str | os.PathLike[str]) -> None:
    """exits.CommandError, saying what to do, unless `root` holds a simulated AMD node."""
    if not Path(root, MACHINE).is_file():
        raise exits.CommandError(
            f"{root}: no simulated AMD node there ({MACHINE} is missing); "
            f"write one with gpuwire sim node {root} --vendor amd"
        )


def load_machine(root: str | os.PathLike[str]) -> AmdMachine:
    return AmdMachine.from_json(Path(root, MACHINE).read_text())


def print_node(machine: AmdMachine) -> None:
    for i, g in enumerate(machine.gpus):
        modes = f", {g.compute}/{g.memory}" if g.compute else ""
        hive = f", XGMI hive {g.hive_id:016x}" if g.hive_id else ""
        print(f"GPU {i}: {g.model.name} bus {g.bus} NUMA {g.numa_node}{modes}{hive}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`gpuwire sim node --vendor amd`'s own options."""
    group = parser.add_argument_group("AMD (--vendor amd)")
    group.add_argument(
        "--amd-product", choices=PRODUCTS, default=DEFAULT_PRODUCT,
        help="which AMD GPU (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--xgmi-hive", type=int, default=None, metavar="N",
        help="GPUs per XGMI hive (0: PCIe only; default: the product's largest)",
    )  # fmt: skip
    group.add_argument(
        "--compute-partition", choices=tuple(VALID_MODES), default="SPX",
        help="compute partition mode of a GPU that has them (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--memory-partition", choices=tuple(amd.MEMORY_PARTITIONS), default="NPS1",
        help="memory partition mode of a GPU that has them (default %(default)s)",
    )  # fmt: skip


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        machine = make_machine(
            8 if args.gpus is None else args.gpus,
            args.amd_product,
            args.xgmi_hive,
            args.compute_partition,
            args.memory_partition,
            args.seed,
        )
    except AmdSimError as exc:
        parser.error(str(exc))
    try:
        write_node(args.dir, machine)
    except OSError as exc:
        raise exits.CommandError(f"{args.dir}: cannot write the simulated node: {exc}") from None
    print_node(machine)
    if os.geteuid() != 0:
        print("not root: /dev/kfd and /dev/dri/* are placeholder files, not character devices")
    return 0
