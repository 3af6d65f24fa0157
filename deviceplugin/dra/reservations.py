"""Keeps each prepared claim that no template made bound to the pods it is reserved for.

Such a claim (a pod names it with `resourceClaimName`) serves every pod in its
`status.reservedFor`, and its token binds exactly those (`gpuwire.claimtoken`). The kubelet
prepares a claim once per node: for the next pod that uses it, it finds the claim prepared
and calls no plugin (Kubernetes `pkg/kubelet/cm/dra/manager.go`, `prepareResources`: "If
this claim is already prepared, there is no need to prepare it again"). So the plugin
watches each such claim itself (a watch of that one claim, `fieldSelector=metadata.name`)
for as long as it is prepared, and signs its token again when the pods change
(`Preparer.rebind`). The scheduler reserves the claim for a pod before it binds the pod to
the node, so the token names the pod before the kubelet starts its containers, unless the
watch is slower than the kubelet's pod sync and sandbox; such a start fails with the reason
and the kubelet retries it. A claim generated for one pod is that pod's alone: not watched.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from deviceplugin.dra.prepared import Preparer

log = logging.getLogger(__name__)

TICK = 0.1  # how soon a newly prepared claim is followed
WATCH_SECONDS = 5  # each watch's length: an unprepared claim's watch ends within it


class Reservations:
    def __init__(self, api_client: Any, preparer: Preparer) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        self.resource = client.ResourceV1Api(api_client)
        self.preparer = preparer

    def run(self, stop: threading.Event) -> None:
        """Follow every prepared claim bound to its reservations until `stop` is set."""
        followed: dict[str, threading.Thread] = {}
        while not stop.is_set():
            for uid, claim in list(self.preparer.prepared.items()):
                if not claim.reserved or (uid in followed and followed[uid].is_alive()):
                    continue
                followed[uid] = threading.Thread(
                    target=self._follow, args=(uid, claim.namespace, claim.name, stop),
                    name=f"claim-{uid[:8]}", daemon=True,
                )  # fmt: skip
                followed[uid].start()
            followed = {u: t for u, t in followed.items() if t.is_alive()}
            stop.wait(TICK)
        for thread in followed.values():
            thread.join(timeout=WATCH_SECONDS + 1)

    def _follow(self, uid: str, namespace: str, name: str, stop: threading.Event) -> None:
        """Watch one claim while it is prepared: each event (the first is the claim as it is
        now, so a gap between watches loses nothing) rebinds its token if its pods changed."""
        watch: Any = importlib.import_module("kubernetes.watch")
        while not stop.is_set() and uid in self.preparer.prepared:
            try:
                for event in watch.Watch(return_type="object").stream(  # as JSON, not a model
                    self.resource.list_namespaced_resource_claim,
                    namespace,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=WATCH_SECONDS,
                ):
                    if stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.preparer.rebind(uid, event["raw_object"])
            except Exception as exc:  # the API server may be away: look again soon
                log.debug("watching claim %s/%s: %s", namespace, name, exc)
                stop.wait(1.0)
