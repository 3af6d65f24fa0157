"""The device plugin's proof of allocation, which the runtime side accepts in place of a grant.

Allocate sees device IDs, not the pod, so it cannot sign a namespace and container name.
Instead it writes a token file into a root-only host directory and answers with a read-only
bind mount of that file at `/run/gpuwire/allocations/<token>`. The kubelet adds that mount;
a pod author can neither add a mount whose source is in that host directory (that needs a
hostPath volume, which Pod Security `baseline` forbids) nor replay one: the first pod that
starts with a token claims it, and another pod presenting it is refused. The token's
content is MAC'd with the grant keys, so a file planted elsewhere proves nothing either.

A claim binds the token to the pod's UID where the runtime writes it into the spec
(containerd >= 1.6.11 and 1.7: `io.kubernetes.cri.sandbox-uid`; CRI-O: the kubelet's
`io.kubernetes.pod.uid` label, which it copies into the annotations), so the pod keeps its
GPU when its sandbox is recreated (the pause container died; a node reboot, after which the
kubelet reuses its checkpointed Allocate answer). Where the spec carries no UID (older
containerd) the claim binds the sandbox id, as it always did. A claim written before UIDs
were read (the sandbox id alone) takes the UID from the first container of that same sandbox
that presents it.

The node side imports this module on every container start: it reads tokens with
`gpuwire.lightjson` and `gpuwire.grant`'s MAC, and what only writing one needs (json,
secrets) is imported there.
"""

from __future__ import annotations

import os

from gpuwire import atomicfile, lightjson
from gpuwire.grant import KeyRing, hmac_sha256, mac_matches
from gpuwire.value import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

DEFAULT_DIR = "/var/lib/gpuwire/allocations"
CONTAINER_DIR = "/run/gpuwire/allocations"


def _is_token(text: str) -> bool:
    """32 lowercase hex digits."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


class AllocationError(ValueError):
    """A token that does not prove an allocation."""


class Share(Value):
    """What one replica of a shared GPU may use, and the mechanism that holds it to that:
    the device plugin writes it into the token of a replica, the runtime applies it."""

    __slots__ = _fields = ("mechanism", "memory_mib", "cores")
    mechanism: str  # hami, mps
    memory_mib: int
    cores: int  # percent of the SMs (MPS: of the active threads)

    def __init__(self, mechanism: str, memory_mib: int, cores: int) -> None:
        self._set(mechanism=mechanism, memory_mib=memory_mib, cores=cores)

    def text(self) -> str:
        return f"{self.mechanism}:{self.memory_mib}:{self.cores}"

    @classmethod
    def parse(cls, text: str) -> Share:
        mechanism, memory, cores = text.split(":")
        if mechanism not in ("hami", "mps"):
            raise ValueError(f"unknown mechanism {mechanism!r}")
        return cls(mechanism, int(memory), int(cores))


class Allocation(Value):
    __slots__ = _fields = ("token", "resource", "devices", "share")
    token: str
    resource: str
    devices: tuple[str, ...]  # physical GPU UUIDs, sorted
    share: Share | None  # a replica's share of its GPU, where a mechanism holds it

    def __init__(
        self, token: str, resource: str, devices: tuple[str, ...], share: Share | None = None
    ) -> None:
        self._set(token=token, resource=resource, devices=devices, share=share)

    def message(self) -> bytes:
        fields = ["gpuwire-alloc-v1", self.token, self.resource, ",".join(self.devices)]
        if self.share is not None:  # signed with the rest: a pod cannot widen its share
            fields.append(self.share.text())
        return "\0".join(fields).encode()


def _mac(keys: KeyRing, key_id: str, allocation: Allocation) -> str:
    return hmac_sha256(keys.keys[key_id], allocation.message())


def write(
    directory: str | os.PathLike[str],
    resource: str,
    uuids: Iterable[str],
    keys: KeyRing,
    share: Share | None = None,
) -> Allocation:
    """Record an allocation; returns it (its token names the file and the container mount)."""
    import json
    import secrets

    allocation = Allocation(secrets.token_hex(16), resource, tuple(sorted(set(uuids))), share)
    key_id = keys.signing_id
    body = {
        "resource": allocation.resource,
        "devices": list(allocation.devices),
        "key": key_id,
        "mac": _mac(keys, key_id, allocation),
    }
    if share is not None:
        body["share"] = share.text()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    atomicfile.replace(os.path.join(directory, allocation.token), json.dumps(body).encode(), 0o644)
    return allocation


def container_path(token: str) -> str:
    return f"{CONTAINER_DIR}/{token}"


def token_of(destination: str) -> str | None:
    """The token a container mount destination carries, if it is an allocation mount."""
    parent, _, token = destination.rstrip("/").rpartition("/")
    return token if parent == CONTAINER_DIR and _is_token(token) else None


def read_proof(path: str) -> dict[str, Any]:
    """A proof file's JSON object (an allocation or claim token), opened without following
    a link: OSError where there is no such file, ValueError where it is not one."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        body = lightjson.loads(f.read())
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def mac_refusal(keys: KeyRing, key_id: str, mac: str, message: bytes) -> str | None:
    """Why `mac` is not the MAC of `message` under key `key_id`, or None where it is."""
    if key_id not in keys.keys:
        return f"is signed with unknown key {key_id!r}"
    if not mac_matches(hmac_sha256(keys.keys[key_id], message), mac):
        return "has an invalid MAC"
    return None


