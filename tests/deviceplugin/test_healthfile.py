"""The node agent's health state on disk (`deviceplugin/gpus/healthfile.py`) and the health
book handing it every change (`deviceplugin/gpus/state.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.gpus import healthfile
from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.health import Entries, HealthBook, HealthPolicy
from deviceplugin.gpus.state import HealthState
from deviceplugin.statefile import StateError

XID = HealthEvent("GPU-a", 79, "XID 79")
LOST = HealthEvent(None, None, "NVML failed")


def test_times_come_back_on_the_new_clock_as_old_as_they_were(tmp_path: Path) -> None:
    """Saved at monotonic 1000 (wall 50,000), read after a reboot: monotonic 20, wall 50,100."""
    healthfile.save(tmp_path, {"GPU-a": (990.0, (XID, LOST))}, now=1000.0, wall=50_000.0)
    assert healthfile.load(tmp_path, now=20.0, wall=50_100.0) == {
        "GPU-a": (20.0 - 110.0, (XID, LOST))
    }
    # a wall clock set back: no age below zero, the quiet period starts again, not ahead
    assert healthfile.load(tmp_path, now=20.0, wall=40_000.0)["GPU-a"][0] == 20.0


def test_nothing_saved_is_every_device_healthy(tmp_path: Path) -> None:
    assert healthfile.load(tmp_path, 0.0, 0.0) == {}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "Expecting property name"),
        ('{"version": 2, "devices": {}}', "version 2, expected 1"),
        ('{"version": 1, "devices": {"GPU-a": {"since": 1, "causes": [[1, 79, "x"]]}}}',
         "device 1 is not a UUID"),
        ('{"version": 1, "devices": {"GPU-a": {"since": 1, "causes": [["GPU-a", "79", "x"]]}}}',
         "XID '79' is not a number"),
    ],
)  # fmt: skip
def test_an_unreadable_file_is_an_error_naming_it_and_why(
    tmp_path: Path, text: str, why: str
) -> None:
    (tmp_path / healthfile.NAME).write_text(text)
    with pytest.raises(StateError) as caught:
        healthfile.load(tmp_path, 0.0, 0.0)
    assert str(tmp_path / healthfile.NAME) in str(caught.value)
    assert why in str(caught.value)


def test_the_state_hands_over_each_change_and_only_a_change() -> None:
    now = [100.0]
    saved: list[Entries] = []
    book = HealthBook(HealthPolicy(recover_after=10.0), frozenset({"GPU-a", "GPU-b"}))
    book.restore({"GPU-b": (95.0, (LOST,)), "GPU-gone": (95.0, (LOST,))})
    assert book.unhealthy() == {"GPU-b"}  # a device no longer watched is not restored
    state = HealthState(book, lambda uuid: True, clock=lambda: now[0], persist=saved.append)
    state.record([XID])
    assert saved == [{"GPU-a": (100.0, (XID,)), "GPU-b": (95.0, (LOST,))}]
    state.unhealthy()
    state.record([HealthEvent("GPU-a", 13, "XID 13")])  # ignored: nothing changed
    assert len(saved) == 1
    now[0] = 106.0
    assert state.unhealthy() == {"GPU-a"}  # GPU-b's quiet period is over
    assert saved[-1] == {"GPU-a": (100.0, (XID,))}
    now[0] = 111.0
    assert state.unhealthy() == frozenset()
    assert saved[-1] == {}


def test_a_failure_to_keep_it_is_tried_again() -> None:
    saved: list[Entries] = []

    def persist(entries: Entries) -> None:
        if not saved:
            saved.append({})
            raise OSError(28, "No space left on device")
        saved.append(entries)

    book = HealthBook(HealthPolicy(), frozenset({"GPU-a"}))
    state = HealthState(book, lambda uuid: True, clock=lambda: 1.0, persist=persist)
    state.record([XID])
    state.unhealthy()
    assert saved == [{}, {"GPU-a": (1.0, (XID,))}]
