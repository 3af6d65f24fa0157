"""What the plugin learns about a node's GPUs, from NVML or from the simulated node.

Both sources answer the same three questions through one small interface: which GPUs are
there (as `gpuwire.devices.Device`, plus what labels need), which health events happened,
and whether a device still answers. Everything above this module is source-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuwire.devices import Device


@dataclass(frozen=True)
class Gpu:
    device: Device
    compute_capability: tuple[int, int]
    brand: str = "Unknown"  # as `gpuwire.nvidia.BRANDS` names NVML's brand types


@dataclass(frozen=True)
class NodeGpus:
    driver_version: str  # 550.54.15
    cuda_version: str  # 12.4: the newest CUDA the driver supports
    gpus: tuple[Gpu, ...]

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(g.device for g in self.gpus)


@dataclass(frozen=True)
class HealthEvent:
    """Something that may make a device unhealthy.

    `uuid` None: the event names no device (NVML failed), so it concerns all of them.
    `xid` None: not an XID but a failure that is always critical.
    """

    uuid: str | None
    xid: int | None
    detail: str


class Discovery(Protocol):
    def discover(self) -> NodeGpus: ...

    def wait_events(self, timeout: float) -> list[HealthEvent]:
        """Health events that arrive within `timeout` seconds."""
        ...

    def alive(self, uuid: str) -> bool:
        """Whether the device still answers (a quiet device that is gone must not recover)."""
        ...

    def close(self) -> None: ...
