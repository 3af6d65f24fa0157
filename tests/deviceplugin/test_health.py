"""Health: XIDs make a GPU unhealthy unless ignored; a quiet period brings it back, but only
if the driver still sees it; watchers see every change."""

from __future__ import annotations

import threading

from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.health import DEFAULT_IGNORED_XIDS, HealthBook, HealthPolicy
from deviceplugin.gpus.state import HealthState
from testbed.waiting import until

A, B = "GPU-a", "GPU-b"


def book(
    recover_after: float | None = 10.0, ignored: frozenset[int] = DEFAULT_IGNORED_XIDS
) -> HealthBook:
    return HealthBook(HealthPolicy(ignored, recover_after), frozenset({A, B}))


def test_default_ignore_list_is_nvidias() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS


def test_ignored_xids_change_nothing_critical_ones_do() -> None:
    b = book()
    assert b.record([HealthEvent(A, 13, "XID 13"), HealthEvent(A, 31, "XID 31")], now=0) == set()
    assert b.unhealthy() == frozenset()
    assert b.record([HealthEvent(A, 79, "XID 79")], now=0) == {A}
    assert b.unhealthy() == {A}


def test_configured_ignore_list_replaces_the_default() -> None:
    b = book(ignored=frozenset({79}))
    b.record([HealthEvent(A, 79, ""), HealthEvent(B, 13, "")], now=0)
    assert b.unhealthy() == {B}


def test_events_without_device_or_xid_are_critical_for_all() -> None:
    b = book()
    b.record([HealthEvent(None, None, "NVML event wait failed")], now=0)
    assert b.unhealthy() == {A, B}
    assert book().record([HealthEvent("GPU-elsewhere", 79, "")], now=0) == set()


def test_an_event_of_a_device_not_watched_yet_counts_once_it_is() -> None:
    """The driver names a device the book does not watch yet (a GPU back on the bus, or a
    MIG device made, before the next discovery hands it over): its critical events wait
    for it, and it starts unhealthy with them, its quiet period from the event. Before:
    they were dropped, and the device came back healthy under an XID storm (the fault
    campaign's long run: an XID storm on the GPU that had just come back from off-bus)."""
    b = book(recover_after=10)
    assert b.record([HealthEvent("GPU-c", 48, "XID 48"), HealthEvent("GPU-c", 13, "")], 3) == set()
    assert b.unhealthy() == frozenset()
    b.track(frozenset({A, B, "GPU-c"}), {})
    assert b.unhealthy() == {"GPU-c"}
    assert [e.detail for e in b.causes["GPU-c"]] == ["XID 48"]
    assert b.next_due() == 13
    b.track(frozenset({A, B}), {})  # gone again: its health goes with it, nothing waits
    b.track(frozenset({A, B, "GPU-c"}), {})
    assert b.unhealthy() == frozenset()


def test_quiet_period_counts_from_the_last_event() -> None:
    b = book(recover_after=10)
    b.record([HealthEvent(A, 79, "")], now=0)
    b.record([HealthEvent(A, 48, "")], now=5)
    assert b.due(now=14) == set()
    assert b.next_due() == 15
    assert b.due(now=15) == {A}
    b.recover(A)
    assert b.unhealthy() == frozenset()
    assert b.next_due() is None


def test_never_recover() -> None:
    b = book(recover_after=None)
    b.record([HealthEvent(A, 79, "")], now=0)
    assert b.due(now=10**9) == set()
    assert b.next_due() is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_state_recovers_only_gpus_the_driver_still_sees() -> None:
    clock = Clock()
    gone: set[str] = set()
    state = HealthState(book(recover_after=10), lambda uuid: uuid not in gone, clock)
    state.record([HealthEvent(A, 79, ""), HealthEvent(B, 79, "")])
    gone.add(B)
    clock.now = 10
    assert state.unhealthy() == {B}  # A recovered, B fell off the bus and stays
    clock.now = 19
    assert state.unhealthy() == {B}  # B's quiet period restarted when it did not answer


def test_watch_yields_each_change_once() -> None:
    clock = Clock()
    state = HealthState(book(recover_after=10), lambda uuid: True, clock)
    done = threading.Event()
    seen: list[frozenset[str]] = []

    def watcher() -> None:
        for unhealthy in state.watch(done.is_set, poll=0.05):
            seen.append(unhealthy)
            if len(seen) == 3:
                done.set()

    thread = threading.Thread(target=watcher)
    thread.start()
    until(lambda: len(seen) == 1)
    state.record([HealthEvent(A, 13, "ignored: no change, nothing sent")])
    state.record([HealthEvent(A, 79, "")])
    until(lambda: len(seen) == 2)
    clock.now = 10
    thread.join(timeout=10)
    assert seen == [frozenset(), frozenset({A}), frozenset()]


def test_causes_are_the_critical_events_since_the_gpu_was_last_healthy() -> None:
    clock = Clock()
    state = HealthState(book(recover_after=10), lambda uuid: True, clock)
    state.record([HealthEvent(A, 13, "ignored"), HealthEvent(A, 74, "XID 74")])
    state.record([HealthEvent(A, 48, "XID 48")])
    assert {u: [e.xid for e in events] for u, events in state.causes().items()} == {A: [74, 48]}
    state.record([HealthEvent(B, 79, f"XID 79 #{i}") for i in range(20)])
    assert len(state.causes()[B]) == 8  # the most recent ones
    assert state.causes()[B][-1].detail == "XID 79 #19"
    clock.now = 10
    assert state.causes() == {}  # recovered: nothing left to say


def test_watch_with_every_repeats_an_unchanged_state() -> None:
    """What a health stream needs: the kubelet marks a device Unknown unless it is reported
    again within its timeout, changed or not."""
    state = HealthState(book(), lambda uuid: True)
    done = threading.Event()
    seen: list[frozenset[str]] = []

    def watcher() -> None:
        for unhealthy in state.watch(done.is_set, poll=0.05, every=0.1):
            seen.append(unhealthy)
            if len(seen) == 3:
                done.set()

    thread = threading.Thread(target=watcher)
    thread.start()
    thread.join(timeout=10)
    assert seen == [frozenset()] * 3
