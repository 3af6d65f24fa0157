"""The device model and NVIDIA_VISIBLE_DEVICES semantics, shared by every component.

A request string selects devices the way libnvidia-container does (NVIDIA's container
toolkit docs, "Specialized Configurations with Docker", `NVIDIA_VISIBLE_DEVICES`;
NVIDIA/nvidia-container-toolkit `cmd/nvidia-container-runtime/README.md`; `select_devices`
in NVIDIA/libnvidia-container `src/cli/common.c`): `void`/empty/unset is not a GPU
container, `none` is a GPU container with no GPU, `all` is every GPU and every MIG device,
otherwise a list of GPU indices, UUIDs or PCI bus ids, and MIG devices (`MigDevice`) by
UUID (`MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`) or as `<gpu>:<gi>:<ci>`.
The types are `gpuwire.value` values: this module is on the container-start path.
"""

from __future__ import annotations

from gpuwire.value import Choice, Value


class Device(Value):
    """One GPU as discovery (procfs, NVML or the simulated node) reports it."""

    __slots__ = _fields = (
        "index",
        "minor",
        "uuid",
        "pci_bus_id",
        "product",
        "memory_mib",
        "numa_node",
        "nvlinks",
    )
    index: int
    minor: int
    uuid: str
    pci_bus_id: str  # 0000:07:00.0
    product: str  # NVIDIA A100-SXM4-80GB
    memory_mib: int  # 0 where the source does not say (procfs)
    numa_node: int  # -1: unknown
    nvlinks: tuple[tuple[int, int], ...]  # (peer index, link count)

    def __init__(
        self,
        index: int,
        minor: int,
        uuid: str,
        pci_bus_id: str,
        product: str,
        memory_mib: int = 0,
        numa_node: int = -1,
        nvlinks: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self._set(
            index=index,
            minor=minor,
            uuid=uuid,
            pci_bus_id=pci_bus_id,
            product=product,
            memory_mib=memory_mib,
            numa_node=numa_node,
            nvlinks=nvlinks,
        )

    def links_to(self, peer: int) -> int:
        return sum(count for index, count in self.nvlinks if index == peer)


class CharDevice:
    """A device node: its name under /dev, its numbers, and its path under the dev root."""

    __slots__ = ("host_path", "major", "minor", "name")

    def __init__(self, name: str, major: int, minor: int, host_path: str) -> None:
        self.name = name
        self.major = major
        self.minor = minor
        self.host_path = host_path

    def __repr__(self) -> str:
        return f"CharDevice({self.name!r}, {self.major}, {self.minor})"


class MigDevice(Value):
    """A Multi-Instance GPU device: compute instance `ci` of GPU instance `gi` of a parent
    GPU, with the two capability device nodes (`/dev/nvidia-caps/nvidia-cap<minor>`) that
    give access to it (NVIDIA MIG user guide, "Device Nodes and Capabilities").

    procfs says that it exists and its capability minors; its UUID, profile, memory and
    slices come from NVML (the device plugin), or on the node side from the MIG map
    (`gpuwire.mig`): "" and 0 where nothing said.
    """

    __slots__ = _fields = (
        "parent_uuid",
        "parent_index",
        "parent_minor",
        "gi",
        "ci",
        "gi_cap",
        "ci_cap",
        "uuid",
        "profile",
        "memory_mib",
        "slices",
    )
    parent_uuid: str
    parent_index: int
    parent_minor: int
    gi: int  # GPU instance id, unique per GPU
    ci: int  # compute instance id, unique per GPU instance
    gi_cap: int  # minor of the GPU instance's access capability
    ci_cap: int  # minor of the compute instance's access capability
    uuid: str  # MIG-<uuid>, "" where unknown
    profile: str  # 1g.10gb, 3g.40gb, 1c.3g.40gb, 1g.10gb+me; "" where unknown
    memory_mib: int
    slices: int  # the GPU instance's compute slices (the G of the profile)

    def __init__(
        self,
        parent_uuid: str,
        parent_index: int,
        parent_minor: int,
        gi: int,
        ci: int,
        gi_cap: int,
        ci_cap: int,
        uuid: str = "",
        profile: str = "",
        memory_mib: int = 0,
        slices: int = 0,
    ) -> None:
        self._set(
            parent_uuid=parent_uuid,
            parent_index=parent_index,
            parent_minor=parent_minor,
            gi=gi,
            ci=ci,
            gi_cap=gi_cap,
            ci_cap=ci_cap,
            uuid=uuid,
            profile=profile,
            memory_mib=memory_mib,
            slices=slices,
        )

    @property
    def legacy_uuid(self) -> str:
        """`MIG-GPU-<parent uuid>/<gi>/<ci>`: the MIG UUID of drivers before R470, which
        NVML still accepts, and the name procfs alone can give."""
        return f"MIG-{self.parent_uuid}/{self.gi}/{self.ci}"

    @property
    def name(self) -> str:
        """How gpuwire names it: its UUID, else the older form."""
        return self.uuid or self.legacy_uuid

    @property
    def place(self) -> str:
        """`<gpu index>:<gi>:<ci>`."""
        return f"{self.parent_index}:{self.gi}:{self.ci}"

    def identified(self, uuid: str, profile: str, memory_mib: int, slices: int) -> MigDevice:
        """This device with what NVML says of it."""
        return MigDevice(
            self.parent_uuid,
            self.parent_index,
            self.parent_minor,
            self.gi,
            self.ci,
            self.gi_cap,
            self.ci_cap,
            uuid,
            profile,
            memory_mib,
            slices,
        )


class Kind(Choice):
    __slots__ = ()
    VOID: Kind  # not a GPU container: inject nothing
    NONE: Kind  # driver files and control devices, no GPU
    ALL: Kind
    LIST: Kind


Kind.VOID, Kind.NONE, Kind.ALL, Kind.LIST = (
    Kind(name, name.lower()) for name in ("VOID", "NONE", "ALL", "LIST")
)


class Request(Value):
    __slots__ = _fields = ("kind", "entries")
    kind: Kind
    entries: tuple[str, ...]

    def __init__(self, kind: Kind, entries: tuple[str, ...] = ()) -> None:
        self._set(kind=kind, entries=entries)

    def canonical(self) -> str:
        """The form a grant signs: the kind, or the sorted unique entries."""
        if self.kind is Kind.LIST:
            return ",".join(sorted(set(self.entries)))
        return str(self.kind.value)


def parse_request(value: str | None) -> Request:
    """NVIDIA_VISIBLE_DEVICES → what it asks for, with the toolkit's precedence where a list
    mixes the special values with devices: void, then none, then all (`NewVisibleDevices`,
    internal/config/image/devices.go of NVIDIA/nvidia-container-toolkit). `void` and `none`
    are exact words; `all` in any case, as libnvidia-container matches the device list."""
    entries = tuple(e.strip() for e in (value or "").split(",") if e.strip())
    if not entries or "void" in entries:
        return Request(Kind.VOID)
    if "none" in entries:
        return Request(Kind.NONE)
    if any(e.lower() == "all" for e in entries):
        return Request(Kind.ALL)
    return Request(Kind.LIST, entries)


class UnknownDevice(LookupError):
    """A requested device that this node does not have."""


class Selection(Value):
    """What a request selects: whole GPUs, and MIG devices named on their own (a whole GPU
    comes with every MIG device it has; those are not repeated here)."""

    __slots__ = _fields = ("gpus", "mig")
    gpus: tuple[Device, ...]
    mig: tuple[MigDevice, ...]

    def __init__(self, gpus: tuple[Device, ...] = (), mig: tuple[MigDevice, ...] = ()) -> None:
        self._set(gpus=gpus, mig=mig)

    def names(self) -> tuple[str, ...]:
        """NVIDIA_VISIBLE_DEVICES as granted: GPU UUIDs, then MIG device names."""
        return tuple(d.uuid for d in self.gpus) + tuple(m.name for m in self.mig)


_HEX = frozenset("0123456789abcdefABCDEF")


def _hex(text: str, longest: int) -> bool:
    return 0 < len(text) <= longest and all(c in _HEX for c in text)


def normalise_bus_id(value: str) -> str | None:
    """`7:0.0`, `07:00.0`, `00000000:07:00.0` → `0000:07:00.0`; None if not a bus id."""
    head, dot, fn = value.rpartition(".")
    parts = head.split(":")
    if not dot or len(fn) != 1 or fn not in "01234567" or len(parts) not in (2, 3):
        return None
    domain, bus, dev = ["0", *parts] if len(parts) == 2 else parts
    if not (_hex(domain, 8) and _hex(bus, 2) and _hex(dev, 2)):
        return None
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def is_mig_entry(entry: str) -> bool:
    """Whether an NVIDIA_VISIBLE_DEVICES entry names a MIG device: `MIG-<uuid>` (or the
    legacy `MIG-GPU-<uuid>/<gi>/<ci>`), `<gpu>:<gi>:<ci>` or `<gpu>:<mig index>` (a bus id
    has a colon too, and a dot)."""
    return entry.lower().startswith("mig-") or (":" in entry and "." not in entry)


def select(
    request: Request,
    devices: list[Device] | tuple[Device, ...],
    mig: tuple[MigDevice, ...] = (),
) -> Selection:
    """The GPUs and MIG devices a request selects, in request order, each once.

    Raises UnknownDevice naming the entry and what the node has, as a container start must
    fail rather than silently start with fewer GPUs.
    """
    if request.kind is Kind.ALL:
        return Selection(tuple(devices), ())
    if request.kind is not Kind.LIST:
        return Selection()
    by_uuid = {d.uuid.lower(): d for d in devices}
    by_bus = {normalise_bus_id(d.pci_bus_id): d for d in devices}
    by_index = {str(d.index): d for d in devices}
    mig_by_name = {n.lower(): m for m in mig for n in (m.uuid, m.legacy_uuid, m.place) if n}
    gpus: dict[str, Device] = {}
    chosen: dict[str, MigDevice] = {}
    for entry in request.entries:
        lowered = entry.lower()
        if is_mig_entry(entry):
            found = mig_by_name.get(lowered)
            if found is None:
                raise UnknownDevice(_unknown_mig(entry, devices, mig))
            chosen.setdefault(found.name, found)
            continue
        if lowered.startswith("gpu-"):
            device = by_uuid.get(lowered)
        elif entry.isdigit():
            device = by_index.get(str(int(entry)))
        else:
            bus = normalise_bus_id(entry)
            device = by_bus.get(bus) if bus else None
        if device is None:
            have = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "no GPUs"
            raise UnknownDevice(f"unknown device {entry!r}: this node has {have}")
        gpus.setdefault(device.uuid, device)
    whole = {d.uuid for d in gpus.values()}
    alone = tuple(m for m in chosen.values() if m.parent_uuid not in whole)
    return Selection(tuple(gpus.values()), alone)


def _unknown_mig(
    entry: str, devices: list[Device] | tuple[Device, ...], mig: tuple[MigDevice, ...]
) -> str:
    """Why a MIG entry names nothing here, and what does exist."""
    have = ", ".join(f"{m.place} ({m.name})" for m in mig) or "no MIG devices"
    parts = entry.split(":")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return (
            f"unknown device {entry!r}: <gpu>:<mig index> counts MIG devices in NVML's "
            f"enumeration order, which procfs does not show; name a MIG device by UUID or as "
            f"<gpu>:<gi>:<ci>; this node has {have}"
        )
    unnamed = [m for m in mig if not m.uuid]
    if entry.lower().startswith("mig-") and "/" not in entry and unnamed:
        return (
            f"unknown device {entry!r}: the MIG map (written by the node agent from NVML) "
            f"does not name {len(unnamed)} of this node's MIG devices; this node has {have}"
        )
    return f"unknown device {entry!r}: this node has {have}"
