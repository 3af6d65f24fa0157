"""Prometheus metrics of the webhook: admissions by outcome, warnings by kind, latency,
reloads, fleet size."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from webhook.reload import Reloadable
from webhook.sources import Sources

OUTCOMES = ("mutated", "unchanged", "denied", "skipped", "invalid")
# Mutating webhooks run in sequence on every pod create: the interesting range is sub-10 ms.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _counter(item: Reloadable) -> Callable[[], float]:
    return lambda: item.failures


class Metrics:
    def __init__(self, sources: Sources, watched: dict[str, Reloadable]) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "gpuwire_webhook_admissions",
            "Admission requests answered, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self._by_outcome = {o: self.admissions.labels(o) for o in OUTCOMES}
        self.warnings = Counter(
            "gpuwire_webhook_warnings",
            "Warnings answered with admitted pods, by kind (webhook/warned.py; the log line "
            "names the pod).",
            ["kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpuwire_webhook_admission_duration_seconds",
            "Time from request received to answer ready.",
            buckets=BUCKETS,
            registry=self.registry,
        )
        failures = Gauge(
            "gpuwire_webhook_reload_failures",
            "Changed files (policy, keys, TLS) that failed to load; the previous value stays.",
            ["source"],
            registry=self.registry,
        )
        for name, item in watched.items():
            failures.labels(name).set_function(_counter(item))
        Gauge(
            "gpuwire_webhook_inventory_gpu_nodes",
            "GPU nodes in the webhook's inventory.",
            registry=self.registry,
        ).set_function(lambda: len(sources.fleet.current.nodes))

    def observe(self, outcome: str, seconds: float) -> None:
        self._by_outcome[outcome].inc()
        self.latency.observe(seconds)

    def warned(self, kind: str) -> None:
        self.warnings.labels(kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
