"""NodePrepareResources and NodeUnprepareResources, behind the gRPC layer: the claims this
node has prepared, kept in the checkpoint, and the per-claim outcome of each call.

Both calls are idempotent, as the kubelet needs (it repeats them after its own restart): a
claim already prepared is answered from the checkpoint without reading the API again (its
files written again first where they are gone: a reboot empties the CDI spec directory, a
tmpfs, while the checkpoint and the kubelet's own state stay), and unpreparing one that is
not prepared succeeds, removing any file its UID names. Each claim succeeds or fails alone; a
failed prepare removes what it wrote, so it leaves no file and no checkpoint entry behind.
Calls are serialised (one lock), as the Go kubelet-plugin helper does by default: claims are
few per pod and a prepare takes milliseconds.

A checkpoint that is not whole or not what was written (`deviceplugin.statefile`) is not
believed: the claims are rebuilt from the API server's truth, every claim allocated from this
node's pool and reserved for a pod, prepared again as they were (the taints of now do not
refuse them: they were prepared before), and the bad file is set aside. Until the claims can
be listed the plugin does not start (the file stays, for the next try): starting empty
would drop the files of claims the kubelet holds prepared and hands to new containers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from deviceplugin import statefile
from deviceplugin.dra import checkpoint
from deviceplugin.dra.checkpoint import PreparedClaim, PreparedDevice
from deviceplugin.dra.claims import (
    ClaimError,
    ClaimRef,
    Result,
    owner_pod,
    reserved_pods,
    results,
)
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.taints import Taint
from deviceplugin.statefile import StateError

log = logging.getLogger(__name__)


class Writer(Protocol):
    """What a prepared claim leaves on the node for the container runtime."""

    def write(
        self, ref: ClaimRef, results: Sequence[Result], pods: tuple[str, ...]
    ) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
        """Write the claim's files, its proof bound to the pods of these UIDs; returns the
        CDI device ids per device name, and the files written (all removed again if it
        raises)."""
        ...

    def bind(self, ref: ClaimRef, pods: tuple[str, ...]) -> None:
        """Bind a prepared claim's proof to these pods instead (OSError, ValueError: it
        stays as it was)."""
        ...

    def remove(self, files: Sequence[str]) -> None: ...

    def files_of(self, uid: str) -> tuple[str, ...]:
        """The files a claim of this UID would have (whether it has them or not)."""
        ...

    def orphans(self, known: set[str]) -> list[str]:
        """Files of this writer's kind on the node that no prepared claim lists."""
        ...


ReadClaim = Callable[[str, str], Mapping[str, Any]]
ListClaims = Callable[[], Iterable[Mapping[str, Any]]]


