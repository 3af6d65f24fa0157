"""What the plugin learns about a node's GPUs, from NVML, the simulated node or (an AMD
node) sysfs.

Every source answers the same three questions through one small interface: which GPUs and
MIG devices are there (as `gpuwire.devices.Device` and `MigDevice`, plus what labels and DRA
devices need), which health events happened, and whether a device still answers. `NodeGpus`
is the same for every vendor; what only one vendor's modules read rides in a subclass of it
(AMD's `gpus.amd.AmdNodeGpus`: KFD's facts). Everything above this module is source-agnostic.
A MIG device's capability minors are procfs's in both NVIDIA sources
(`gpuwire.mig.read_instances`, as NVIDIA's plugin reads them): NVML does not give them.
`Latest` is the node every long-running part of a process shares, and `follow` how the
plugins keep up with its changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuwire.devices import Device, MigDevice

log = logging.getLogger(__name__)

LOOK = 1.0  # seconds between looks at the layout (the GPUs listed, the MIG instances)
REDISCOVER = 60.0  # seconds after which the node is discovered again anyway


@dataclass(frozen=True)
class Gpu:
    device: Device
    compute_capability: tuple[int, int]
    mig_enabled: bool | None = None  # None: the GPU cannot do MIG; else its MIG mode
    brand: str = ""  # NVML's brand (go-nvlib's names); "": the source does not say
    pcie_root: str | None = None  # `pci0000:00`: the PCIe root complex, from sysfs


@dataclass(frozen=True)
class Mig:
    """A MIG device with what GPU Feature Discovery labels of it (NVML's device attributes)
    and where its GPU instance sits: its profile ID (what `nvidia-smi mig -lgip` lists, and
    `nvmlDeviceCreateGpuInstance` takes) and its placement (start and size, in memory
    slices), which NVIDIA's DRA driver names it by."""

    device: MigDevice
    multiprocessors: int = 0
    ci_slices: int = 0  # the compute instance's slices (the C of `<C>c.<G>g.<GB>gb`)
    engines: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # copy, decoder, encoder, jpeg, ofa
    profile_id: int = -1  # -1: NVML did not say (it asks for privilege)
    placement: tuple[int, int] = (0, 0)  # (start, size) in memory slices

    @property
    def whole(self) -> bool:
        """Whether its compute instance spans its GPU instance (`1g.10gb`, not `1c.3g.40gb`)."""
        return self.ci_slices == self.device.slices


@dataclass(frozen=True)
class NodeGpus:
    driver_version: str  # 550.54.15
    cuda_version: str  # 12.4: the newest CUDA the driver supports
    gpus: tuple[Gpu, ...]
    mig: tuple[Mig, ...] = ()

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(g.device for g in self.gpus)

    @property
    def mig_devices(self) -> tuple[MigDevice, ...]:
        return tuple(m.device for m in self.mig)

    def mig_of(self, uuid: str) -> tuple[Mig, ...]:
        """The MIG devices of the GPU `uuid`."""
        return tuple(m for m in self.mig if m.device.parent_uuid == uuid)

    def watched(self) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
        """The devices whose health is kept (GPUs and MIG devices), and each GPU's MIG
        devices (an event on a GPU concerns them too)."""
        children = {
            d.uuid: frozenset(m.device.uuid for m in self.mig_of(d.uuid)) for d in self.devices
        }
        uuids = {d.uuid for d in self.devices} | {m.uuid for m in self.mig_devices}
        return frozenset(uuids), children


@dataclass(frozen=True)
class HealthEvent:
    """Something that may make a device unhealthy.

    `uuid` None: the event names no device (NVML failed), so it concerns all of them; a
    GPU's UUID concerns its MIG devices too.
    `xid` None: not an XID but a failure that is always critical.
    """

    uuid: str | None
    xid: int | None
    detail: str


class Discovery(Protocol):
    def discover(self) -> NodeGpus: ...

    def layout(self) -> object:
        """A cheap look at what `discover` would find (the GPUs the driver lists, and the
        MIG instances procfs lists for the GPUs last discovered): when it changes, discover
        again."""
        ...

    def wait_events(self, timeout: float) -> list[HealthEvent]:
        """Health events that arrive within `timeout` seconds."""
        ...

    def alive(self, uuid: str) -> bool:
        """Whether the device still answers (a quiet device that is gone must not recover)."""
        ...

    def close(self) -> None: ...


class Latest:
    """The node as last discovered, one for every part of a process that keeps up with it
    (the MIG follower, the labeler, the holders agent, the MPS daemons): discovered again only
    when procfs's MIG layout moved or the node is older than a caller accepts, and then once
    for all of them, so one MIG change costs one discovery, not one per part."""

    def __init__(self, discovery: Discovery, node: NodeGpus | None = None) -> None:
        self.discovery = discovery
        self._lock = threading.Lock()
        self._node = node
        self._at = time.monotonic()
        self._layout = discovery.layout() if node is not None else None

    def __call__(self, within: float | None = None) -> NodeGpus:
        """The node on the MIG layout procfs shows now, discovered at most `within` seconds
        ago (REDISCOVER by default). The layout is the one looked at before the discovery:
        a change made while it runs is seen at the next look, not taken for seen."""
        within = REDISCOVER if within is None else within
        with self._lock:
            layout = self.discovery.layout()
            if (
                self._node is None
                or time.monotonic() - self._at >= within
                or layout != self._layout
            ):
                self._node = self.discovery.discover()
                self._at, self._layout = time.monotonic(), layout
            return self._node


def follow(
    latest: Latest,
    node: NodeGpus,
    changed: Callable[[NodeGpus], None],
    stop: threading.Event,
) -> None:
    """Hand `changed` the node each time it is found other than `node` (the one the caller
    acts on now), until `stop` is set: a GPU the driver drops or lists again, MIG instances
    created or destroyed (the layout looked at every LOOK seconds), or anything else a
    discovery sees (one every REDISCOVER seconds)."""
    while not stop.wait(LOOK):
        try:
            found = latest()
            if found != node:
                node = found
                changed(node)
        except Exception:
            log.exception("rediscovery failed; trying again")


def pcie_root(sysfs: str | os.PathLike[str], bus_id: str) -> str | None:
    """The PCIe root complex a device hangs off (`pci0000:00`), from its sysfs path
    (`/sys/bus/pci/devices/<bus id>` links to `/sys/devices/pci0000:00/…/<bus id>`), as
    k8s.io/dynamic-resource-allocation `deviceattribute` reads `pcieRoot`; None if unknown."""
    try:
        target = os.readlink(os.path.join(sysfs, "bus/pci/devices", bus_id))
    except OSError:
        return None
    parts = target.split("/")
    root = next((p for p in parts if p.startswith("pci") and ":" in p), None)
    return root if root is not None and parts.index(root) + 1 < len(parts) else None
