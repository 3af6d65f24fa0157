"""GPU discovery and XID health events through NVML (`pynvml`, package nvidia-ml-py).

NVLink peers: each active link's far end is a GPU (counted per peer) or an NVSwitch; GPUs
that reach switches are joined to each other with as many links as the weaker side has to
the fabric, which is how an NVSwitch system (DGX A100/H100) behaves. Fields a driver does
not support (NUMA node on old drivers, NVLink on PCIe boards) fall back or stay empty.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from deviceplugin.discovery import Gpu, HealthEvent, NodeGpus
from gpuwire import nvidia
from gpuwire.devices import Device, normalise_bus_id

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class NvmlDiscovery:
    def __init__(self, nvml: Any = None, sysfs: str = "/sys") -> None:
        self.nvml: Any = nvml or importlib.import_module("pynvml")
        self.sysfs = Path(sysfs)
        self.nvml.nvmlInit()
        self._event_set: Any = None
        self._pending: list[HealthEvent] = []
        self._uuids: list[str] = []  # by index, as last discovered

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
            compute = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
            gpus.append(Gpu(device, compute, nvidia.brand_name(nv.nvmlDeviceGetBrand(h))))
        self._uuids = [g.device.uuid for g in gpus]
        return NodeGpus(nv.nvmlSystemGetDriverVersion(), self._cuda_version(), tuple(gpus))

    def _cuda_version(self) -> str:
        version = int(self.nvml.nvmlSystemGetCudaDriverVersion())  # 12040 → 12.4
        return f"{version // 1000}.{version % 1000 // 10}"

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
        return [HealthEvent(uuid, int(data.eventData), f"XID {data.eventData}")]

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
            nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByUUID(uuid))
        except nv.NVMLError:
            return False
        return True

    def close(self) -> None:
        if self._event_set is not None:
            self.nvml.nvmlEventSetFree(self._event_set)
        self.nvml.nvmlShutdown()


def _bus(value: str) -> str:
    """NVML's `00000000:07:00.0` → `0000:07:00.0`, the form sysfs and the contract use."""
    return normalise_bus_id(value) or value.lower()
