"""The device plugin's proof of allocation, which the runtime side accepts in place of a grant.

Allocate sees device IDs, not the pod, so it cannot sign a namespace and container name.
Instead it writes a token file into a root-only host directory and answers with a read-only
bind mount of that file at `/run/gpuwire/allocations/<token>`. The kubelet adds that mount;
a pod author can neither add a mount whose source is in that host directory (that needs a
hostPath volume, which Pod Security `baseline` forbids) nor replay one: the first sandbox
that starts with a token claims it, and another sandbox presenting it is refused. The token's
content is MAC'd with the grant keys, so a file planted elsewhere proves nothing either.
The node side imports this module on every container start: it reads tokens with
`gpuwire.lightjson` and `gpuwire.grant`'s MAC, and what only writing one needs (json,
secrets) is imported there.
"""

from __future__ import annotations

import os

from gpuwire import lightjson
from gpuwire.grant import KeyRing, hmac_sha256, mac_matches
from gpuwire.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

DEFAULT_DIR = "/var/lib/gpuwire/allocations"
CONTAINER_DIR = "/run/gpuwire/allocations"


def _is_token(text: str) -> bool:
    """32 lowercase hex digits."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


class AllocationError(ValueError):
    """A token that does not prove an allocation."""


class Allocation(Record):
    __slots__ = _fields = ("token", "resource", "devices")
    token: str
    resource: str
    devices: tuple[str, ...]  # physical GPU UUIDs, sorted

    def __init__(self, token: str, resource: str, devices: tuple[str, ...]) -> None:
        self._set(token=token, resource=resource, devices=devices)

    def message(self) -> bytes:
        fields = ("gpuwire-alloc-v1", self.token, self.resource, ",".join(self.devices))
        return "\0".join(fields).encode()


def _mac(keys: KeyRing, key_id: str, allocation: Allocation) -> str:
    return hmac_sha256(keys.keys[key_id], allocation.message())


def write(
    directory: str | os.PathLike[str], resource: str, uuids: Iterable[str], keys: KeyRing
) -> Allocation:
    """Record an allocation; returns it (its token names the file and the container mount)."""
    import json
    import secrets

    allocation = Allocation(secrets.token_hex(16), resource, tuple(sorted(set(uuids))))
    key_id = keys.signing_id
    body = {
        "resource": allocation.resource,
        "devices": list(allocation.devices),
        "key": key_id,
        "mac": _mac(keys, key_id, allocation),
    }
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, allocation.token)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(body))
    os.replace(tmp, path)
    return allocation


def container_path(token: str) -> str:
    return f"{CONTAINER_DIR}/{token}"


def token_of(destination: str) -> str | None:
    """The token a container mount destination carries, if it is an allocation mount."""
    parent, _, token = destination.rstrip("/").rpartition("/")
    return token if parent == CONTAINER_DIR and _is_token(token) else None


def read(directory: str | os.PathLike[str], token: str, keys: KeyRing) -> Allocation:
    """The allocation behind `token`, verified; AllocationError says why not."""
    if not _is_token(token):
        raise AllocationError(f"malformed allocation token {token!r}")
    try:
        fd = os.open(os.path.join(directory, token), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise AllocationError(
            f"allocation {token} not found on this node ({exc.strerror})"
        ) from exc
    with os.fdopen(fd, "rb") as f:
        try:
            body = lightjson.loads(f.read())
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            allocation = Allocation(token, str(body["resource"]), tuple(body["devices"]))
            key_id, mac = str(body["key"]), str(body["mac"])
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise AllocationError(f"allocation {token} is unreadable") from exc
    if key_id not in keys.keys:
        raise AllocationError(f"allocation {token} is signed with unknown key {key_id!r}")
    if not mac_matches(_mac(keys, key_id, allocation), mac):
        raise AllocationError(f"allocation {token} has an invalid MAC")
    return allocation


def claim(directory: str | os.PathLike[str], token: str, sandbox: str) -> None:
    """Bind `token` to the first pod sandbox that uses it; refuse any other sandbox.

    Containers of one sandbox (restarts, several containers) may present it again.
    """
    path = os.path.join(directory, f"{token}.claim")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        with open(path) as f:
            owner = f.read()
        if owner != sandbox:
            raise AllocationError(
                f"allocation {token} belongs to sandbox {owner[:12]}, not {sandbox[:12]}"
            ) from None
        return
    with os.fdopen(fd, "w") as f:
        f.write(sandbox)


def remove(directory: str | os.PathLike[str], token: str) -> None:
    """Forget an allocation (the plugin sweeps tokens of pods that are gone)."""
    import contextlib

    for name in (token, f"{token}.claim"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
