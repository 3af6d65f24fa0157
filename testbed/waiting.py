"""Waiting for something another thread or process does, without timed assertions: the
timeout only bounds a hang, it is not what a test checks."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(0.02)
