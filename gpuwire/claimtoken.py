"""The DRA plugin's proof of a prepared claim, which the runtime side accepts in place of a grant.

NodePrepareResources prepares a ResourceClaim once per node, and the claim then serves every
container that references it: a pod's containers, or, for a claim that was not generated from
a template, every pod the scheduler reserved it for. So the token is bound to the pods the
claim can serve, by UID: the pod that owns it (ownerReferences' controller is a Pod: the
claim was generated for that pod from a ResourceClaimTemplate, Kubernetes
`resource.k8s.io/v1` "ResourceClaim", KEP-4381), else the pods in its `status.reservedFor`
(the kubelet starts no pod a claim is not reserved for). The kubelet does not prepare a
claim again for its next pod, so the DRA plugin follows a prepared claim's `reservedFor` and
signs its token again when it changes (`deviceplugin/dra/reservations.py`).

The plugin writes one token per claim, `<allocation dir>/claims/<claim UID>`, beside the
device plugin's allocation tokens in the root-only host directory, MAC'd with the grant keys:
the claim's namespace, name and UID, the pods it binds, and its devices (the DRA device name, the
UUID NVIDIA_VISIBLE_DEVICES names it by, and whether it is a share of a shared GPU). The
claim's CDI spec mounts the token read-only once per device, each mount in that device's own
container edits, at `/run/gpuwire/allocations/claims/<claim UID>/<device>`: the kubelet hands a
container the CDI ids of only the devices of the requests it references, so the mounts a
container carries name exactly the devices the engine gave it. Unprepare removes the token.

Like `gpuwire.allocation`, which this follows, the node side imports this module on every
container start: reading uses `gpuwire.lightjson` and `gpuwire.grant`'s MAC; what only writing
needs (json) is imported there.
"""

from __future__ import annotations

import os

from gpuwire import allocation, atomicfile
from gpuwire.grant import KeyRing, hmac_sha256
from gpuwire.value import Value

SUBDIR = "claims"  # under the allocation dir
CONTAINER_DIR = f"{allocation.CONTAINER_DIR}/{SUBDIR}"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


class ClaimTokenError(ValueError):
    """A claim token that does not prove a prepared claim, or cannot be written."""


def valid_uid(uid: str) -> bool:
    """A claim UID as the API server makes them (a UUID), safe as a file name: lowercase
    letters, digits and `-`, at most 64."""
    return 0 < len(uid) <= 64 and set(uid) <= _NAME_CHARS and uid[0] != "-"


def valid_device(name: str) -> bool:
    """A DRA device name: a DNS label (`resource.k8s.io/v1` Device.name)."""
    return 0 < len(name) <= 63 and set(name) <= _NAME_CHARS and "-" not in (name[0], name[-1])


class ClaimDevice(Value):
    """One device of a prepared claim."""

    __slots__ = _fields = ("name", "uuid", "share")
    name: str  # the DRA device, `gpu-<minor>`
    uuid: str  # what NVIDIA_VISIBLE_DEVICES names it by: the GPU's (or MIG device's) UUID
    share: bool  # a share of a shared GPU (the allocation has a shareID)

    def __init__(self, name: str, uuid: str, share: bool = False) -> None:
        self._set(name=name, uuid=uuid, share=share)


