"""AMD discovery for the device plugin, the DRA plugin and the node agent: sysfs, no library.

`gpuwire.kfd` reads the node (the same on a real node and on `gpuwire sim node --vendor amd`);
this puts it behind `deviceplugin.gpus.discovery.Discovery`, as an `AmdNodeGpus`: the node's
GPUs with KFD's facts of them (links, partitions, modes), which AMD's naming, preferred
allocation, labels and DRA devices read (`deviceplugin.vendors`). Health is what the kernel
shows: a device that KFD lists with its render node and no uncorrectable RAS error is healthy;
an event is a device that turns unhealthy (`HealthEvent` with no XID: always critical), looked
for every second; a device answers (`alive`) while it is healthy. The layout that makes the
node be discovered again is KFD's topology generation and each GPU's partition modes (a
repartition). AMD's own plugin reads per-device health from its metrics exporter's socket,
which gpuwire does not (docs/amd.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from deviceplugin.gpus.discovery import Gpu, HealthEvent, NodeGpus, pcie_root
from gpuwire import amd, kfd
from gpuwire.kfd import AmdNode
from gpuwire.roots import Roots

POLL = 1.0  # seconds between looks at the devices' health


@dataclass(frozen=True, kw_only=True)
class AmdNodeGpus(NodeGpus):
    kfd: AmdNode  # KFD's facts of `gpus`


def kfd_of(node: NodeGpus) -> AmdNode:
    """KFD's facts of an AMD node (AMD's modules are handed only what AMD's discovery found)."""
    assert isinstance(node, AmdNodeGpus), node
    return node.kfd


def open_discovery(sim_root: str | None) -> AmdDiscovery:
    """The simulated node's under `sim_root`, else the host's: sysfs either way."""
    return AmdDiscovery(sim_root or "/")


class AmdDiscovery:
    def __init__(self, root: str = "/") -> None:
        self.roots = Roots(root)
        self.problems: dict[str, str] = {}  # uuid → the problem last seen

    def discover(self) -> AmdNodeGpus:
        found = kfd.discover(self.roots)
        sysfs = os.path.join(self.roots.sys, "sys")
        gpus = tuple(
            Gpu(g.device, (0, 0), pcie_root=pcie_root(sysfs, g.device.pci_bus_id))
            for g in found.gpus
        )
        self.problems = {g.device.uuid: g.problem for g in found.gpus}
        return AmdNodeGpus(found.version, "", gpus, kfd=found)

    def layout(self) -> object:
        top = f"{self.roots.sys}/{amd.KFD_TOPOLOGY}"
        modes = []
        for bus in sorted(os.listdir(f"{self.roots.sys}/{amd.PCI_DEVICES}")):
            path = f"{self.roots.sys}/{amd.PCI_DEVICES}/{bus}/current_compute_partition"
            modes.append((bus, _read(path), _read(path.replace("compute", "memory"))))
        return _read(f"{top}/generation_id"), tuple(modes)

    def wait_events(self, timeout: float) -> list[HealthEvent]:
        deadline = time.monotonic() + timeout
        while True:
            events = self._changed()
            left = deadline - time.monotonic()
            if events or left <= 0:
                return events
            time.sleep(min(POLL, left))

    def _changed(self) -> list[HealthEvent]:
        try:
            found = kfd.discover(self.roots)
        except kfd.KfdError as exc:
            return [HealthEvent(None, None, str(exc))]
        events = [
            HealthEvent(g.device.uuid, None, g.problem)
            for g in found.gpus
            if g.problem and self.problems.get(g.device.uuid) != g.problem
        ]
        self.problems = {g.device.uuid: g.problem for g in found.gpus}
        return events

    def alive(self, uuid: str) -> bool:
        return self.problems.get(uuid) == ""

    def close(self) -> None:
        pass


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""
