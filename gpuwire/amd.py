"""Everything AMD-specific that more than one component must agree on: NVIDIA's sibling.

Env names and grammar, device nodes, the kernel's sysfs places and numbers, resource, label
and CDI names, and the product table's format. Sources: AMD's container toolkit
(ROCm/container-toolkit `internal/oci/oci.go`, `internal/cdi/cdi.go`: `AMD_VISIBLE_DEVICES`,
kind `amd.com/gpu`), AMD's device plugin and node labeller (ROCm/k8s-device-plugin
`docs/user-guide/configuration.md`, `cmd/k8s-node-labeller/main.go`), the kernel's KFD
(`drivers/gpu/drm/amd/amdkfd/kfd_topology.c`, `kfd_crat.h`) and amdgpu
(`Documentation/gpu/amdgpu/`), ROCm's docs ("GPU isolation techniques": `/dev/kfd` and the
render nodes; "ROCm environment variables"), and libdrm's `data/amdgpu.ids`.

There are no driver files: ROCm's user space (ROCr, HIP, the SMI libraries) lives in the
image, and a container needs only `/dev/kfd` and its GPUs' render nodes. Isolation is the
device cgroup: KFD lets a process use a GPU only where its cgroup allows `rw` on that GPU's
render node (`kfd_devcgroup_check_permission`), and ROCm enumerates only those GPUs. So
gpuwire writes no ROCm variable: `ROCR_VISIBLE_DEVICES` and `HIP_VISIBLE_DEVICES` narrow and
renumber what the cgroup allows (ROCr stops at the first bad token; set but empty means no
GPU), they are the pod author's to set, and docs/amd.md says why.
On the start path: no `re`, no `typing`, no dataclasses (see gpuwire.value).
"""

from __future__ import annotations

from gpuwire.devices import Device, Kind, Request, Selection, UnknownDevice, normalise_bus_id

VENDOR = "amd"
PCI_VENDOR = 0x1002
RESOURCE = "amd.com/gpu"
LABEL_PREFIX = "amd.com/"
BETA_LABEL_PREFIX = "beta.amd.com/"
CDI_KIND = "amd.com/gpu"

VISIBLE_DEVICES_ENV = "AMD_VISIBLE_DEVICES"  # AMD's container toolkit: which GPUs a container gets
ROCR_VISIBLE_DEVICES_ENV = "ROCR_VISIBLE_DEVICES"  # ROCr's own filter, left to the pod author
HIP_VISIBLE_DEVICES_ENV = "HIP_VISIBLE_DEVICES"  # HIP's, over what ROCr leaves

# Device nodes: /dev/kfd (one per host, major dynamic: /proc/devices `kfd`), and per GPU or
# partition /dev/dri/renderD<N> (DRM's major 226, render minors from 128) and card<N>.
KFD_NODE = "kfd"
KFD_MAJOR_NAME = "kfd"
DRM_MAJOR = 226
RENDER_MINOR_BASE = 128

# sysfs, relative to the sys root
KFD_TOPOLOGY = "sys/class/kfd/kfd/topology"
DRM_CLASS = "sys/class/drm"
PCI_DEVICES = "sys/bus/pci/devices"
MODULE_VERSION = "sys/module/amdgpu/version"
# Where distributions and ROCm keep libdrm's product table, relative to the root.
AMDGPU_IDS = ("usr/share/libdrm/amdgpu.ids", "opt/amdgpu/share/libdrm/amdgpu.ids")

# KFD io_link types (kfd_crat.h CRAT_IOLINK_TYPE_*): the two gpuwire tells apart.
LINK_PCIE = 2
LINK_XGMI = 11

# Compute and memory partition modes as amdgpu's sysfs spells them (current_compute_partition,
# current_memory_partition), each with how many partitions it makes of a GPU.
COMPUTE_PARTITIONS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
MEMORY_PARTITIONS = {"NPS1": 1, "NPS2": 2, "NPS4": 4, "NPS8": 8}


def partition_type(compute: str, memory: str) -> str:
    """AMD's name of a partition type: `<compute>_<memory>` in lower case (`cpx_nps4`), the
    device plugin's resource under its `mixed` naming and the labeller's value."""
    return f"{compute}_{memory}".lower()


def uuid(unique_id: int) -> str:
    """A GPU's name as ROCm prints it (`rocminfo` Uuid, `ROCR_VISIBLE_DEVICES`): `GPU-` and
    the 16 hex digits of KFD's `unique_id`."""
    return f"GPU-{unique_id:016x}"


def uuid_of(entry: str) -> str | None:
    """The `GPU-<hex>` an AMD_VISIBLE_DEVICES entry names by unique id: ROCm's `GPU-<hex>`
    (gpuwire's partition names keep their `-p<n>`), or as AMD's toolkit reads one, `0x<hex>`
    or bare hex of more than 8 digits; None where the entry is no unique id."""
    lowered = entry.lower()
    if lowered.startswith("gpu-"):
        head, _, part = lowered[4:].partition("-p")
        return f"GPU-{lowered[4:]}" if _is_hex(head) and (not part or part.isdigit()) else None
    if lowered.startswith("0x"):
        digits = lowered[2:]
    elif len(lowered) > 8:
        digits = lowered
    else:
        return None
    return uuid(int(digits, 16)) if _is_hex(digits) and len(digits) <= 16 else None


