"""The node's device health, on disk: a node agent restarted a second after a fault still
holds the GPU unhealthy (the device plugin advertises it so, the DRA plugin publishes its
taint), and lets it recover only once the quiet period since the fault is over.

`<state dir>/health.json` (the DRA plugin's: beside its checkpoint), written whole and
crash-safe (`deviceplugin.statefile`) each time the health book changes: per unhealthy
device, when its last critical event was and the events since it was last healthy (what its
taint says). The book counts on a monotonic clock, which does not survive a reboot, so the
file holds wall-clock times and `load` turns them back into the caller's clock (an age never
below zero). A file that is not whole or not what was written is a StateError: the agent
rebuilds the health from what the API server was last told (`agent.node`), never starting
with every GPU healthy, which would offer a GPU that faulted a second ago to new work.
"""

from __future__ import annotations

import os
from pathlib import Path

from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.health import Entries
from deviceplugin.statefile import read, write

VERSION = 1
NAME = "health.json"


def save(directory: str | os.PathLike[str], entries: Entries, now: float, wall: float) -> None:
    """Write `entries` (times on the clock that reads `now` while the wall clock reads
    `wall`)."""
    devices = {
        uuid: {"since": wall - (now - t), "causes": [[e.uuid, e.xid, e.detail] for e in causes]}
        for uuid, (t, causes) in entries.items()
    }
    write(directory, NAME, {"version": VERSION, "devices": devices})


def path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory, NAME)


def load(directory: str | os.PathLike[str], now: float, wall: float) -> Entries:
    """What was saved, its times on the caller's clock (reading `now` while the wall clock
    reads `wall`); nothing where nothing was saved."""
    entries = read(
        path(directory), VERSION, "health state",
        "the taints it held would be lost; remove it to start with every GPU healthy",
        lambda raw: {
            str(uuid): (
                now - max(0.0, wall - float(device["since"])),
                tuple(_event(*cause) for cause in device["causes"]),
            )
            for uuid, device in raw["devices"].items()
        },
    )  # fmt: skip
    return entries or {}


def _event(uuid: object, xid: object, detail: object) -> HealthEvent:
    if uuid is not None and not isinstance(uuid, str):
        raise TypeError(f"device {uuid!r} is not a UUID")
    if xid is not None and (not isinstance(xid, int) or isinstance(xid, bool)):
        raise TypeError(f"XID {xid!r} is not a number")
    return HealthEvent(uuid, xid, str(detail))
