"""A stand-in for `pynvml` (nvidia-ml-py) over a table of fake GPUs.

Functions have pynvml's names and parameters (a test compares the signatures), return
pynvml's own structures (`nvmlPciInfo_t`, `c_nvmlMemory_t`), and fail the way the driver does:
with pynvml's exception classes, built from the driver's error codes (`NVMLError(code)` picks
the subclass, e.g. `NVMLError_NotSupported`). Constants and exceptions are the real module's,
which imports without a driver.

MIG (`StandIn.of_machine`: a simulated node's GPUs and MIG devices): MIG mode, MIG device
handles by slot (empty slots answer NotFound), their instance ids, UUIDs, attributes and
memory, the GPU's instance profiles (`gpuwire.migprofiles`) and its GPU instances' profile
IDs and placements, as nvidia-ml-py 13 returns them (reference mig-mps-cri.md 2). Left out:
creating and destroying instances (the simulated node does that: `gpuwire.sim`),
compute-instance profiles, possible placements, and the privilege NVML asks for GPU-instance
lookups.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuwire import migprofiles, nvidia, sim

SWITCH = "switch"
ANY_INSTANCE = 0xFFFFFFFF


@dataclass
class FakeMig:
    """A MIG device: compute instance `ci` over all of GPU instance `gi`, which starts at
    memory slice `start`."""

    parent: FakeGpu
    gi: int
    ci: int
    uuid: str
    profile: migprofiles.Profile
    start: int = 0


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
    brand: int | None = pynvml.NVML_BRAND_NVIDIA  # None: the driver does not support the query
    mig_mode: int | None = None  # NVML_DEVICE_MIG_ENABLE/DISABLE; None: no MIG on this GPU
    mig: list[FakeMig | None] = field(default_factory=list)  # by slot; None: an empty slot
    profiles: tuple[migprofiles.Profile, ...] = ()


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class StandIn:
    """Holds the fake node; `module()` exposes it as a pynvml-like module."""

    def __init__(self, gpus: list[FakeGpu], old_driver: bool = False) -> None:
        self.gpus = gpus
        self.old_driver = old_driver  # no nvmlDeviceGetNvLinkRemoteDeviceType
        self.initialised = 0
        # (device, type, data, (GI, CI)); ANY_INSTANCE: an event of the whole GPU
        self.events: list[tuple[FakeGpu | None, int, int, tuple[int, int]]] = []
        self.wait_error: int | None = None
        self.registered: list[str] = []

    @classmethod
    def of_machine(cls, machine: sim.Machine) -> StandIn:
        """NVML over a simulated node's GPUs: products, memory, NVLinks, MIG mode and MIG
        devices."""
        buses = [f"0000{d.pci_bus_id}" for d in machine.devices]
        gpus = []
        for g in machine.gpus:
            d = g.device
            gpu = FakeGpu(d.uuid, d.product, d.minor, buses[d.index], d.memory_mib)
            gpu.numa, gpu.compute = d.numa_node, g.compute_capability
            brand = next(c for c, n in nvidia.BRANDS.items() if n == nvidia.brand_of(d.product))
            gpu.brand = getattr(pynvml, brand)
            gpu.links = [("gpu", buses[peer]) for peer, count in d.nvlinks for _ in range(count)]
            gpu.profiles = migprofiles.profiles(d.product)
            if gpu.profiles:
                enabled = g.mig is not None
                gpu.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else 0
                gpu.mig = [
                    FakeMig(
                        gpu, m.gi, m.ci, m.uuid, migprofiles.profile(d.product, m.profile), m.start
                    )
                    for m in g.mig or ()
                ]
            gpus.append(gpu)
        return cls(gpus)

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

    def _gpu(self, handle: FakeGpu | FakeMig) -> FakeGpu:
        """A full GPU's handle; NotSupported for a MIG device's."""
        if isinstance(handle, FakeMig):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._check(handle)

    def _mig(self, handle: FakeGpu | FakeMig) -> FakeMig:
        """A MIG device's handle; NotSupported for a full GPU's."""
        if not isinstance(handle, FakeMig):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._check(handle.parent)
        if handle not in handle.parent.mig:  # destroyed: the handle is stale
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return handle

    def _in_mig_mode(self, handle: FakeGpu | FakeMig) -> FakeGpu:
        gpu = self._gpu(handle)
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
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

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu | FakeMig:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
            for m in gpu.mig:
                if m is not None and m.uuid == uuid:
                    return m
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> str:
        if isinstance(handle, FakeMig):
            return self._mig(handle).uuid
        return self._check(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return self._check(handle).name

    def nvmlDeviceGetMinorNumber(self, handle: FakeGpu) -> int:
        return self._check(handle).minor

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig, version: Any = None) -> Any:
        memory = pynvml.c_nvmlMemory_t()
        if isinstance(handle, FakeMig):
            mib = self._mig(handle).profile.memory_mib
        else:
            mib = self._check(handle).memory_mib
        memory.total = mib * 1024 * 1024
        return memory

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return _pci(self._check(handle).bus)

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGpu) -> int:
        numa = self._check(handle).numa
        if numa is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetBrand(self, handle: FakeGpu) -> int:
        brand = self._check(handle).brand
        if brand is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return brand

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

    # MIG: mode, devices, instance profiles

    def nvmlDeviceGetMigMode(self, device: FakeGpu) -> list[int]:
        mode = self._gpu(device).mig_mode
        if mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeGpu) -> int:
        gpu = self._gpu(device)
        if gpu.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE:
            return 0  # no error: MIG unsupported or off
        return max((p.max for p in gpu.profiles), default=0)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeGpu, index: int) -> FakeMig:
        gpu = self._in_mig_mode(device)
        if not 0 <= index < self.nvmlDeviceGetMaxMigDeviceCount(gpu):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = gpu.mig[index] if index < len(gpu.mig) else None
        if found is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return found

    def nvmlDeviceIsMigDeviceHandle(self, device: FakeGpu | FakeMig) -> Any:
        return ctypes.c_uint(int(isinstance(device, FakeMig)))  # a c_uint, as pynvml's

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: FakeMig) -> FakeGpu:
        return self._mig(migDevice).parent

    def nvmlDeviceGetGpuInstanceId(self, device: FakeGpu | FakeMig) -> int:
        return self._mig(device).gi

    def nvmlDeviceGetComputeInstanceId(self, device: FakeGpu | FakeMig) -> int:
        return self._mig(device).ci

    def nvmlDeviceGetAttributes(self, device: FakeGpu | FakeMig) -> Any:
        p = self._mig(device).profile
        a = pynvml.c_nvmlDeviceAttributes()
        a.multiprocessorCount = p.multiprocessors
        a.sharedCopyEngineCount, a.sharedDecoderCount = p.copy, p.decoder
        a.sharedEncoderCount, a.sharedJpegCount, a.sharedOfaCount = p.encoder, p.jpeg, p.ofa
        a.gpuInstanceSliceCount = a.computeInstanceSliceCount = p.slices
        a.memorySizeMB = p.memory_mib
        return a

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: FakeGpu, profile: int, version: int = 2
    ) -> Any:
        gpu = self._in_mig_mode(device)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        found = next((p for p in gpu.profiles if p.enum == profile), None)
        if found is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = found.id, found.slices, found.max
        info.multiprocessorCount, info.memorySizeMB = found.multiprocessors, found.memory_mib
        info.copyEngineCount, info.decoderCount = found.copy, found.decoder
        info.encoderCount, info.jpegCount, info.ofaCount = found.encoder, found.jpeg, found.ofa
        info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceById(self, device: FakeGpu, gpuInstanceId: int) -> FakeMig:
        gpu = self._in_mig_mode(device)
        for m in gpu.mig:
            if m is not None and m.gi == gpuInstanceId:
                return m  # the stand-in's GPU instance handle: its (one) MIG device
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: FakeMig) -> Any:
        m = self._mig(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = m.gi, m.profile.id
        info.placement.start, info.placement.size = m.start, m.profile.memory_slices
        return info

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
        device, kind, data, (gi, ci) = self.events.pop(0)
        # c_nvmlEventData_t's fields; `device` is the handle NVML returned
        return types.SimpleNamespace(
            device=device, eventType=kind, eventData=data, gpuInstanceId=gi, computeInstanceId=ci
        )

    def nvmlEventSetFree(self, eventSet: object) -> None:
        return None

    # --- what tests do to the fake node -------------------------------------------------------

    def xid(self, gpu: FakeGpu | None, xid: int, instance: tuple[int, int] | None = None) -> None:
        """An XID on `gpu`, or on one of its MIG devices (its GPU and compute instance)."""
        where = instance or (ANY_INSTANCE, ANY_INSTANCE)
        self.events.append((gpu, pynvml.nvmlEventTypeXidCriticalError, xid, where))


def _pci(bus: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus
    info.busIdLegacy = bus
    return info


FUNCTIONS = tuple(
    name for name, value in vars(StandIn).items() if name.startswith("nvml") and callable(value)
)
