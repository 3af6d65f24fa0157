"""The prepared claims, on disk: what NodeUnprepareResources must undo survives the plugin.

The kubelet prepares a claim once per node and unprepares it after its last pod, possibly
after the claim itself is gone from the API, and it does not prepare again after a plugin
restart. So everything unprepare needs — the devices answered, the files written — is kept
here, in `<plugin dir>/checkpoint.json` (NVIDIA's and the example driver's place), written
whole and crash-safe (`deviceplugin.statefile`) before an answer leaves the plugin. One that
is not whole or not what was written is rebuilt from the API server's claims
(`prepared.Preparer`), never believed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin.statefile import read, write

VERSION = 1
NAME = "checkpoint.json"


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    uid: str
    devices: tuple[PreparedDevice, ...]
    files: tuple[str, ...] = ()  # what unprepare removes (the claim's CDI spec, its token)
    gpus: tuple[str, ...] = field(default=())  # the GPUs' and MIG devices' UUIDs
    pods: tuple[str, ...] = ()  # the pods its token binds
    reserved: bool = False  # bound to its status.reservedFor (no template made it): followed


def _claim(raw: Mapping[str, Any]) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(d["requests"]),
            str(d["pool"]),
            str(d["device"]),
            tuple(d["cdi_ids"]),
            d.get("share_id"),
        )
        for d in raw["devices"]
    )
    files, gpus = tuple(raw.get("files") or ()), tuple(raw.get("gpus") or ())
    pods = tuple(str(p) for p in raw.get("pods") or ())
    return PreparedClaim(
        str(raw["namespace"]), str(raw["name"]), str(raw["uid"]), devices, files, gpus, pods,
        raw.get("reserved") is True,
    )  # fmt: skip


def path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory, NAME)


def load(directory: str | os.PathLike[str]) -> dict[str, PreparedClaim]:
    """The prepared claims by UID (none when there is no checkpoint yet); StateError where
    the checkpoint is not whole or not what was written."""
    claims = read(
        path(directory), VERSION, "checkpoint",
        "the claims it held would leak; move it away only once no pod on this node uses a "
        "claim of this driver",
        lambda raw: {uid: _claim(claim) for uid, claim in raw["claims"].items()},
    )  # fmt: skip
    return claims or {}


def save(directory: str | os.PathLike[str], claims: Mapping[str, PreparedClaim]) -> None:
    body = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
    write(directory, NAME, body)
