"""Discovery on the simulated node (`gpuwire sim node DIR`): its machine, and the XID events
`gpuwire sim fault` appends to its event file, delivered the way NVML delivers them.

MIG devices are the instances procfs lists, named from the machine (what NVML would say of
them: UUID, and the profile's facts from `gpuwire.migprofiles`); an instance that one of
the two does not show yet (a MIG change being written) is left for the next look.

Like NVML, only events that happen after the plugin starts count: the file's earlier lines
are history. The event file's directory is watched with inotify, so an appended fault
reaches the plugin within milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from deviceplugin import inotify
from deviceplugin.gpus.discovery import Gpu, HealthEvent, Mig, NodeGpus, pcie_root
from gpuwire import mig, migprofiles, nvidia, sim
from gpuwire.devices import Device

log = logging.getLogger(__name__)


class SimDiscovery:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.events = self.root / sim.EVENTS
        self._offset = self.events.stat().st_size if self.events.exists() else 0
        self._watch: inotify.Watch | None = None
        self._devices: tuple[Device, ...] = ()

    def discover(self) -> NodeGpus:
        machine = sim.load_machine(self.root)
        self._devices = machine.devices
        sysfs = self.root / "sys"
        gpus = tuple(
            Gpu(
                g.device,
                g.compute_capability,
                (g.mig is not None) if g.mig_capable else None,
                brand=nvidia.brand_of(g.device.product),  # what NVML reports for it
                pcie_root=pcie_root(sysfs, g.device.pci_bus_id),
            )
            for g in machine.gpus
        )
        return NodeGpus(machine.driver_version, machine.cuda_version, gpus, self._mig(machine))

    def layout(self) -> object:
        """The GPUs the machine lists (what NVML's device count says on a real node), and
        the instances both procfs and the machine show (those `discover` names): one only
        procfs shows yet (`gpuwire sim` writes the machine last) is a change once both do."""
        try:
            machine = sim.load_machine(self.root)
        except (OSError, ValueError, KeyError):  # no machine to name them: procfs's alone
            return mig.layout(mig.read_instances(str(self.root), self._devices))
        named = _instances(machine)
        shown = mig.layout(mig.read_instances(str(self.root), machine.devices))
        gpus = tuple(d.uuid for d in machine.devices)
        return gpus, tuple(instance for instance in shown if instance in named)

    def _mig(self, machine: sim.Machine) -> tuple[Mig, ...]:
        named = _instances(machine)
        found = []
        for device in mig.read_instances(str(self.root), machine.devices):
            known = named.get((device.parent_uuid, device.gi, device.ci))
            if known is None:
                continue
            gpu, instance = known
            p = migprofiles.profile(gpu.device.product, instance.profile)
            engines = (p.copy, p.decoder, p.encoder, p.jpeg, p.ofa)
            named_device = device.identified(instance.uuid, p.name, p.memory_mib, p.slices)
            placement = (instance.start, p.memory_slices)
            found.append(Mig(named_device, p.multiprocessors, p.slices, engines, p.id, placement))
        return tuple(found)

    def wait_events(self, timeout: float) -> list[HealthEvent]:
        events = self._read_new()
        if events:
            return events
        if self._watch is None:
            self._watch = inotify.Watch(
                self.events.parent, inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE | inotify.IN_CREATE
            )
        self._watch.read(timeout)
        return self._read_new()

    def _read_new(self) -> list[HealthEvent]:
        try:
            with open(self.events, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self._offset += len(complete)
        events = []
        lines = [line for line in complete.decode(errors="replace").splitlines() if line.strip()]
        instances = self._uuids() if lines else {}
        for line in lines:
            try:
                raw = json.loads(line)
                uuid, detail = str(raw["uuid"]), f"XID {raw['xid']}"
                if "gi" in raw:  # an event of one MIG device, as NVML names it
                    uuid = instances.get((uuid, int(raw["gi"]), int(raw["ci"])), uuid)
                    detail += f" on MIG GI {raw['gi']} CI {raw['ci']}"
                events.append(HealthEvent(uuid, int(raw["xid"]), detail))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed line in %s: %r", self.events, line)
        return events

    def _uuids(self) -> dict[tuple[str, int, int], str]:
        """(GPU, GI, CI) → MIG UUID, as the machine is now."""
        try:
            machine = sim.load_machine(self.root)
        except (OSError, ValueError, KeyError):
            return {}
        return {key: m.uuid for key, (_, m) in _instances(machine).items()}

    def alive(self, uuid: str) -> bool:
        try:
            machine = sim.load_machine(self.root)
        except (OSError, ValueError, KeyError):
            return False
        return any(d.uuid == uuid for d in machine.devices) or any(
            m.uuid == uuid for g in machine.gpus for m in g.mig or ()
        )

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()


def _instances(machine: sim.Machine) -> dict[tuple[str, int, int], tuple[sim.SimGpu, sim.SimMig]]:
    """(GPU UUID, GI, CI) → the GPU and its MIG instance, each the machine has."""
    return {(g.device.uuid, m.gi, m.ci): (g, m) for g in machine.gpus for m in g.mig or ()}
