"""MIG on a node as procfs shows it, and the MIG map that names its MIG devices.

While GPU instance G of the GPU whose minor is N exists, the kernel module lists
`/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access`, and compute instance C of it
`…/gi<G>/ci<C>/access`; each such file says `DeviceFileMinor: <minor>`, the minor of
`/dev/nvidia-caps/nvidia-cap<minor>`, whose major is `nvidia-caps` in /proc/devices
(NVIDIA/open-gpu-kernel-modules `kernel-open/nvidia/nv-caps.c`; NVIDIA MIG user guide,
"Device Nodes and Capabilities"). `mig/config` and `mig/monitor` are the capabilities to
change MIG and to see all of it. NVIDIA's tools read the minors the same way
(NVIDIA/k8s-device-plugin `internal/rm/nvml_devices.go`, NVIDIA/nvidia-container-toolkit
`internal/nvcaps/nvcaps.go`), never computing them.

procfs does not say what a MIG device is called: its UUID (`MIG-<uuid>` on current
drivers), profile and memory are NVML's. The node agent, which reads NVML, writes them with
the instances it saw into the **MIG map**; the node side, which never loads NVML on a
container start, takes names from it only for a GPU whose instances in procfs are exactly
those of the map. A map written before a MIG change therefore names nothing on that GPU
rather than the wrong instance.
"""

from __future__ import annotations

import os

from gpuwire import lightjson, nvidia
from gpuwire.devices import Device, MigDevice

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

DEFAULT_MAP = "/run/gpuwire/mig/devices"  # a directory of its own: the node agent mounts it
CAPS_MAJOR_NAME = "nvidia-caps"
CONTROLS = ("config", "monitor")
_MINOR = "DeviceFileMinor"

Names = dict[str, dict[tuple[int, int], tuple[str, str, int, int]]]


class MigError(ValueError):
    """A capability file or MIG map that cannot be read; the message names it."""


def cap_name(minor: int) -> str:
    """A capability's device node under /dev."""
    return f"nvidia-caps/nvidia-cap{minor}"


def parse_capability(text: str, source: str = "capability") -> int:
    """The minor of a capability file (`DeviceFileMinor: 13`; lines split at the first
    colon, as NVIDIA's tools read them)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == _MINOR and value.strip().isdigit():
            return int(value.strip())
    raise MigError(f"{source}: no {_MINOR} line")


def _minor(path: str) -> int:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_capability(f.read(), path)
    except OSError as exc:
        raise MigError(f"cannot read {path}: {exc.strerror}") from None


def _ids(directory: str, prefix: str) -> list[int]:
    """The N of `<prefix><N>` entries of a directory, sorted; none if it does not exist."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    return sorted(int(n) for n in found if n.isdigit())


def read_instances(proc_root: str, devices: Iterable[Device]) -> tuple[MigDevice, ...]:
    """Every compute instance procfs lists, by GPU index, GI and CI (unnamed: see
    `identify`)."""
    base = f"{proc_root}/{nvidia.PROC_CAPABILITIES}"
    found = []
    for d in devices:
        mig = f"{base}/gpu{d.minor}/mig"
        for gi in _ids(mig, "gi"):
            gi_dir = f"{mig}/gi{gi}"
            gi_cap = _minor(f"{gi_dir}/access")
            for ci in _ids(gi_dir, "ci"):
                ci_cap = _minor(f"{gi_dir}/ci{ci}/access")
                found.append(MigDevice(d.uuid, d.index, d.minor, gi, ci, gi_cap, ci_cap))
    return tuple(found)


def read_controls(proc_root: str) -> dict[str, int]:
    """The minors of `mig/config` and `mig/monitor`, where the driver has them."""
    base = f"{proc_root}/{nvidia.PROC_CAPABILITIES}/mig"
    return {name: _minor(f"{base}/{name}") for name in CONTROLS if os.path.exists(f"{base}/{name}")}


