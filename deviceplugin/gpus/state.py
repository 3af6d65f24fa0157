"""The node's live health, shared by every resource's server: the thread-safe shell around
`health.HealthBook`, fed by the discovery source's events, watched by ListAndWatch streams,
which also hear when the devices themselves change (`changed`: a MIG change).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

from deviceplugin.gpus.discovery import Discovery, HealthEvent
from deviceplugin.gpus.health import Entries, HealthBook

log = logging.getLogger(__name__)


class HealthState:
    def __init__(
        self,
        book: HealthBook,
        alive: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        persist: Callable[[Entries], None] | None = None,
    ) -> None:
        """`persist`: given what the book holds whenever that changes (the DRA plugin keeps
        it on disk, so that a restart forgets no fault)."""
        self._book = book
        self._alive = alive
        self._clock = clock
        self._persist = persist
        self._saved = book.entries()
        self._failing = ""  # the last failure to persist, logged once
        self._cond = threading.Condition()
        self._revision = 0  # bumped when the devices change

    def changed(
        self, uuids: frozenset[str] | None = None, children: dict[str, frozenset[str]] | None = None
    ) -> None:
        """The devices changed (and, given, the ones to watch now): every watcher sends again."""
        with self._cond:
            if uuids is not None:
                self._book.track(uuids, children or {})
                self._save()
            self._revision += 1
            self._cond.notify_all()

    def record(self, events: list[HealthEvent]) -> None:
        with self._cond:
            was = self._book.unhealthy()
            hit = self._book.record(events, self._clock())
            for uuid in sorted(hit - was):
                why = "; ".join(e.detail for e in events if e.uuid in (uuid, None))
                log.warning("GPU %s is unhealthy: %s", uuid, why)
            if hit:
                self._save()
                self._cond.notify_all()

    def unhealthy(self) -> frozenset[str]:
        with self._cond:
            return self._settle()

    def causes(self) -> dict[str, tuple[HealthEvent, ...]]:
        """The unhealthy devices, each with the critical events since it was last healthy."""
        with self._cond:
            self._settle()
            return dict(self._book.causes)

    def _settle(self) -> frozenset[str]:
        """Let devices whose quiet period is over recover, if the driver still sees them."""
        now = self._clock()
        for uuid in sorted(self._book.due(now)):
            if self._alive(uuid):
                self._book.recover(uuid)
                log.warning("GPU %s is healthy again: no critical event for the quiet period", uuid)
            else:
                self._book.record([HealthEvent(uuid, None, "does not answer")], now)
        self._save()
        return self._book.unhealthy()

    def _save(self) -> None:
        """Hand what the book holds to `persist` if it changed since last handed (a failure
        is logged once and tried again on each look: health itself goes on)."""
        if self._persist is None:
            return
        entries = self._book.entries()
        if entries == self._saved:
            return
        try:
            self._persist(entries)
        except OSError as exc:
            if str(exc) != self._failing:
                log.warning("cannot keep the health state: %s", exc)
            self._failing = str(exc)
            return
        self._saved, self._failing = entries, ""

    def watch(
        self, done: Callable[[], bool], poll: float = 1.0, every: float | None = None
    ) -> Iterator[frozenset[str]]:
        """The unhealthy set now, then each time it changes (and with `every`, at least that
        often), until `done()` (checked at least every `poll` seconds and on every `wake()`)."""
        last: tuple[int, frozenset[str]] | None = None
        sent = -math.inf
        while not done():
            with self._cond:
                current = self._settle()
                now = self._clock()
                if (self._revision, current) == last and (every is None or now - sent < every):
                    due = self._book.next_due()
                    wait = poll if due is None else min(poll, max(0.0, due - now))
                    if every is not None:
                        wait = min(wait, sent + every - now)
                    self._cond.wait(wait)
                    continue
                last, sent = (self._revision, current), now
            yield current

    def wake(self) -> None:
        """Make every watcher re-check `done()` now (a stream ended, the server stops)."""
        with self._cond:
            self._cond.notify_all()


def monitor(discovery: Discovery, state: HealthState, stop: threading.Event) -> None:
    """Feed the source's health events into `state` until `stop` is set."""
    while not stop.is_set():
        try:
            events = discovery.wait_events(0.25)
        except Exception:
            log.exception("health events unavailable; retrying")
            stop.wait(1.0)
            continue
        if events:
            state.record(events)
