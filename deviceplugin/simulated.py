"""Discovery on the simulated node (`gpuwire sim node DIR`): its machine, and the XID events
`gpuwire sim fault` appends to its event file, delivered the way NVML delivers them.

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
from deviceplugin.discovery import Gpu, HealthEvent, NodeGpus
from gpuwire import sim

log = logging.getLogger(__name__)


class SimDiscovery:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.events = self.root / sim.EVENTS
        self._offset = self.events.stat().st_size if self.events.exists() else 0
        self._watch: inotify.Watch | None = None

    def discover(self) -> NodeGpus:
        machine = sim.load_machine(self.root)
        gpus = tuple(
            Gpu(g.device, g.compute_capability, sim.brand(g.device.product)) for g in machine.gpus
        )
        return NodeGpus(machine.driver_version, machine.cuda_version, gpus)

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
        for line in complete.decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                events.append(HealthEvent(str(raw["uuid"]), int(raw["xid"]), f"XID {raw['xid']}"))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed line in %s: %r", self.events, line)
        return events

    def alive(self, uuid: str) -> bool:
        try:
            return any(d.uuid == uuid for d in sim.load_machine(self.root).devices)
        except (OSError, ValueError, KeyError):
            return False

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