class ClaimToken(Value):
    __slots__ = _fields = ("uid", "namespace", "name", "pods", "devices")
    uid: str
    namespace: str
    name: str
    pods: tuple[str, ...]  # the UIDs of the pods it may serve, sorted
    devices: tuple[ClaimDevice, ...]  # sorted by name

    def __init__(
        self,
        uid: str,
        namespace: str,
        name: str,
        pods: tuple[str, ...],
        devices: tuple[ClaimDevice, ...],
    ) -> None:
        self._set(
            uid=uid,
            namespace=namespace,
            name=name,
            pods=tuple(sorted(set(pods))),
            devices=tuple(sorted(devices, key=lambda d: d.name)),
        )

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name}"

    def message(self) -> bytes:
        devices = ",".join(f"{d.name}={d.uuid}{'/share' if d.share else ''}" for d in self.devices)
        fields = ("gpuwire-claim-v2", self.uid, self.namespace, self.name, ",".join(self.pods))
        return "\0".join((*fields, devices)).encode()

    def device(self, name: str) -> ClaimDevice | None:
        return next((d for d in self.devices if d.name == name), None)

    def refusal(self, namespace: str | None, pod: str | None) -> str | None:
        """Why a container of pod `pod` (its UID) in `namespace`, as the runtime's own CRI
        annotations name them, may not use this claim; None where it may."""
        if namespace is None:
            return f"{self}: the spec names no pod namespace to check it against"
        if namespace != self.namespace:
            return f"{self} is in namespace {self.namespace}, not {namespace}"
        if pod in self.pods:
            return None
        named = f"pod{'s' if len(self.pods) > 1 else ''} {', '.join(self.pods) or '(none)'}"
        if pod is None:
            return f"{self} is reserved for {named}; the spec names no pod UID"
        return f"{self} is reserved for {named}, not {pod}"


def directory(allocation_dir: str) -> str:
    return f"{allocation_dir.rstrip('/')}/{SUBDIR}"


def path(allocation_dir: str, uid: str) -> str:
    """Where the token of claim `uid` is, under the allocation dir."""
    return f"{directory(allocation_dir)}/{uid}"


def container_path(uid: str, device: str) -> str:
    return f"{CONTAINER_DIR}/{uid}/{device}"


def mount_of(destination: str) -> tuple[str, str] | None:
    """(claim UID, device) a container mount destination names, if it is a claim mount."""
    parent, _, device = destination.rstrip("/").rpartition("/")
    base, _, uid = parent.rpartition("/")
    if base == CONTAINER_DIR and valid_uid(uid) and valid_device(device):
        return uid, device
    return None


def _mac(keys: KeyRing, key_id: str, token: ClaimToken) -> str:
    return hmac_sha256(keys.keys[key_id], token.message())


def write(allocation_dir: str, token: ClaimToken, keys: KeyRing, entry: bool = True) -> str:
    """Write `token` whole (root-only directory, the file world-readable as a mount source,
    as allocation tokens are); returns its path. ClaimTokenError where its names are not
    ones a file is named by; GrantError without a key. `entry`: as `atomicfile.replace`'s."""
    import json

    bad = [d.name for d in token.devices if not valid_device(d.name)]
    if not valid_uid(token.uid) or bad:
        raise ClaimTokenError(
            f"{token}: UID {token.uid!r} or device {bad} is not one gpuwire names a file by"
        )
    key_id = keys.signing_id
    body = {
        "namespace": token.namespace,
        "name": token.name,
        "pods": list(token.pods),
        "devices": [[d.name, d.uuid, d.share] for d in token.devices],
        "key": key_id,
        "mac": _mac(keys, key_id, token),
    }
    os.makedirs(allocation_dir, mode=0o700, exist_ok=True)
    os.makedirs(directory(allocation_dir), mode=0o700, exist_ok=True)
    target = path(allocation_dir, token.uid)
    atomicfile.replace(target, json.dumps(body).encode(), 0o644, entry=entry)
    return target


def read(allocation_dir: str, uid: str, keys: KeyRing) -> ClaimToken:
    """The token of claim `uid`, verified; ClaimTokenError says why not."""
    if not valid_uid(uid):
        raise ClaimTokenError(f"malformed claim UID {uid!r}")
    try:
        body = allocation.read_proof(path(allocation_dir, uid))
        pods, devices = body["pods"], body["devices"]
        token = ClaimToken(
            uid,
            str(body["namespace"]),
            str(body["name"]),
            tuple(str(p) for p in pods),
            tuple(ClaimDevice(str(n), str(u), s is True) for n, u, s in devices),
        )
        key_id, mac = str(body["key"]), str(body["mac"])
    except OSError as exc:
        raise ClaimTokenError(
            f"claim {uid}: no token on this node ({exc.strerror}): not prepared here, or unprepared"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ClaimTokenError(f"claim {uid}: its token is unreadable") from exc
    refusal = allocation.mac_refusal(keys, key_id, mac, token.message())
    if refusal:
        raise ClaimTokenError(f"{token}: its token {refusal}")
    return token
