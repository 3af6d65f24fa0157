"""The device model and NVIDIA_VISIBLE_DEVICES semantics, shared by every component.

A request string selects devices the way libnvidia-container does (NVIDIA's container
toolkit docs, "Specialized Configurations with Docker", `NVIDIA_VISIBLE_DEVICES`;
NVIDIA/nvidia-container-toolkit `cmd/nvidia-container-runtime/README.md`):
`void`/empty/unset is not a GPU container, `none` is a GPU container with no GPU, `all` is
every GPU, otherwise a list of indices, UUIDs or PCI bus ids. The types are `gpuwire.value`
values: this module is on the container-start path.
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


def select(request: Request, devices: list[Device] | tuple[Device, ...]) -> tuple[Device, ...]:
    """The devices a request selects, in request order, each once.

    Raises UnknownDevice naming the entry and what the node has, as a container start must
    fail rather than silently start with fewer GPUs.
    """
    if request.kind is Kind.ALL:
        return tuple(devices)
    if request.kind is not Kind.LIST:
        return ()
    by_uuid = {d.uuid.lower(): d for d in devices}
    by_bus = {normalise_bus_id(d.pci_bus_id): d for d in devices}
    by_index = {str(d.index): d for d in devices}
    chosen: dict[str, Device] = {}
    for entry in request.entries:
        if entry.lower().startswith("gpu-"):
            device = by_uuid.get(entry.lower())
        elif entry.isdigit():
            device = by_index.get(str(int(entry)))
        else:
            bus = normalise_bus_id(entry)
            device = by_bus.get(bus) if bus else None
        if device is None:
            have = ", ".join(f"{d.index} ({d.uuid})" for d in devices) or "no GPUs"
            raise UnknownDevice(f"unknown device {entry!r}: this node has {have}")
        chosen.setdefault(device.uuid, device)
    return tuple(chosen.values())
