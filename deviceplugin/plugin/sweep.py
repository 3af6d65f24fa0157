"""Removing the allocation tokens of containers that are gone.

The kubelet keeps every allocation it still holds in its checkpoint file
(`kubelet_internal_checkpoint` in the device plugin directory): per pod and container, the
resource, the device IDs and our Allocate answer (`AllocResp`, the serialized
ContainerAllocateResponse, base64 in the JSON). A token is in use while some answer there
mounts it. A token no answer mounts, older than a grace period (the kubelet writes its
checkpoint just after Allocate returns), belongs to a pod that is gone: it is removed with its
claim. The kubelet drops a pod's entries when it next updates its allocations (at the next
admission), so a token outlives its pod by at most that long. Without a readable checkpoint
nothing is removed: a token wrongly removed fails a container start, one kept costs a file.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from pathlib import Path

from deviceplugin.api import api_pb2
from gpuwire import allocation

log = logging.getLogger(__name__)

CHECKPOINT = "kubelet_internal_checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, so nothing may be swept."""


def tokens_in_use(checkpoint: str) -> set[str]:
    """Tokens mounted by the Allocate answers the kubelet's checkpoint holds."""
    try:
        entries = json.loads(checkpoint)["Data"]["PodDeviceEntries"] or []
        answers = [base64.b64decode(e.get("AllocResp") or "", validate=True) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"unreadable kubelet checkpoint: {exc}") from exc
    tokens = set()
    for raw in answers:
        try:
            answer = api_pb2.ContainerAllocateResponse.FromString(raw)
        except Exception as exc:  # protobuf's DecodeError
            raise CheckpointError(f"unreadable allocation in kubelet checkpoint: {exc}") from exc
        for mount in answer.mounts:
            token = allocation.token_of(mount.container_path)
            if token:
                tokens.add(token)
    return tokens


def sweep(allocation_dir: str, checkpoint_path: Path, grace: float, now: float) -> list[str]:
    """Remove tokens not in use and older than `grace` seconds; returns the tokens removed."""
    try:
        in_use = tokens_in_use(checkpoint_path.read_text())
    except (OSError, CheckpointError) as exc:
        log.info("not sweeping allocations: %s", exc)
        return []
    removed = []
    try:
        names = os.listdir(allocation_dir)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        token = name.lstrip(".").split(".", 1)[0]  # `.TOKEN.PID.tmp`: a write a kill cut short
        if allocation.token_of(allocation.container_path(token)) != token or token in in_use:
            continue
        try:
            age = now - os.lstat(Path(allocation_dir, name)).st_mtime
        except FileNotFoundError:
            continue
        if age < grace:
            continue
        if name.startswith("."):
            Path(allocation_dir, name).unlink(missing_ok=True)
        if token not in removed:
            allocation.remove(allocation_dir, token)
            removed.append(token)
    if removed:
        log.info("removed %d allocation token(s) no pod uses", len(removed))
    return removed


def run(
    allocation_dir: str, kubelet_dir: str, grace: float, interval: float, stop: threading.Event
) -> None:
    while not stop.wait(interval):
        sweep(allocation_dir, Path(kubelet_dir, CHECKPOINT), grace, time.time())
