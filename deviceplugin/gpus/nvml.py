"""GPU discovery and XID health events through NVML (`pynvml`, package nvidia-ml-py).

NVLink peers: each active link's far end is a GPU (counted per peer) or an NVSwitch; GPUs
that reach switches are joined to each other with as many links as the weaker side has to
the fabric, which is how an NVSwitch system (DGX A100/H100) behaves. Fields a driver does
not support (NUMA node on old drivers, NVLink on PCIe boards) fall back or stay empty.

MIG devices of a GPU in MIG mode: the handles of `nvmlDeviceGetMigDeviceHandleByIndex` up
to `nvmlDeviceGetMaxMigDeviceCount` (empty slots answer NotFound), their GPU and compute
instance ids, UUIDs and attributes; the profile is named as NVIDIA's go-nvlib names it
(`gpuwire.mig.profile_name`), its `+me`-style suffix from the GPU instance's profile
(`nvmlGpuInstanceGetInfo`'s `profileId` among `nvmlDeviceGetGpuInstanceProfileInfo`'s); the
same `nvmlGpuInstanceGetInfo` gives the profile ID and placement NVIDIA's DRA driver names a
MIG device by.
An XID event that names a GPU and compute instance concerns that MIG device; one that names
none (0xFFFFFFFF) the GPU and all its MIG devices, as in NVIDIA's plugin
(`internal/rm/health.go`).
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from deviceplugin.gpus.discovery import Gpu, HealthEvent, Mig, NodeGpus, pcie_root
from gpuwire import mig, nvidia
from gpuwire.devices import Device, MigDevice, normalise_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ANY_INSTANCE = 0xFFFFFFFF  # an event's GPU/compute instance id when it names none


class NvmlDiscovery:
    def __init__(self, nvml: Any = None, sysfs: str = "/sys", proc: str = "/") -> None:
        self.nvml: Any = nvml or importlib.import_module("pynvml")
        self.sysfs = Path(sysfs)
        self.proc = proc  # where procfs is (the MIG capability minors)
        self.nvml.nvmlInit()
        self._event_set: Any = None
        self._pending: list[HealthEvent] = []
        self._uuids: list[str] = []  # by index, as last discovered
        self._devices: tuple[Device, ...] = ()
        self._mig: dict[tuple[str, int, int], str] = {}  # (GPU, GI, CI) → MIG UUID
        self.unmatched: list[tuple[int, int, int]] = []  # MIG (GPU, GI, CI) not in procfs

    def discover(self) -> NodeGpus:
        nv = self.nvml
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        buses = [_bus(nv.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        index_of_bus = {bus: i for i, bus in enumerate(buses)}
        peers = [self._links(h, index_of_bus) for h in handles]
        switch_links = [p.pop(-1, 0) for p in peers]
        gpus = []
        for i, h in enumerate(handles):
            links = Counter(peers[i])
            for j, fabric in enumerate(switch_links):
                if j != i and fabric and switch_links[i]:
                    links[j] += min(fabric, switch_links[i])
            device = Device(
                index=i,
                minor=nv.nvmlDeviceGetMinorNumber(h),
                uuid=nv.nvmlDeviceGetUUID(h),
                pci_bus_id=buses[i],
                product=nv.nvmlDeviceGetName(h),
                memory_mib=nv.nvmlDeviceGetMemoryInfo(h).total // MIB,
                numa_node=self._numa_node(h, buses[i]),
                nvlinks=tuple(sorted(links.items())),
            )
            capability = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
            root = pcie_root(self.sysfs, buses[i])
            gpus.append(Gpu(device, capability, self._mig_mode(h), self._brand(h), root))
        caps = {
            (m.parent_uuid, m.gi, m.ci): m
            for m in mig.read_instances(self.proc, [g.device for g in gpus])
        }
        self.unmatched = []
        found = [
            m
            for g, h in zip(gpus, handles, strict=True)
            if g.mig_enabled
            for m in self._mig_devices(h, g.device, caps)
        ]
        self._uuids = [g.device.uuid for g in gpus]
        self._devices = tuple(g.device for g in gpus)
        self._mig = {(m.device.parent_uuid, m.device.gi, m.device.ci): m.device.uuid for m in found}
        version = nv.nvmlSystemGetDriverVersion()
        return NodeGpus(version, self._cuda_version(), tuple(gpus), tuple(found))

    def layout(self) -> object:
        """How many GPUs NVML counts (one dropped or brought back is a change), and the MIG
        instances procfs lists for the GPUs last discovered."""
        count = self.nvml.nvmlDeviceGetCount()
        return count, mig.layout(mig.read_instances(self.proc, self._devices))

    def _mig_mode(self, handle: Any) -> bool | None:
        nv = self.nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError:  # NotSupported: no MIG on this GPU
            return None
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def _mig_devices(
        self, handle: Any, parent: Device, caps: dict[tuple[str, int, int], MigDevice]
    ) -> list[Mig]:
        nv = self.nvml
        instances = _GpuInstances(nv, handle)
        found = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                h = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError_NotFound:
                continue
            gi, ci = nv.nvmlDeviceGetGpuInstanceId(h), nv.nvmlDeviceGetComputeInstanceId(h)
            procfs = caps.get((parent.uuid, gi, ci))
            if procfs is None:  # created this instant: procfs shows it by the next look
                log.warning("GPU %d: MIG GI %d CI %d is not in procfs yet", parent.index, gi, ci)
                self.unmatched.append((parent.index, gi, ci))
                continue
            a = nv.nvmlDeviceGetAttributes(h)
            gb = mig.memory_gb(parent.memory_mib, int(a.memorySizeMB))
            g, c = int(a.gpuInstanceSliceCount), int(a.computeInstanceSliceCount)
            profile_id, placement, suffix = instances.of(gi)
            name = mig.profile_name(g, c, gb, suffix)
            device = procfs.identified(nv.nvmlDeviceGetUUID(h), name, int(a.memorySizeMB), g)
            engines = (
                int(a.sharedCopyEngineCount),
                int(a.sharedDecoderCount),
                int(a.sharedEncoderCount),
                int(a.sharedJpegCount),
                int(a.sharedOfaCount),
            )
            found.append(Mig(device, int(a.multiprocessorCount), c, engines, profile_id, placement))
        return found

    def _cuda_version(self) -> str:
        version = int(self.nvml.nvmlSystemGetCudaDriverVersion())  # 12040 → 12.4
        return f"{version // 1000}.{version % 1000 // 10}"

    def _brand(self, handle: Any) -> str:
        """go-nvlib's name for NVML's brand; "" where the driver does not say."""
        try:
            value = int(self.nvml.nvmlDeviceGetBrand(handle))
        except self.nvml.NVMLError:
            return ""
        return next(
            (n for c, n in nvidia.BRANDS.items() if getattr(self.nvml, c, None) == value), ""
        )

    def _numa_node(self, handle: Any, bus: str) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetNumaNodeId(handle))
        except self.nvml.NVMLError:  # drivers before R535 lack it: the kernel knows too
            try:
                return int((self.sysfs / "bus/pci/devices" / bus / "numa_node").read_text())
            except (OSError, ValueError):
                return -1

    def _links(self, handle: Any, index_of_bus: dict[str, int]) -> Counter[int]:
        """Active NVLinks per peer GPU index; key -1 counts links to NVSwitches."""
        nv = self.nvml
        links: Counter[int] = Counter()
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nv.NVMLError_NotSupported:
                break  # no NVLink on this board
            except nv.NVMLError:
                continue  # past this board's last link, or a link that is down
            kind = self._remote_type(handle, link)
            if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH or (
                kind is None and remote not in index_of_bus
            ):
                links[-1] += 1
            elif remote in index_of_bus:
                links[index_of_bus[remote]] += 1
        return links

    def _remote_type(self, handle: Any, link: int) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        except self.nvml.NVMLError:
            return None

    def wait_events(self, timeout: float) -> list[HealthEvent]:
        nv = self.nvml
        if self._event_set is None:
            self._event_set = self._register_events()
        if self._pending:
            pending, self._pending = self._pending, []
            return pending
        try:
            data = nv.nvmlEventSetWait(self._event_set, int(timeout * 1000))
        except nv.NVMLError_Timeout:
            return []
        except nv.NVMLError as exc:
            return [HealthEvent(None, None, f"NVML event wait failed: {exc}")]
        if data.eventType != nv.nvmlEventTypeXidCriticalError:
            return []
        try:
            uuid: str | None = nv.nvmlDeviceGetUUID(data.device)
        except nv.NVMLError:
            uuid = None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        detail = f"XID {data.eventData}"
        if uuid is not None and ANY_INSTANCE not in (gi, ci):
            uuid = self._mig.get((uuid, gi, ci), uuid)
            detail += f" on MIG GI {gi} CI {ci}"
        return [HealthEvent(uuid, int(data.eventData), detail)]

    def _register_events(self) -> Any:
        nv = self.nvml
        event_set = nv.nvmlEventSetCreate()
        if not self._uuids:
            self.discover()
        for i, uuid in enumerate(self._uuids):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError_NotSupported:
                log.warning("GPU %s is too old for XID events: health checks off for it", uuid)
            except nv.NVMLError as exc:
                self._pending.append(HealthEvent(uuid, None, f"cannot watch XID events: {exc}"))
        return event_set

    def alive(self, uuid: str) -> bool:
        nv = self.nvml
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)  # MIG UUIDs too
            if uuid.startswith("MIG-"):
                nv.nvmlDeviceGetGpuInstanceId(handle)
            else:
                nv.nvmlDeviceGetPciInfo(handle)
        except nv.NVMLError:
            return False
        return True

    def close(self) -> None:
        if self._event_set is not None:
            self.nvml.nvmlEventSetFree(self._event_set)
        self.nvml.nvmlShutdown()


class _GpuInstances:
    """A GPU's instances by GPU instance id: profile ID, placement (start, size) and profile
    name suffix (`+me`, ...): the instance's profile ID looked up among the GPU's profiles,
    which are read once."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self._by_id: dict[int, str] | None = None

    def of(self, gi: int) -> tuple[int, tuple[int, int], str]:
        nv = self.nvml
        try:
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(self.handle, gi))
        except nv.NVMLError as exc:  # NoPermission: the plugin does not run as root
            log.warning("MIG GI %d: profile unknown (%s); named without suffix", gi, exc)
            return -1, (0, 0), ""
        profile_id = int(info.profileId)
        placement = (int(info.placement.start), int(info.placement.size))
        if self._by_id is None:
            self._by_id = {}
            for enum in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    profile = nv.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, enum)
                except nv.NVMLError:  # a profile this GPU does not have
                    continue
                self._by_id[int(profile.id)] = mig.SUFFIXES.get(enum, "")
        return profile_id, placement, self._by_id.get(profile_id, "")


def _bus(value: str) -> str:
    """NVML's `00000000:07:00.0` → `0000:07:00.0`, the form sysfs and the contract use."""
    return normalise_bus_id(value) or value.lower()
