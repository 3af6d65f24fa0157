"""The prepared claims, on disk: what NodeUnprepareResources must undo survives the plugin.

The kubelet prepares a claim once per node and unprepares it after its last pod, possibly
after the claim itself is gone from the API, and it does not prepare again after a plugin
restart. So everything unprepare needs — the devices answered, the files written — is kept
here, in `<plugin dir>/checkpoint.json` (NVIDIA's and the example driver's place), written
whole (`gpuwire.atomicfile`) before an answer leaves the plugin. A checkpoint that cannot be
read stops the plugin with the reason: starting empty would leak every prepared claim.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuwire import atomicfile

VERSION = 1
NAME = "checkpoint.json"
T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint file gpuwire cannot read; the message names it and why."""


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


def load(directory: str | os.PathLike[str]) -> dict[str, PreparedClaim]:
    """The prepared claims by UID (none when there is no checkpoint yet)."""
    claims = read(
        Path(directory, NAME), VERSION, "checkpoint",
        "the claims it held would leak; move it away only once no pod on this node uses a "
        "claim of this driver",
        lambda raw: {uid: _claim(claim) for uid, claim in raw["claims"].items()},
    )  # fmt: skip
    return claims or {}


def read(path: Path, version: int, what: str, lost: str, decode: Callable[[Any], T]) -> T | None:
    """`decode` of the JSON file at `path` (written at `version`); None where there is none.
    A file that cannot be read or decoded is a CheckpointError naming `what` it is, its path,
    why, and what starting without it would lose (`lost`): the plugin's files alike."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{what} {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
        if raw.get("version") != version:
            raise ValueError(f"version {raw.get('version')!r}, expected {version}")
        return decode(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{what} {path} is unreadable ({exc}): {lost}") from None


def write(directory: str | os.PathLike[str], name: str, body: Mapping[str, Any]) -> None:
    """`body` as `<directory>/<name>`, whole, root's alone."""
    os.makedirs(directory, mode=0o750, exist_ok=True)
    atomicfile.replace(os.path.join(directory, name), json.dumps(body, indent=1).encode(), 0o600)


def save(directory: str | os.PathLike[str], claims: Mapping[str, PreparedClaim]) -> None:
    body = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
    write(directory, NAME, body)
