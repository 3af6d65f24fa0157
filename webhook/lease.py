"""Leader election among the webhook's replicas on a `coordination.k8s.io/v1` Lease, as
client-go's `tools/leaderelection` does it, for work one replica at a time must do.

A candidate reads the Lease; an absent one it creates holding it. A Lease held by another is
taken only once it has not changed for `leaseDurationSeconds` as this candidate observed it
(its own clock, never the holder's `renewTime`: clocks differ). The holder renews every
`retry` seconds; every write is an update at the resourceVersion read, so of two candidates
writing at once one gets a 409 and stays a follower. A holder that has not renewed within
`renew_deadline` stops acting as the leader before another can take over (the deadline is
shorter than the duration). Leaving gives the Lease up (an empty holder), so that another
replica takes over at its next try. The Python client's own `leaderelection` package is not
used: it runs forever on the client's global configuration, with no way to stop it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)


def _micro_time(at: float) -> str:
    """A MicroTime as the API server writes it."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Lease:
    """One candidate for the Lease `namespace/name`."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        renew_deadline: float = 10.0,
    ) -> None:
        self.api: Any = api  # the client's methods are untyped
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_deadline = renew_deadline
        self._observed: tuple[Any, ...] | None = None  # holder, renewTime, transitions
        self._observed_at = 0.0  # monotonic, when it last changed
        self._renewed_at: float | None = None  # monotonic, our last successful write

    @property
    def leading(self) -> bool:
        return (
            self._renewed_at is not None
            and time.monotonic() - self._renewed_at < self.renew_deadline
        )

    def try_acquire_or_renew(self) -> bool:
        """One try; whether this candidate holds the Lease now."""
        now, wall = time.monotonic(), time.time()
        try:
            lease = json.loads(
                self.api.read_namespaced_lease(
                    self.name, self.namespace, _preload_content=False
                ).data
            )
        except client.ApiException as exc:
            if exc.status != 404:
                log.warning("lease %s/%s: %s %s", self.namespace, self.name, exc.status, exc.reason)
                return self.leading
            body = {"metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(wall, wall, 0)}  # fmt: skip
            return self._write(self.api.create_namespaced_lease, now, self.namespace, body)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.get("leaseDurationSeconds") or self.duration
        if holder and holder != self.identity and now - self._observed_at < duration:
            self._renewed_at = None
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        kept = spec.get("acquireTime") if holder == self.identity else None
        acquired = str(kept) if kept else _micro_time(wall)
        lease["spec"] = self._spec(acquired, wall, transitions)
        return self._write(self.api.replace_namespaced_lease, now, self.name, self.namespace, lease)

    def _spec(self, acquired: float | str, renewed: float, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": acquired if isinstance(acquired, str) else _micro_time(acquired),
            "renewTime": _micro_time(renewed),
            "leaseTransitions": transitions,
        }

    def _write(self, call: Callable[..., Any], now: float, *args: Any) -> bool:
        try:
            call(*args)
        except client.ApiException as exc:
            if exc.status != 409:  # 409: another candidate wrote first
                log.warning("lease %s/%s: %s %s", self.namespace, self.name, exc.status, exc.reason)
            return self.leading
        if self._renewed_at is None:
            log.info("lease %s/%s: %s leads", self.namespace, self.name, self.identity)
        self._renewed_at = now
        return True

    def release(self) -> None:
        """Give the Lease up, if this candidate holds it."""
        if not self.leading:
            return
        self._renewed_at = None
        try:
            lease = json.loads(
                self.api.read_namespaced_lease(
                    self.name, self.namespace, _preload_content=False
                ).data
            )
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] |= {"holderIdentity": "", "leaseDurationSeconds": 1}
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except client.ApiException as exc:
            log.warning(
                "lease %s/%s not released: %s %s", self.namespace, self.name, exc.status, exc.reason
            )


class Leader:
    """Runs `work` every `period` seconds while `lease` is held (trying every `retry`), in a
    thread of its own; `stop` gives the Lease up."""

    def __init__(
        self, lease: Lease, work: Callable[[], object], period: float = 60.0, retry: float = 2.0
    ) -> None:
        self.lease = lease
        self.work = work
        self.period = period
        self.retry = retry
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuwire-leader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.lease.release()

    def _run(self) -> None:
        due = 0.0
        while not self._stop.is_set():
            try:
                if self.lease.try_acquire_or_renew() and time.monotonic() >= due:
                    due = time.monotonic() + self.period
                    self.work()
            except Exception as exc:  # the API server away: try again at the next round
                log.warning("leader work: %s", exc)
            self._stop.wait(self.retry)