def read(directory: str | os.PathLike[str], token: str, keys: KeyRing) -> Allocation:
    """The allocation behind `token`, verified; AllocationError says why not."""
    if not _is_token(token):
        raise AllocationError(f"malformed allocation token {token!r}")
    try:
        body = read_proof(os.path.join(directory, token))
        share = Share.parse(str(body["share"])) if "share" in body else None
        allocation = Allocation(token, str(body["resource"]), tuple(body["devices"]), share)
        key_id, mac = str(body["key"]), str(body["mac"])
    except OSError as exc:
        raise AllocationError(
            f"allocation {token} not found on this node ({exc.strerror})"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise AllocationError(f"allocation {token} is unreadable") from exc
    refusal = mac_refusal(keys, key_id, mac, allocation.message())
    if refusal:
        raise AllocationError(f"allocation {token} {refusal}")
    return allocation


# (sandbox id, pod UID) annotation keys: containerd's CRI plugin, then CRI-O.
OWNER_ANNOTATIONS = (
    ("io.kubernetes.cri.sandbox-id", "io.kubernetes.cri.sandbox-uid"),
    ("io.kubernetes.cri-o.SandboxID", "io.kubernetes.pod.uid"),
)


class Owner(Value):
    """Whom a token is bound to: a pod, by its UID where the runtime names it, else by its
    sandbox."""

    __slots__ = _fields = ("sandbox", "pod")
    sandbox: str
    pod: str | None  # the pod's UID

    def __init__(self, sandbox: str, pod: str | None = None) -> None:
        self._set(sandbox=sandbox, pod=pod or None)

    def text(self) -> str:
        return (f"pod={self.pod}\n" if self.pod else "") + f"sandbox={self.sandbox}\n"

    @classmethod
    def parse(cls, text: str) -> Owner:
        """A claim file's content; one without `=` is a sandbox id (claims before UIDs)."""
        if "=" not in text:
            return cls(text)
        fields = dict(line.partition("=")[::2] for line in text.splitlines())
        return cls(fields.get("sandbox", ""), fields.get("pod"))

    def refusal(self, other: Owner) -> str | None:
        """Why `other` is not this owner (pod UIDs compared where both have one), or None."""
        if self.pod and other.pod:
            return None if self.pod == other.pod else f"pod {self.pod}, not {other.pod}"
        if self.sandbox == other.sandbox:
            return None
        return f"sandbox {self.sandbox[:12]}, not {other.sandbox[:12]}"


def owner_of(annotations: Mapping[str, str]) -> Owner | None:
    """The pod a container spec's CRI annotations name, if they name its sandbox."""
    for sandbox_key, pod_key in OWNER_ANNOTATIONS:
        if annotations.get(sandbox_key):
            return Owner(annotations[sandbox_key], annotations.get(pod_key))
    return None


def _checked(owner: Owner) -> Owner:
    for what, value in (("sandbox id", owner.sandbox), ("pod UID", owner.pod)):
        if value is not None and not (value.isprintable() and value and "=" not in value):
            raise AllocationError(f"{what} {value!r} is not one gpuwire can bind a token to")
    return owner


def _claimed(path: str, token: str) -> Owner | None:
    """The claim's owner; a claim that is not whole (`Owner.text` ends with its sandbox line)
    or not text is refused: no pod may have a token whose owner cannot be told."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode()
        owner = Owner.parse(text)
        if not owner.sandbox or ("=" in text and not text.endswith("\n")):
            raise ValueError("cut short")
    except ValueError as exc:
        raise AllocationError(
            f"allocation {token}'s claim {path} is unreadable ({exc}): whom it belongs to "
            "cannot be told, so no pod gets it"
        ) from None
    return owner


def _publish(path: str, text: str, *, replace: bool) -> bool:
    """Put `text` at `path` whole, never half-written: a new file (False when another
    process made one first) or, with `replace`, in place of the old one."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        if os.path.lexists(tmp):  # ours alone (the pid is in its name); gone once replaced
            os.unlink(tmp)


def claim(
    directory: str | os.PathLike[str],
    token: str,
    sandbox: str,
    pod: str | None = None,
    *,
    write: bool = True,
) -> Owner:
    """Bind `token` to the first pod that presents it; refuse any other. Returns its owner.

    The same pod may present it again: its other containers, restarts, and (where `pod`, the
    pod's UID, is known) a new sandbox. Without `write` (troubleshooting) nothing is written:
    the answer is what a container start would get.
    """
    presenter = _checked(Owner(sandbox, pod))
    path = os.path.join(directory, f"{token}.claim")
    owner = _claimed(path, token)
    if owner is None:
        if not write or _publish(path, presenter.text(), replace=False):
            return presenter
        owner = _claimed(path, token) or presenter  # another start claimed it a moment ago
    refusal = owner.refusal(presenter)
    if refusal:
        raise AllocationError(f"allocation {token} belongs to {refusal}")
    if owner.pod is None and presenter.pod is not None:
        owner = Owner(owner.sandbox, presenter.pod)  # the same sandbox: its pod's UID
        if write:
            _publish(path, owner.text(), replace=True)
    return owner


def remove(directory: str | os.PathLike[str], token: str) -> None:
    """Forget an allocation (the plugin sweeps tokens of pods that are gone)."""
    import contextlib

    for name in (token, f"{token}.claim"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
