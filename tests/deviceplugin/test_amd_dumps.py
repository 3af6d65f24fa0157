"""AMD discovery replayed against real KFD topology dumps: what a user would see of each.

The dumps (`amd_dumps/<name>/`, each with its README naming its public source file by file)
are what AMD's device plugin tests itself against, captured on real machines: eight MI210 in
two XGMI hives, an MI300X and an MI308X in CPX mode (one KFD node per partition), and a Vega 10
on an older kernel. Each is laid out as a sysfs root and read through the device plugin's
discovery (`deviceplugin.gpus.amd.AmdDiscovery`), as on a node.

A KFD dump is the topology only. What discovery also reads elsewhere is added, and only from
the dump's own facts (`_node_around`):

- `/dev/dri/renderD<N>` for each `drm_render_minor` the dump names, `/dev/kfd` and
  `/proc/devices`' `kfd` line (else every device is reported missing, not the dump's fault);
- each GPU's PCI device, `sys/bus/pci/devices/<bus>/numa_node`: the CPU node its PCIe
  `io_link` goes to (KFD makes one CPU node per NUMA node); nothing else of PCI (no
  `revision`, no partition modes: the dumps do not record them);
- libdrm's product table, the lines for these device ids (`amd_dumps/amdgpu.ids`).

No DRM class is added: the dumps have no card numbers, so no device has a card node.

The expected values are read by hand from the dumps' text, written here as the dump spells
them (decimal `location_id`, `unique_id`, `hive_id`), and turned into what a user reads by
the kernel's and ROCm's rules, not by gpuwire's code: bus = `location_id >> 8` (its low byte
is devfn, which on a partitioned GPU carries the partition number), UUID = `GPU-` and the
16 hex digits of `unique_id`, compute units = `simd_count / simd_per_cu`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from deviceplugin.gpus.amd import AmdDiscovery, AmdNodeGpus
from deviceplugin.plugin import amdresources
from gpuwire import amd, amdsim, kfd
from gpuwire.roots import Roots

DUMPS = Path(__file__).parent / "amd_dumps"
NODES = Path(amd.KFD_TOPOLOGY) / "nodes"


def _properties(path: Path) -> dict[str, int]:
    """A dump's `key value` lines, read here rather than by the code under test."""
    pairs = (line.split() for line in path.read_text().splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _node_around(root: Path) -> None:
    """Add to a dump laid out under `root` what discovery reads beyond KFD's topology, from
    the dump's own facts only (the module's docstring)."""
    numa: dict[str, int] = {}
    for node in sorted((root / NODES).iterdir()):
        p = _properties(node / "properties")
        if not p.get("simd_count"):
            continue
        render = p.get("drm_render_minor", 0)
        if render:
            (root / "dev/dri").mkdir(parents=True, exist_ok=True)
            (root / f"dev/dri/renderD{render}").write_bytes(b"")
        bus = f"{p.get('domain', 0):04x}:{p['location_id'] >> 8:02x}:00.0"
        links = [_properties(f) for f in sorted(node.glob("io_links/*/properties"))]
        pcie = [ln["node_to"] for ln in links if ln["type"] == amd.LINK_PCIE]
        if pcie and bus not in numa:
            numa[bus] = pcie[0]
    for bus, cpu in numa.items():
        pci = root / amd.PCI_DEVICES / bus
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{cpu}\n")
    (root / "dev" / amd.KFD_NODE).write_bytes(b"")
    (root / "proc").mkdir()
    (root / "proc/devices").write_text(f"Character devices:\n226 drm\n511 {amd.KFD_MAJOR_NAME}\n")
    ids = root / amd.AMDGPU_IDS[0]
    ids.parent.mkdir(parents=True)
    shutil.copy(DUMPS / "amdgpu.ids", ids)


def replayed(tmp_path: Path, name: str) -> AmdNodeGpus:
    root = tmp_path / name
    shutil.copytree(DUMPS / name / "sys", root / "sys")
    _node_around(root)
    return AmdDiscovery(str(root)).discover()


def facts(node: AmdNodeGpus) -> list[tuple[object, ...]]:
    """Per device, in discovery's order: KFD node, bus, product, CUs, UUID, NUMA, render."""
    return [
        (
            g.node,
            g.device.pci_bus_id,
            g.device.product,
            g.compute_units,
            g.device.uuid,
            g.device.numa_node,
            g.device.minor,
        )
        for g in node.kfd.gpus
    ]


def uuid(unique_id: int) -> str:
    return f"GPU-{unique_id:016x}"  # ROCm's spelling (rocminfo's Uuid)


# -- eight MI210, two XGMI hives of four -------------------------------------------------------

MI210 = "AMD Instinct MI210"  # device_id 29711 = 0x740f, libdrm's one entry for it
# node: (location_id, unique_id, drm_render_minor), from nodes/<n>/properties
MI210_NODES = {
    2: (25344, 1801979520617338022, 128),
    3: (17152, 5847760019078012339, 129),
    4: (768, 10645161697164847644, 130),
    5: (9728, 4847253685048710349, 131),
    6: (58112, 12585367064092601175, 132),
    7: (49920, 11779194899033552202, 133),
    8: (33536, 17888023871577450191, 134),
    9: (41728, 14073402507705256557, 135),
}
HIVE_A, HIVE_B = 12609507387757274807, 18091350218769748594  # nodes 2-5, nodes 6-9


def test_eight_mi210_in_two_xgmi_hives(tmp_path: Path) -> None:
    found = replayed(tmp_path, "mi210-xgmi-pcie")
    # CPU nodes 0 and 1 (simd_count 0, 64 cores each) are no GPUs; numbered by bus id
    by_bus = sorted(MI210_NODES, key=lambda n: MI210_NODES[n][0])
    assert by_bus == [4, 5, 3, 2, 8, 9, 7, 6]
    # io_links/0: nodes 2-5 hang off CPU node 0, nodes 6-9 off CPU node 1
    numa = {n: 0 if n <= 5 else 1 for n in MI210_NODES}
    assert facts(found) == [
        (
            n,
            f"0000:{MI210_NODES[n][0] >> 8:02x}:00.0",
            MI210,
            416 // 4,
            uuid(MI210_NODES[n][1]),
            numa[n],
            MI210_NODES[n][2],
        )
        for n in by_bus
    ]
    assert [d.pci_bus_id for d in found.devices][:4] == [
        "0000:03:00.0", "0000:26:00.0", "0000:43:00.0", "0000:63:00.0"
    ]  # fmt: skip
    gpus = found.kfd.gpus
    assert [g.hive_id for g in gpus] == [HIVE_A] * 4 + [HIVE_B] * 4
    # io_links/1-3 of each: XGMI (type 11, weight 15) to the three others of its hive only
    index = {g.node: i for i, g in enumerate(gpus)}
    for g in gpus:
        hive = {2, 3, 4, 5} if g.node <= 5 else {6, 7, 8, 9}
        assert g.device.nvlinks == tuple(sorted((index[n], 1) for n in hive - {g.node}))
        xgmi = [(ln.node_to, ln.weight) for ln in g.links if ln.type == amd.LINK_XGMI]
        assert sorted(xgmi) == [(n, 15) for n in sorted(hive - {g.node})]
    assert {(g.parent, g.partition_type, g.healthy) for g in gpus} == {("", "", True)}
    assert {g.device.memory_mib for g in gpus} == {0}  # the dump has no mem_banks files
    assert {amd.gfx_name(g.gfx_target_version) for g in gpus} == {"gfx90a"}  # 90010
    assert amdresources.names(found.kfd, "single") == {d.uuid: "amd.com/gpu" for d in found.devices}


# -- MI300X and MI308X in CPX: a KFD node per partition ------------------------------------------


def test_an_mi300x_in_cpx_is_eight_partitions_of_one_gpu(tmp_path: Path) -> None:
    found = replayed(tmp_path, "mi300x-cpx")
    gpu = uuid(16404946649897475633)  # every partition's unique_id (this kernel's: the GPU's)
    # location_id 1280..1287: bus 0x05, the partition number in devfn's low bits
    assert facts(found) == [
        (2 + p, "0000:05:00.0", "AMD Instinct MI300X", 152 // 4, f"{gpu}-p{p}", 0, 128 + p)
        for p in range(8)
    ]
    gpus = found.kfd.gpus
    assert [(g.parent, g.partition) for g in gpus] == [(gpu, p) for p in range(8)]
    assert {g.hive_id for g in gpus} == {15188982192727901047}
    first = gpus[0]
    # node 2: XGMI of weight 13 to its seven siblings, 41 to other GPUs' partitions
    # (nodes 10 and 64, not kept), PCIe to CPU node 0
    assert [(ln.node_to, ln.type, ln.weight) for ln in first.links] == [
        (0, amd.LINK_PCIE, 20),
        *[(n, amd.LINK_XGMI, 13) for n in range(3, 10)],
        (10, amd.LINK_XGMI, 41),
        (64, amd.LINK_XGMI, 41),
    ]
    assert first.device.nvlinks == tuple((i, 1) for i in range(1, 8))
    # the dump records no partition mode (a PCI attribute): partitions without a type
    assert {(g.compute_partition, g.partition_type, g.healthy) for g in gpus} == {("", "", True)}


def test_mi308x_partitions_keep_to_their_gpu(tmp_path: Path) -> None:
    found = replayed(tmp_path, "mi308x-cpx")
    first, second = uuid(598046273873802902), uuid(11803749423592941193)
    # nodes 2-5: location_id 2560..2563 (bus 0x0a), render 128-131; nodes 6-9: 32768..32771
    # (bus 0x80), render 136-139 (132-135 are the first GPU's idle partition devices)
    assert facts(found) == [
        *[(2 + p, "0000:0a:00.0", "AMD Instinct MI308X", 20, f"{first}-p{p}", 0, 128 + p)
          for p in range(4)],
        *[(6 + p, "0000:80:00.0", "AMD Instinct MI308X", 20, f"{second}-p{p}", 0, 136 + p)
          for p in range(4)],
    ]  # fmt: skip
    gpus = found.kfd.gpus
    assert [g.parent for g in gpus] == [first] * 4 + [second] * 4
    assert [g.partition for g in gpus] == [0, 1, 2, 3] * 2
    # node 2: XGMI weight 13 to siblings 3 and 4, 41 to node 6 (the next GPU's first partition)
    assert [(ln.node_to, ln.weight) for ln in gpus[0].links if ln.type == amd.LINK_XGMI] == [
        (3, 13), (4, 13), (6, 41)
    ]  # fmt: skip
    assert gpus[0].device.nvlinks == ((1, 1), (2, 1), (4, 1))
    # one resource for the eight partitions: no partition type without the mode files
    assert set(amdresources.names(found.kfd, "single").values()) == {"amd.com/gpu"}


# -- an older kernel's Vega 10 ---------------------------------------------------------------------


def test_a_vega10_on_an_older_kernel_is_a_healthy_gpu(tmp_path: Path) -> None:
    """This kernel prints no `gfx_target_version` (nor `domain`, `hive_id`): before the
    replay, discovery took the missing key for a version of 0 and called the GPU unusable
    ("KFD reports no GFX version"), so the plugin advertised it unhealthy."""
    found = replayed(tmp_path, "vega10-old-kernel")
    # node 1: device_id 26720 = 0x6860, location_id 6400 = 0x1900, simd_count 256 / 4,
    # mem_banks/0 heap_type 1 size_in_bytes 17163091968 (= local_mem_size), CPU node 0
    assert facts(found) == [
        (1, "0000:19:00.0", "AMD GPU 6860", 64, uuid(14073402507705256556), 0, 128)
    ]
    assert found.devices[0].memory_mib == 17163091968 // (1 << 20) == 16368
    (gpu,) = found.kfd.gpus
    assert (gpu.gfx_target_version, gpu.hive_id, gpu.problem) == (0, 0, "")
    # libdrm names four products for 0x6860 by PCI revision, which a KFD dump lacks
    assert gpu.revision == -1


def test_a_gpu_kfd_reports_at_gfx_version_0_stays_unusable(tmp_path: Path) -> None:
    root = tmp_path / "mi210"
    shutil.copytree(DUMPS / "mi210-xgmi-pcie/sys", root / "sys")
    properties = root / NODES / "2/properties"
    properties.write_text(
        properties.read_text().replace("gfx_target_version 90010", "gfx_target_version 0")
    )
    _node_around(root)
    problems = [g.problem for g in kfd.discover(Roots(str(root))).gpus]
    assert problems.count("KFD reports no GFX version") == 1


def test_the_simulated_node_links_partitions_as_the_captures_do(tmp_path: Path) -> None:
    """The sim's CPX MI300X against the captures above: XGMI of weight 13 between the
    partitions of one GPU, 41 to another GPU's, PCIe of weight 20 to the CPU."""
    amdsim.write_node(tmp_path, amdsim.make_machine(2, "MI300X", compute="CPX"))
    first = kfd.discover(Roots(str(tmp_path))).gpus[0]
    weights = {(ln.type, ln.weight) for ln in first.links}
    assert weights == {(amd.LINK_PCIE, 20), (amd.LINK_XGMI, 13), (amd.LINK_XGMI, 41)}
    siblings = [ln for ln in first.links if ln.weight == 13]
    assert len(siblings) == 7
