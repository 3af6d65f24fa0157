"""GPUWIRE_GRANT: proof that the cluster, not the pod author, chose a container's GPUs.

The webhook signs what it granted; the node side recomputes the MAC from the OCI spec.
`GPUWIRE_GRANT=<key-id>:<hex HMAC-SHA256>` over namespace, container name, the canonical
device request, the canonical capabilities, the pod and the limits. Namespace and container
name come from the CRI annotations on the node, so a grant copied into another namespace or
container is void. The pod is the admission that created it: the webhook writes its request
UID into the pod as `gpuwire.io/grant-pod` (replacing any value the pod came with), and
containerd passes that one pod annotation into the container's spec (`pod_annotations`,
`gpuwire containerd configure`); the pod's UID itself is not known to a mutating webhook at
CREATE (the API server assigns it after), and a pod's name often is not either
(`generateName`). So a grant copied into another pod of the namespace (another admission,
or none: a pod no webhook saw has no such annotation) is void, and so is one whose limits
(`LIMITS`: the variables MPS and HAMi-core read, `bound_limits`) differ from what was
signed: a copy without the limit env, or with a looser one added (`envFrom`, the image's
`ENV`), grants nothing. Grants made before they bound a pod verify nowhere.
Keys are files in a directory (a mounted Secret), one key each, named by key id; every key
verifies, the newest-named one signs, which is how keys rotate without a failed start.
Imports are kept to what the node side needs on every container start (see gpuwire.value):
the MAC is computed here on CPython's own SHA-256, because `hmac` and `hashlib` load OpenSSL
(`_hashlib`, ~3 ms) on every GPU container start.
"""

from __future__ import annotations

import os
from _operator import _compare_digest as compare_digest  # what hmac.compare_digest falls back to

from gpuwire import hamicore, mps, nvidia
from gpuwire.value import Value
from gpuwire.vendor import NVIDIA, VENDORS, Vendor, of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from hashlib import _Hash

ENV = "GPUWIRE_GRANT"
DEFAULT_KEY_DIR = "/etc/gpuwire/keys"
# The device field of a grant whose devices the device plugin chooses at Allocate.
PLUGIN_DEVICES = "plugin"

POD_ANNOTATION = "gpuwire.io/grant-pod"  # the admission a grant binds (module docstring)
VERSION = "gpuwire-grant/2"  # what the message starts with: pod and limits bound
# (namespace, container name) annotation keys: containerd CRI, then CRI-O.
SUBJECT_ANNOTATIONS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.container-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.container.name"),
)

_KEY_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _is_key_id(name: str) -> bool:
    """`[A-Za-z0-9][A-Za-z0-9._-]{0,62}`: a key file name, never a Secret volume's `..data`."""
    return (
        0 < len(name) <= 63 and name[0].isalnum() and name.isascii() and set(name) <= _KEY_ID_CHARS
    )


def _sha256() -> Callable[[bytes], _Hash]:
    """CPython's builtin SHA-256 (`_sha256`; `_sha2` from 3.12), else OpenSSL's: builds
    that leave the builtin hashes out (Fedora, RHEL) have only that one."""
    for name in ("_sha256", "_sha2"):
        try:
            sha256: Callable[[bytes], _Hash] = __import__(name).sha256
        except ImportError:
            continue
        return sha256
    import hashlib

    return hashlib.sha256


_BLOCK = 64  # SHA-256's block size in bytes
_INNER = bytes(b ^ 0x36 for b in range(256))  # RFC 2104 ipad, as a translation table
_OUTER = bytes(b ^ 0x5C for b in range(256))  # opad


def hmac_sha256(key: bytes, message: bytes) -> str:
    """HMAC-SHA256 (RFC 2104) of `message` under `key`, as hex: `hmac.new(key, message,
    hashlib.sha256).hexdigest()` without importing OpenSSL."""
    inner, outer = _padded(key)
    inner = inner.copy()
    inner.update(message)
    outer = outer.copy()
    outer.update(inner.digest())
    return outer.hexdigest()


_PADDED: dict[bytes, tuple[_Hash, _Hash]] = {}  # key → its hashes after the padded key
_PADDED_KEPT = 16  # more distinct keys than a key ring holds: start over


def _padded(key: bytes) -> tuple[_Hash, _Hash]:
    """SHA-256 after `key` XOR ipad and after `key` XOR opad: the part of every HMAC under
    `key` that no message changes (RFC 2104's precomputation, what `hmac`'s copy does),
    made once per key, which the webhook signs every grant with."""
    found = _PADDED.get(key)
    if found is None:
        sha256 = _sha256()  # looked up here: a container asking for no GPU never loads it
        padded = (sha256(key).digest() if len(key) > _BLOCK else key).ljust(_BLOCK, b"\0")
        found = (sha256(padded.translate(_INNER)), sha256(padded.translate(_OUTER)))
        if len(_PADDED) >= _PADDED_KEPT:
            _PADDED.clear()
        _PADDED[key] = found
    return found


