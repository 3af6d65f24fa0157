"""Keeps this node's ResourceSlices in the API server what they should be (`slices.plan`).

It looks again the moment health changes (the plugin wakes it: a fault's taint is in the API
server within milliseconds), every 0.2 s for a change no one woke it for, on every change
to the pool's slices that its watch sees (the kubelet deletes a driver's slices when the
plugin is gone for 30 s and all of a node's slices when it starts: they are made again at
once), and every `resync` seconds. Each look is one list; it writes only what differs.

Device taints need DRADeviceTaints (on by default from 1.36): an API server without it drops
them on write. The publisher checks what the server stored; where a taint was dropped it
leaves unhealthy GPUs out of the slices instead, so the scheduler still places no new claim
on them, and says so once in the log.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceplugin.dra import slices
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.taints import Taint

log = logging.getLogger(__name__)

RESYNC = 30.0
TICK = 0.2
WATCH_SECONDS = 5


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Publisher:
    def __init__(
        self,
        api_client: Any,
        driver: str,
        node: str,
        devices: Callable[[], Sequence[DraDevice]],
        taints: Callable[[], Mapping[str, Sequence[Taint]]],
        resync: float = RESYNC,
    ) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        self.core = client.CoreV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.driver = driver
        self.node = node
        self.devices = devices
        self.taints = taints
        self.resync = resync
        self.selector = f"spec.driver={driver},spec.nodeName={node}"
        self.taints_dropped = False
        self.wake = threading.Event()
        self.generation = 0
        self._pool: slices.Pool | None = None

    def pool(self) -> slices.Pool:
        if self._pool is None:
            uid = self.core.read_node(self.node).metadata.uid
            self._pool = slices.Pool(self.driver, self.node, uid)
        return self._pool

    def published(self) -> list[dict[str, Any]]:
        response = self.resource.list_resource_slice(
            field_selector=self.selector, _preload_content=False
        )
        return list(json.loads(response.data)["items"])

    def step(self) -> slices.Plan:
        """Look once and write what differs; returns what was written."""
        taints = self.taints()
        omit = set(taints) if self.taints_dropped else set()
        wanted = slices.wanted(self.pool(), self.devices(), {} if omit else taints, omit)
        plan = slices.plan(wanted, self.published(), rfc3339(time.time()))
        stored = []
        for obj in plan.create:
            stored.append(self._answer(self.resource.create_resource_slice(obj, **_RAW)))
        for obj in plan.update:
            name = obj["metadata"]["name"]
            stored.append(self._answer(self.resource.replace_resource_slice(name, obj, **_RAW)))
        for name in plan.delete:
            self.resource.delete_resource_slice(name)
        if not plan.empty:
            self.generation = plan.generation
            log.info(
                "pool %s generation %d: %d slice(s) created, %d updated, %d deleted",
                self.node,
                plan.generation,
                len(plan.create),
                len(plan.update),
                len(plan.delete),
            )
        if not self.taints_dropped and _dropped(plan.create + plan.update, stored):
            self.taints_dropped = True
            log.warning(
                "the API server dropped device taints (DRADeviceTaints is off): unhealthy "
                "GPUs are left out of the ResourceSlices until they recover"
            )
            return self.step()
        return plan

    def _answer(self, response: Any) -> dict[str, Any]:
        return dict(json.loads(response.data))

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop` is set: on a health change, a slice change, every resync."""
        watcher = threading.Thread(target=self._watch, args=(stop,), name="slices", daemon=True)
        watcher.start()
        last: Mapping[str, Sequence[Taint]] | None = None
        due = 0.0
        while not stop.is_set():
            taints = self.taints()
            if taints != last or self.wake.is_set() or time.monotonic() >= due:
                self.wake.clear()
                try:
                    self.step()
                    last, due = taints, time.monotonic() + self.resync
                except Exception as exc:  # the API server may be away: look again soon
                    log.warning("publishing ResourceSlices failed: %s", exc)
                    due = time.monotonic() + 1.0
            self.wake.wait(TICK)
        watcher.join(timeout=WATCH_SECONDS + 1)

    def _watch(self, stop: threading.Event) -> None:
        watch: Any = importlib.import_module("kubernetes.watch")
        while not stop.is_set():
            try:
                for _ in watch.Watch().stream(
                    self.resource.list_resource_slice,
                    field_selector=self.selector,
                    timeout_seconds=WATCH_SECONDS,
                ):
                    self.wake.set()
                    if stop.is_set():
                        break
            except Exception as exc:
                log.debug("watching ResourceSlices: %s", exc)
                stop.wait(1.0)


_RAW = {"_preload_content": False}


def _dropped(sent: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]]) -> bool:
    """Whether a slice sent with taints came back without them."""
    for wanted, got in zip(sent, stored, strict=True):
        kept = {d["name"]: d.get("taints") for d in got.get("spec", {}).get("devices") or ()}
        if any(d.get("taints") and not kept.get(d["name"]) for d in wanted["spec"]["devices"]):
            return True
    return False