_HEX = frozenset("0123456789abcdef")


def _is_hex(text: str) -> bool:
    return len(text) > 0 and set(text) <= _HEX


def parse_request(value: str | None) -> Request:
    """AMD_VISIBLE_DEVICES → what it asks for. As AMD's toolkit: `all` in any case, indices,
    ranges (`0-3`, expanded here), unique ids; unlike it, a bad entry is not dropped but kept,
    for selection to refuse, and `void` and `none` mean what they mean for NVIDIA (not a GPU
    container; a GPU container without a GPU), with NVIDIA's precedence."""
    entries = [e.strip() for e in (value or "").split(",") if e.strip()]
    if not entries or "void" in entries:
        return Request(Kind.VOID)
    if "none" in entries:
        return Request(Kind.NONE)
    if any(e.lower() == "all" for e in entries):
        return Request(Kind.ALL)
    out: list[str] = []
    for entry in entries:
        first, dash, last = entry.partition("-")
        if dash and first.isdigit() and last.isdigit() and int(first) <= int(last):
            out += [str(i) for i in range(int(first), int(last) + 1)]
        else:
            out.append(entry)
    return Request(Kind.LIST, tuple(out))


# -- libdrm's product table ---------------------------------------------------------------


def parse_ids(text: str) -> dict[tuple[int, int], str]:
    """libdrm's `amdgpu.ids` (`# comments`, a version line, then `DEVICE_ID,\\tREVISION,\\tNAME`
    in upper-case hex) → (device id, revision) → marketing name. Lines of another shape are
    skipped, as libdrm's parser skips them."""
    names: dict[tuple[int, int], str] = {}
    for line in text.splitlines():
        device, sep, rest = line.partition(",")
        revision, sep2, name = rest.partition(",")
        try:
            key = (int(device.strip(), 16), int(revision.strip(), 16))
        except ValueError:
            continue
        if sep and sep2 and name.strip():
            names.setdefault(key, name.strip())
    return names


def product_name(names: dict[tuple[int, int], str], device: int, revision: int | None) -> str:
    """The marketing name of a device id and revision as libdrm looks it up; without the
    revision (a KFD capture has none), the name all of the id's entries agree on; else
    `AMD GPU <id>`, so that a product is never empty."""
    if revision is not None and (device, revision) in names:
        return names[(device, revision)]
    found = {n for (d, _), n in names.items() if d == device}
    return found.pop() if len(found) == 1 else f"AMD GPU {device:04x}"


# -- AMD's labeller's spellings -----------------------------------------------------------


def family(gfx_target_version: int) -> str:
    """amdgpu's family of a discrete GPU's GFX version, as the node labeller names it (the
    kernel's AMDGPU_FAMILY_*: AI for GFX9, NV for GFX10, GC_11_0_0 for GFX11, GC_12_0_0
    for GFX12); `unknown` for others (APUs have families of their own)."""
    major = gfx_target_version // 10000
    return {9: "AI", 10: "NV", 11: "GC_11_0_0", 12: "GC_12_0_0"}.get(major, "unknown")


def gfx_name(gfx_target_version: int) -> str:
    """`gfx942` for 90402: major in decimal, minor and stepping as hex digits (KFD packs
    major·10000 + minor·100 + stepping)."""
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def label_value(text: str) -> str:
    """A product name as the labeller writes it: spaces to `_`, parentheses dropped
    (`AMD Instinct MI300X` → `AMD_Instinct_MI300X`)."""
    return text.replace("(", "").replace(")", "").replace(" ", "_")


# -- selection ------------------------------------------------------------------------------


def select(request: Request, devices: tuple[Device, ...]) -> Selection:
    """The devices (GPUs and partitions) an AMD_VISIBLE_DEVICES request selects, in request
    order, each once: by index, by unique id (`uuid_of`'s spellings), or by PCI bus id (every
    device of that GPU: all its partitions). UnknownDevice names an entry this node does not
    have, and what it has: a start fails rather than run with fewer GPUs."""
    if request.kind is Kind.ALL:
        return Selection(devices)
    if request.kind is not Kind.LIST:
        return Selection()
    by_uuid = {d.uuid: d for d in devices}
    chosen: dict[str, Device] = {}
    for entry in request.entries:
        uuid = uuid_of(entry)
        bus = normalise_bus_id(entry) if uuid is None and not entry.isdigit() else None
        if entry.isdigit():
            found = [d for d in devices if d.index == int(entry)]
        elif uuid is not None:
            found = [by_uuid[uuid]] if uuid in by_uuid else []
        else:
            found = [d for d in devices if bus is not None and d.pci_bus_id == bus]
        if not found:
            have = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "no GPUs"
            raise UnknownDevice(f"unknown device {entry!r}: this node has {have}")
        for d in found:
            chosen.setdefault(d.uuid, d)
    return Selection(tuple(chosen.values()))
