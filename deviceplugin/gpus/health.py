"""Device health from XID events, with recovery: pure bookkeeping, time passed in.

A critical event makes a device Unhealthy; a device that then stays quiet for the recovery
period is Healthy again (NVIDIA's plugin never recovers without a restart), provided it
still answers: the caller asks the driver before it lets a device recover (`due`), so a GPU
that fell off the bus stays Unhealthy however quiet it is. An event on a GPU concerns its
MIG devices too (`children`); one on a MIG device, that MIG device only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from deviceplugin.gpus.discovery import HealthEvent

# Application errors: the GPU is fine (NVIDIA's default ignore list, reference 2.5).
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
# 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_RECOVER_AFTER = 300.0
KEPT_CAUSES = 8
KEPT_WAITING = 64  # devices not watched yet whose events wait (a node has fewer)

# unhealthy device → (when its last critical event was, on the book's clock; its causes)
Entries = dict[str, tuple[float, tuple[HealthEvent, ...]]]


@dataclass(frozen=True)
class HealthPolicy:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recover_after: float | None = DEFAULT_RECOVER_AFTER  # None: never recover

    def critical(self, event: HealthEvent) -> bool:
        return event.xid is None or event.xid not in self.ignored_xids


@dataclass
class HealthBook:
    """When each device last had a critical event, and the critical events since it was
    last healthy (the most recent `KEPT_CAUSES`): what a device taint says."""

    policy: HealthPolicy
    uuids: frozenset[str]
    last_bad: dict[str, float] = field(default_factory=dict)
    causes: dict[str, tuple[HealthEvent, ...]] = field(default_factory=dict)
    children: Mapping[str, frozenset[str]] = field(default_factory=dict)  # GPU → MIG devices
    waiting: dict[str, tuple[float, tuple[HealthEvent, ...]]] = field(default_factory=dict)

    def record(self, events: Iterable[HealthEvent], now: float) -> set[str]:
        """Apply events; returns the devices they concern (empty if all were ignored). A
        critical event of a device not watched yet (the driver names a GPU back on the bus,
        or a MIG device made, before the next discovery hands it over) waits for it
        (`waiting`): `track` applies it when that device is watched."""
        hit: set[str] = set()
        for event in events:
            if not self.policy.critical(event):
                continue
            if event.uuid is None:
                targets = set(self.uuids)
            else:
                targets = {event.uuid, *self.children.get(event.uuid, ())} & self.uuids
                if not targets:
                    _, before = self.waiting.pop(event.uuid, (now, ()))
                    self.waiting[event.uuid] = (now, (*before[1 - KEPT_CAUSES :], event))
                    while len(self.waiting) > KEPT_WAITING:  # the longest waiting go first
                        del self.waiting[next(iter(self.waiting))]
            for uuid in targets:
                self.last_bad[uuid] = now
                self.causes[uuid] = (*self.causes.get(uuid, ())[1 - KEPT_CAUSES :], event)
            hit |= targets
        return hit

    def due(self, now: float) -> set[str]:
        """Devices whose quiet period has ended: they recover once the driver vouches."""
        after = self.policy.recover_after
        if after is None:
            return set()
        return {uuid for uuid, t in self.last_bad.items() if now - t >= after}

    def recover(self, uuid: str) -> None:
        self.last_bad.pop(uuid, None)
        self.causes.pop(uuid, None)

    def track(self, uuids: frozenset[str], children: Mapping[str, frozenset[str]]) -> None:
        """Watch these devices from now on (MIG devices come and go); a device that is gone
        takes its health with it, and one that comes back starts healthy, unless the driver
        named it in a critical event meanwhile (`waiting`)."""
        self.uuids, self.children = uuids, children
        self.last_bad = {u: t for u, t in self.last_bad.items() if u in uuids}
        self.causes = {u: c for u, c in self.causes.items() if u in uuids}
        for uuid in uuids & self.waiting.keys():
            self.last_bad[uuid], self.causes[uuid] = self.waiting.pop(uuid)

    def unhealthy(self) -> frozenset[str]:
        return frozenset(self.last_bad)

    def entries(self) -> Entries:
        """What the book holds of each unhealthy device: what a restart must not forget."""
        return {u: (t, self.causes.get(u, ())) for u, t in sorted(self.last_bad.items())}

    def restore(self, entries: Mapping[str, tuple[float, tuple[HealthEvent, ...]]]) -> None:
        """Take back what an earlier run held, for the devices watched now."""
        for uuid, (t, causes) in entries.items():
            if uuid in self.uuids:
                self.last_bad[uuid] = t
                self.causes[uuid] = tuple(causes[-KEPT_CAUSES:])

    def next_due(self) -> float | None:
        """When the next device's quiet period ends (None: nothing to wait for)."""
        after = self.policy.recover_after
        if after is None or not self.last_bad:
            return None
        return min(self.last_bad.values()) + after
