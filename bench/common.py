"""What every benchmark prints: samples summarised, and each figure as a ratio to a baseline
measured in the same run, so a slower or faster machine changes neither conclusion."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    name: str
    count: int
    p50_ms: float
    p99_ms: float
    per_second: float | None = None


def timed(call: Callable[[], object], n: int) -> list[float]:
    """The seconds each of `n` calls took."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Until `condition()` holds, looked at every millisecond (what a latency measures to);
    one that never comes fails the bench, naming `what`, where it would hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.001)


def summarise(name: str, seconds: Sequence[float], elapsed: float | None = None) -> Summary:
    """Latency percentiles (ms) of `seconds`; throughput when the wall time `elapsed` is given."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    rate = len(ordered) / elapsed if elapsed else None
    return Summary(name, len(ordered), statistics.median(ordered) * 1e3, p99 * 1e3, rate)


def report(title: str, baseline: Summary, others: Sequence[Summary]) -> str:
    """A table of the summaries with ratios against `baseline` (1.00 = as fast as baseline)."""
    lines = [title, f"{'':28} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'per s':>9} {'p50 ×base':>10}"]
    for s in (baseline, *others):
        rate = f"{s.per_second:9.0f}" if s.per_second else f"{'-':>9}"
        ratio = s.p50_ms / baseline.p50_ms if baseline.p50_ms else float("nan")
        lines.append(
            f"{s.name:28} {s.count:6} {s.p50_ms:9.2f} {s.p99_ms:9.2f} {rate} {ratio:10.2f}"
        )
    return "\n".join(lines)
