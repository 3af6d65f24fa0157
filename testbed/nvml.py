"""A stand-in for `pynvml` (nvidia-ml-py) over a table of fake GPUs.

Functions have pynvml's names and parameters (a test compares the signatures), return
pynvml's own structures (`nvmlPciInfo_t`, `c_nvmlMemory_t`), and fail the way the driver does:
with pynvml's exception classes, built from the driver's error codes (`NVMLError(code)` picks
the subclass, e.g. `NVMLError_NotSupported`). Constants and exceptions are the real module's,
which imports without a driver.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuwire import nvidia, sim

SWITCH = "switch"


@dataclass
class FakeGpu:
    uuid: str
    name: str
    minor: int
    bus: str  # NVML's form: 00000000:07:00.0
    memory_mib: int
    numa: int | None = None  # None: the driver does not support the query
    compute: tuple[int, int] = (8, 0)
    links: list[tuple[str, str] | None] = field(default_factory=list)  # (kind, remote bus) per link
    events_supported: bool = True
    lost: bool = False


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class StandIn:
    """Holds the fake node; `module()` exposes it as a pynvml-like module."""

    def __init__(self, gpus: list[FakeGpu], old_driver: bool = False) -> None:
        self.gpus = gpus
        self.old_driver = old_driver  # no nvmlDeviceGetNvLinkRemoteDeviceType
        self.initialised = 0
        self.events: list[tuple[FakeGpu | None, int, int]] = []  # (device, type, data)
        self.wait_error: int | None = None
        self.registered: list[str] = []

    def module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVML", "nvmlEventType")):
                setattr(module, name, getattr(pynvml, name))
        for name in FUNCTIONS:
            setattr(module, name, getattr(self, name))
        return module

    def _check(self, gpu: FakeGpu) -> FakeGpu:
        if not self.initialised:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # --- pynvml's functions, same names and parameters ----------------------------------------

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return self._check(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._check(handle).name

    def nvmlDeviceGetMinorNumber(self, handle: FakeGpu) -> int:
        return self._check(handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version: Any = None) -> Any:
        memory = pynvml.c_nvmlMemory_t()
        memory.total = self._check(handle).memory_mib * 1024 * 1024
        return memory

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return _pci(self._check(handle).bus)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGpu) -> int:
        numa = self._check(handle).numa
        if numa is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetBrand(self, handle: FakeGpu) -> int:
        return nvidia.BRANDS.index(sim.brand(self._check(handle).name))

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        return self._check(handle).compute

    def _link(self, device: FakeGpu, link: int) -> tuple[str, str] | None:
        gpu = self._check(device)
        if not gpu.links:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, device: FakeGpu, link: int) -> int:
        up = self._link(device, link) is not None
        return int(pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: FakeGpu, link: int) -> Any:
        remote = self._link(device, link)
        if remote is None:
            raise _error(pynvml.NVML_ERROR_INVALID_STATE)
        return _pci(remote[1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeGpu, link: int) -> int:
        if self.old_driver:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        remote = self._link(handle, link)
        if remote is None:
            raise _error(pynvml.NVML_ERROR_INVALID_STATE)
        if remote[0] == SWITCH:
            return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, eventTypes: int, eventSet: object) -> None:
        gpu = self._check(handle)
        if not gpu.events_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(gpu.uuid)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> Any:
        if self.wait_error is not None:
            raise _error(self.wait_error)
        if not self.events:
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        device, kind, data = self.events.pop(0)
        # c_nvmlEventData_t's fields; `device` is the handle NVML returned
        return types.SimpleNamespace(
            device=device, eventType=kind, eventData=data, gpuInstanceId=0, computeInstanceId=0
        )

    def nvmlEventSetFree(self, eventSet: object) -> None:
        return None

    # --- what tests do to the fake node -------------------------------------------------------

    def xid(self, gpu: FakeGpu | None, xid: int) -> None:
        self.events.append((gpu, pynvml.nvmlEventTypeXidCriticalError, xid))


def _pci(bus: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus
    info.busIdLegacy = bus
    return info


FUNCTIONS = tuple(
    name for name, value in vars(StandIn).items() if name.startswith("nvml") and callable(value)
)