class Preparer:
    def __init__(
        self,
        driver: str,
        pool: str,
        read_claim: ReadClaim,
        devices: Callable[[], Mapping[str, DraDevice]],
        taints: Callable[[], Mapping[str, Sequence[Taint]]],
        writer: Writer,
        directory: str,
        list_claims: ListClaims | None = None,
    ) -> None:
        """`list_claims`: every ResourceClaim of the cluster, what a bad checkpoint is
        rebuilt from."""
        self.driver = driver
        self.pool = pool
        self.read_claim = read_claim
        self.devices = devices
        self.taints = taints
        self.writer = writer
        self.directory = directory
        self._lock = threading.Lock()
        try:
            self.prepared = checkpoint.load(directory)
        except StateError as exc:
            if list_claims is None:
                raise
            self.prepared = self._rebuild(exc, list_claims)
        known = {f for claim in self.prepared.values() for f in claim.files}
        stale = writer.orphans(known)
        if stale:  # a plugin that died between writing a claim's files and the checkpoint
            log.warning("removing %d file(s) of no prepared claim: %s", len(stale), stale)
            writer.remove(stale)

    def _rebuild(self, bad: StateError, list_claims: ListClaims) -> dict[str, PreparedClaim]:
        log.error("%s; rebuilding it from the claims allocated on this node", bad)
        here = []
        for obj in list_claims():  # before anything changes: a failure leaves the file
            meta, status = obj.get("metadata") or {}, obj.get("status") or {}
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
            mine = any(r.get("driver") == self.driver and r.get("pool") == self.pool
                       for r in results or ())  # fmt: skip
            if mine and status.get("reservedFor"):
                here.append((ClaimRef(meta["namespace"], meta["name"], meta["uid"]), obj))
        statefile.set_aside(checkpoint.path(self.directory))
        self.prepared = {}
        for ref, obj in here:
            self._prepare(ref, obj)
        log.warning("checkpoint rebuilt: %d claim(s) prepared again", len(self.prepared))
        return self.prepared

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Claim UID → the prepared claim, or why it could not be prepared."""
        with self._lock:
            return {ref.uid: self._prepare(ref) for ref in refs}

    def _prepare(self, ref: ClaimRef, read: Mapping[str, Any] | None = None) -> PreparedClaim | str:
        """`read`: the claim as the API server has it, where the caller has it already (a
        rebuild: it was prepared before, so the taints of now do not refuse it)."""
        done = self.prepared.get(ref.uid)
        if done is not None:
            if all(os.path.exists(f) for f in done.files):
                return done
            log.warning("claim %s (%s): its files are gone; writing them again", ref, ref.uid)
        files: tuple[str, ...] = ()
        try:
            restored = done is not None or read is not None
            read = read or self.read_claim(ref.namespace, ref.name)
            taints = {} if restored else self.taints()
            found = results(read, ref, self.driver, self.pool, self.devices(), taints)
            owner = owner_pod(read)
            pods = (owner,) if owner else reserved_pods(read)
            cdi_ids, files = self.writer.write(ref, found, pods)
            answered = tuple(
                PreparedDevice(
                    (r.request,), self.pool, r.device.name, cdi_ids[r.device.name], r.share_id
                )
                for r in found
            )
            gpus = tuple(sorted({r.device.uuid for r in found}))
            claim = PreparedClaim(
                ref.namespace, ref.name, ref.uid, answered, files, gpus, pods, owner is None
            )
            checkpoint.save(self.directory, {**self.prepared, ref.uid: claim})
        except ClaimError as exc:
            return self._failed(ref, str(exc), files)
        except Exception as exc:  # the API, the disk: this claim fails, the call goes on
            return self._failed(ref, f"claim {ref}: {exc}", files)
        self.prepared[ref.uid] = claim
        log.info(
            "prepared claim %s (%s): %s", ref, ref.uid, ", ".join(d.device for d in claim.devices)
        )
        return claim

    def _failed(self, ref: ClaimRef, why: str, files: Sequence[str]) -> str:
        if files:
            self.writer.remove(files)
        log.warning("cannot prepare %s (%s): %s", ref, ref.uid, why)
        return why

    def rebind(self, uid: str, read: Mapping[str, Any]) -> None:
        """Bind prepared claim `uid`'s proof to the pods `read` (the claim as the API server
        has it now) is reserved for, where they changed; a claim made from a template stays
        its pod's."""
        with self._lock:
            claim = self.prepared.get(uid)
            if claim is None or not claim.reserved:
                return
            if (read.get("metadata") or {}).get("uid") != uid:
                return  # another claim of that name: this one is gone, unprepare comes
            pods = reserved_pods(read)
            if pods == claim.pods:
                return
            ref = ClaimRef(claim.namespace, claim.name, uid)
            bound = replace(claim, pods=pods)
            try:
                self.writer.bind(ref, pods)
                checkpoint.save(self.directory, {**self.prepared, uid: bound})
            except (OSError, ValueError) as exc:
                log.warning("cannot bind claim %s (%s) to its pods: %s", ref, uid, exc)
                return
            self.prepared[uid] = bound
            log.info("claim %s (%s) is reserved for pod(s) %s", ref, uid, ", ".join(pods))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str | None]:
        """Claim UID → None when it is unprepared (or never was), else why not."""
        with self._lock:
            return {ref.uid: self._unprepare(ref) for ref in refs}

    def _unprepare(self, ref: ClaimRef) -> str | None:
        claim = self.prepared.get(ref.uid)
        if claim is None:  # never prepared, or lost with a bad checkpoint: its files go
            self.writer.remove(self.writer.files_of(ref.uid))
            return None
        try:
            self.writer.remove(claim.files)
            rest = {uid: c for uid, c in self.prepared.items() if uid != ref.uid}
            checkpoint.save(self.directory, rest)
        except OSError as exc:
            log.warning("cannot unprepare %s (%s): %s", ref, ref.uid, exc)
            return f"claim {ref}: {exc}"
        self.prepared = rest
        log.info("unprepared claim %s (%s)", ref, ref.uid)
        return None