def mac_matches(expected: str, given: str) -> bool:
    """Whether `given` (from a container spec or a file: any string) is the MAC `expected`,
    compared in constant time. compare_digest refuses non-ASCII text, which no MAC is."""
    return given.isascii() and compare_digest(expected, given)


class GrantError(ValueError):
    """A grant that cannot be made or read (no key, malformed value)."""


# Every limit variable's name starts with one of these (HAMi-core's `_<n>` ones with their
# base): one `startswith` rules out the rest of a container's env, which is most of it.
_LIMIT_STARTS = (*mps.CLIENT_ENV, hamicore.POLICY_ENV, hamicore.MEMORY_ENV, hamicore.CORES_ENV)


def is_limit(name: str) -> bool:
    """Whether a variable sets a limit something enforces (MPS's, HAMi-core's)."""
    return name.startswith(_LIMIT_STARTS) and (
        name in mps.CLIENT_ENV or name == hamicore.POLICY_ENV or hamicore.asks((name,))
    )


def bound_limits(env: Mapping[str, str]) -> str:
    """The variables of `env` that set a limit something enforces (MPS's client limits,
    HAMi-core's, `_<n>` per device included), canonical: each `<len>:<name>=<value>`,
    sorted, so no value can pass for another field."""
    pairs = sorted(f"{name}={value}" for name, value in env.items() if is_limit(name))
    return "".join(f"{len(p)}:{p}" for p in pairs)


class Subject(Value):
    """What a grant binds, each field in canonical form, under its vendor's tag (a grant for
    one vendor's env never verifies as another's)."""

    __slots__ = _fields = ("namespace", "container", "devices", "capabilities", "tag", "pod",
                           "limits")  # fmt: skip
    namespace: str
    container: str
    devices: str
    capabilities: str
    tag: str
    pod: str  # the admission that made the pod (POD_ANNOTATION)
    limits: str  # bound_limits of the container's env

    def __init__(
        self,
        namespace: str,
        container: str,
        devices: str,
        capabilities: str,
        tag: str = NVIDIA.grant_tag,
        pod: str = "",
        limits: str = "",
    ) -> None:
        self._set(
            namespace=namespace,
            container=container,
            devices=devices,
            capabilities=capabilities,
            tag=tag,
            pod=pod,
            limits=limits,
        )

    @classmethod
    def of(
        cls,
        namespace: str,
        container: str,
        visible: str | None,
        caps: str | None,
        vendor: Vendor = NVIDIA,
        *,
        pod: str = "",
        env: Mapping[str, str] | None = None,
    ) -> Subject:
        """From the raw env values of `vendor`'s request; `plugin` stays `plugin` (devices
        chosen at Allocate); `pod`: the pod's POD_ANNOTATION, `env`: the container's whole
        environment (its limits are bound)."""
        devices, capabilities = canonical_request(visible, caps, vendor)
        return cls(
            namespace,
            container,
            devices,
            capabilities,
            vendor.grant_tag,
            pod,
            bound_limits(env or {}),
        )

    def message(self) -> bytes:
        fields = (VERSION, self.tag, self.namespace, self.container, self.devices,
                  self.capabilities, self.pod, self.limits)  # fmt: skip
        return "\0".join(fields).encode()


def canonical_request(visible: str | None, caps: str | None, vendor: Vendor) -> tuple[str, str]:
    """(devices, capabilities) of `vendor`'s request as a grant signs them: what `Subject.of`
    makes of the raw env values, the part of a subject no pod or container is in
    (nvidia.CapabilityError: capabilities the driver has not)."""
    devices = (
        PLUGIN_DEVICES
        if visible == PLUGIN_DEVICES
        else vendor.visible_request({vendor.visible_env: visible or ""}).canonical()
    )
    return devices, vendor.canonical_capabilities(caps)


def pod_of(annotations: Mapping[str, str]) -> str:
    """The admission a container's pod came from (its POD_ANNOTATION, passed through by the
    runtime); "" where the spec has none."""
    return annotations.get(POD_ANNOTATION, "")