def layout(devices: Iterable[MigDevice]) -> tuple[tuple[str, int, int], ...]:
    """(parent UUID, GI, CI) of each: what changes when instances are created or destroyed."""
    return tuple(sorted((m.parent_uuid, m.gi, m.ci) for m in devices))


# -- the MIG map ---------------------------------------------------------------------------


def encode_map(devices: Iterable[MigDevice]) -> bytes:
    """The MIG map: one entry per MIG device the node agent found through NVML."""
    entries = [
        {
            "parent": m.parent_uuid,
            "gi": m.gi,
            "ci": m.ci,
            "uuid": m.uuid,
            "profile": m.profile,
            "memory_mib": m.memory_mib,
            "slices": m.slices,
        }
        for m in sorted(devices, key=lambda m: (m.parent_uuid, m.gi, m.ci))
    ]
    return lightjson.dumps({"v": 1, "mig": entries}).encode()


def decode_map(data: bytes, source: str = "MIG map") -> Names:
    """parent UUID → (GI, CI) → (UUID, profile, MiB, slices); MigError if it is not a map."""
    try:
        raw = lightjson.loads(data)
        if not isinstance(raw, dict) or raw.get("v") != 1:
            raise TypeError("not a version 1 MIG map")
        names: Names = {}
        for e in raw["mig"]:
            ids = (int(e["gi"]), int(e["ci"]))
            named = (str(e["uuid"]), str(e["profile"]), int(e["memory_mib"]), int(e["slices"]))
            names.setdefault(str(e["parent"]), {})[ids] = named
        return names
    except (ValueError, TypeError, KeyError) as exc:
        raise MigError(f"{source}: {exc}") from None


def write_map(path: str, devices: Iterable[MigDevice]) -> bool:
    """Make the map at `path` list `devices` (the node agent's, from NVML); whether it
    changed. A node that has no MIG device and no map gets none."""
    from gpuwire import atomicfile

    devices = tuple(devices)
    data = encode_map(devices)
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        if not devices:
            return False
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    atomicfile.replace(path, data, 0o644)
    return True


def read_map(path: str) -> Names:
    """The map at `path`; none if the node agent has not written one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise MigError(f"cannot read the MIG map {path}: {exc.strerror}") from None
    return decode_map(data, path)


def identify(devices: tuple[MigDevice, ...], names: Names) -> tuple[MigDevice, ...]:
    """`devices` with the map's names, on each GPU whose instances the map lists exactly."""
    present: dict[str, set[tuple[int, int]]] = {}
    for m in devices:
        present.setdefault(m.parent_uuid, set()).add((m.gi, m.ci))
    out = []
    for m in devices:
        known = names.get(m.parent_uuid, {})
        if set(known) == present[m.parent_uuid]:
            m = m.identified(*known[(m.gi, m.ci)])
        out.append(m)
    return tuple(out)


# -- profile names (NVIDIA/go-nvlib `pkg/nvlib/device/mig_profile.go`) ---------------------

# GPU instance profile enums (nvml.h GPU_INSTANCE_PROFILE_*) whose names carry an attribute.
SUFFIXES = {0x7: "+me", 0x8: "+me", 0xA: "+gfx", 0xB: "+gfx", 0xC: "+gfx", 0x11: "+gfx"}
SUFFIXES |= {0xD: "-me", 0xE: "-me", 0xF: "+me.all", 0x10: "+me.all"}


def memory_gb(total_mib: int, mig_mib: int) -> int:
    """A MIG device's GB in its profile name: its share of the GPU rounded up to eighths,
    times the GPU's GiB rounded up, rounded half up (go-nvlib's `getMigMemorySizeGB`)."""
    eighths = -(-mig_mib * 8 // total_mib)
    total_gib = -(-total_mib // 1024)
    return (eighths * total_gib * 2 + 8) // 16


def profile_name(gi_slices: int, ci_slices: int, gb: int, suffix: str = "") -> str:
    """`1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`: a compute instance smaller than its GPU
    instance is named for both."""
    size = f"{gi_slices}g.{gb}gb{suffix}"
    return size if ci_slices == gi_slices else f"{ci_slices}c.{size}"