def subject_names(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    """(namespace, container name) from an OCI spec's CRI annotations, if it has them."""
    for ns_key, name_key in SUBJECT_ANNOTATIONS:
        if ns_key in annotations and name_key in annotations:
            return annotations[ns_key], annotations[name_key]
    return None


class KeyRing(Value):
    __slots__ = _fields = ("keys",)
    keys: Mapping[str, bytes]

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._set(keys=keys)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> KeyRing:
        """Every key file in `directory`; hidden entries (a Secret volume's `..data`) skipped."""
        keys: dict[str, bytes] = {}
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return cls({})
        for name in names:
            path = os.path.join(directory, name)
            if _is_key_id(name) and os.path.isfile(path):
                with open(path, "rb") as f:
                    secret = f.read().strip()
                if secret:
                    keys[name] = secret
        return cls(keys)

    @property
    def signing_id(self) -> str:
        if not self.keys:
            raise GrantError("no grant key: the key directory is empty or missing")
        return max(self.keys)

    def mac(self, key_id: str, subject: Subject) -> str:
        return hmac_sha256(self.keys[key_id], subject.message())

    def sign(self, subject: Subject) -> str:
        key_id = self.signing_id
        return f"{key_id}:{self.mac(key_id, subject)}"

    def verify(self, value: str, subject: Subject) -> bool:
        """True when `value` holds a grant for exactly `subject` under any key held. A pod
        that may land on nodes of either vendor carries one grant per vendor: `,`-separated.
        A subject of no pod is no one's: it verifies nothing."""
        if not subject.pod:
            return False
        return any(self._verifies(part, subject) for part in value.split(","))

    def _verifies(self, value: str, subject: Subject) -> bool:
        key_id, sep, mac = value.partition(":")
        if not sep or key_id not in self.keys:
            return False
        return mac_matches(self.mac(key_id, subject), mac)

    def explain(self, value: str, subject: Subject) -> str:
        """Why `value` does or does not grant `subject`, for an admin troubleshooting."""
        if not subject.pod:
            return (
                f"the spec names no pod admission ({POD_ANNOTATION}): a pod the webhook did "
                "not see, one admitted before grants bound their pod (recreate it), or a "
                "runtime that does not pass the annotation through (gpuwire containerd "
                "configure)"
            )
        found = [self._explain(part, subject) for part in value.split(",")]
        return next((e for e in found if e.startswith("valid")), "; ".join(found))

    def _explain(self, value: str, subject: Subject) -> str:
        key_id, sep, _ = value.partition(":")
        if not sep:
            return f"malformed grant {value!r}: expected <key-id>:<mac>"
        if key_id not in self.keys:
            held = ", ".join(sorted(self.keys)) or "none"
            return f"grant signed with key {key_id!r}, which this node does not hold (held: {held})"
        if self._verifies(value, subject):
            return f"valid: key {key_id!r} signs {_describe(subject)}"
        return f"invalid: key {key_id!r} does not sign {_describe(subject)}"


def _describe(subject: Subject) -> str:
    under = "" if subject.tag == NVIDIA.grant_tag else f" (as {subject.tag})"
    limits = f" limits={subject.limits}" if subject.limits else " and no limits"
    return (
        f"namespace={subject.namespace} container={subject.container} "
        f"devices={subject.devices} capabilities={subject.capabilities} pod={subject.pod}"
        f"{limits}{under}"
    )


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpuwire grant",
        description="Print the GPUWIRE_GRANT line the webhook would write for a container.",
    )
    parser.add_argument(
        "--grant-key-dir", default=DEFAULT_KEY_DIR, metavar="DIR",
        help="the keys, one file per key id; the newest name signs (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--namespace", required=True, help="the pod's namespace")
    parser.add_argument("--container", required=True, help="the container's name")
    parser.add_argument(
        "--vendor",
        choices=[v.name for v in VENDORS],
        default=NVIDIA.name,
        help="whose GPUs (default %(default)s)",
    )
    parser.add_argument(
        "--devices",
        required=True,
        help="NVIDIA_VISIBLE_DEVICES (AMD_VISIBLE_DEVICES) value, or 'plugin'",
    )
    parser.add_argument(
        "--pod",
        required=True,
        metavar="ADMISSION",
        help=f"the pod's {POD_ANNOTATION} annotation (the grant binds that pod alone)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a limit variable of the container's env (MPS's, HAMi-core's), repeated: the "
        "grant binds them",
    )
    parser.add_argument(
        "--capabilities", default="",
        help="NVIDIA_DRIVER_CAPABILITIES value (NVIDIA only; default: none given, the "
        "runtime's default)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    vendor = of(args.vendor)
    try:
        env = dict(e.partition("=")[::2] for e in args.env)
        subject = Subject.of(
            args.namespace,
            args.container,
            args.devices,
            args.capabilities,
            vendor,
            pod=args.pod,
            env=env,
        )
    except (GrantError, nvidia.CapabilityError) as exc:
        parser.exit(2, f"gpuwire grant: {exc}\n")  # gpuwire.exits.USAGE: a bad value
    # exit 3, gpuwire.exits.INPUT (not imported: this module is on the start path, exits not)
    try:
        keys = KeyRing.load(args.grant_key_dir)
    except OSError as exc:
        parser.exit(3, f"gpuwire grant: cannot read the keys in {args.grant_key_dir}: {exc}\n")
    if not keys.keys:
        parser.exit(
            3,
            f"gpuwire grant: no grant key in {args.grant_key_dir} (missing, or no key file in "
            "it); give --grant-key-dir DIR with one file per key id\n",
        )
    print(f"{ENV}={keys.sign(subject)}")
    return 0
