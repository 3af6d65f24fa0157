"""A prepared claim's CDI spec: gpuwire's container edits for exactly the claim's devices.

One transient spec per claim in the runtime's dynamic spec dir (`/var/run/cdi`, which
shadows `/etc/cdi`), named as the CDI producer API names transient specs
(`<vendor>-<class>_<id>`): `k8s.gpu.gpuwire.io-claim_<claim UID>.json`, kind
`k8s.gpu.gpuwire.io/claim`, one device `<claim UID>-<device>` per allocated device (so an id
is never reused by another claim: runtimes cache specs) holding its `/dev/nvidiaN`, or for a
MIG device its parent's and its own two capability nodes (`gpuwire.edits.gpu_nodes`, as for
the shim), and a read-only mount of the claim's token at that device's place
(`gpuwire.claimtoken`: the proof gpuwire's runtime accepts), and the claim's common edits
(`gpuwire.cdi.common_edits`: control devices, the driver's files for the claim's
capabilities, the ld-cache hook) with `NVIDIA_VISIBLE_DEVICES` naming the claim's devices,
the claim's limits env and what holds it (`shares.hold`). The same naming as NVIDIA's and
AMD's drivers (`k8s.<driver>`, a class, `<claim UID>-<device>`).

The token is written before the spec and removed with it, so a spec never names a token
that is not there (after a crash, until the claim is prepared again: `_replacing`); both are
the prepared claim's files (what unprepare removes).

The plugin may run in a container that sees the host under `host_root` (`/host`): the driver
is discovered there, and every host path in the spec is written as the host sees it.

The spec's edits are the node's vendor's (`deviceplugin.dra.vendors`): NVIDIA's here
(`claim_spec`), AMD's in `amdcdi`; the writer discovers the node through the vendor
(`gpuwire.vendor.Vendor.discover`) and hands what it found to that vendor's spec.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deviceplugin.dra.claims import ClaimError, ClaimRef, Result
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.shares import NOTHING, Holders, hold
from gpuwire import atomicfile, cdi, claimtoken, driver, edits, nvidia
from gpuwire.devices import CharDevice
from gpuwire.dra import DRIVER
from gpuwire.grant import KeyRing
from gpuwire.roots import Roots
from gpuwire.vendor import NVIDIA, Vendor, VendorError

if TYPE_CHECKING:
    from gpuwire.vendor import Found

VENDOR = f"k8s.{DRIVER}"
CLASS = "claim"
KIND = f"{VENDOR}/{CLASS}"
DEFAULT_DIR = "/var/run/cdi"


def spec_file(uid: str) -> str:
    return f"{VENDOR}-{CLASS}_{uid}.json"


def cdi_id(uid: str, device: str) -> str:
    return f"{KIND}={uid}-{device}"


def on_host(path: str, host_root: str) -> str:
    """`path` as the host names it, for a process that sees the host's `/` at `host_root`."""
    if host_root in ("", "/"):
        return path
    relative = os.path.relpath(path, host_root)
    return path if relative.startswith("..") else os.path.normpath("/" + relative)


def host_paths(spec: dict[str, Any], host_root: str) -> dict[str, Any]:
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    for e in edits:
        for item in (*e.get("deviceNodes", ()), *e.get("mounts", ())):
            item["hostPath"] = on_host(item["hostPath"], host_root)
    return spec


def unique(results: Sequence[Result]) -> tuple[Result, ...]:
    """A claim's results, one per device (shares of one GPU are one device to a container)."""
    return tuple({r.device.name: r for r in results}.values())


def capabilities(results: Sequence[Result]) -> tuple[str, ...]:
    """The driver capabilities a claim's containers get: all its results' configs ask for."""
    return tuple(sorted({c for r in results for c in r.config.capabilities}))


def claim_devices(results: Sequence[Result]) -> tuple[claimtoken.ClaimDevice, ...]:
    """What a claim's token names of each device it was given: NVIDIA_VISIBLE_DEVICES names
    a GPU by its UUID, a MIG device by its own (`MigDevice.name`)."""
    return tuple(
        claimtoken.ClaimDevice(
            r.device.name,
            r.device.mig.name if r.device.mig is not None else r.device.gpu.uuid,
            r.share_id is not None,
        )
        for r in unique(results)
    )


def _nodes(found: driver.Driver, ref: ClaimRef, device: DraDevice) -> list[CharDevice]:
    """A device's nodes as the driver has them now: a GPU's `/dev/nvidiaN`; a MIG device's
    parent's and its two capability nodes, if procfs still lists its instance (a MIG change
    may have destroyed it since it was allocated)."""
    gpu = next((d for d in found.devices if d.uuid == device.gpu.uuid), None)
    if gpu is None:
        raise ClaimError(
            f"claim {ref}: GPU {device.gpu.uuid} ({device.name}) is not in the driver's "
            f"list under {found.roots.proc}"
        )
    if device.mig is None:
        return edits.gpu_nodes(found, (gpu,))
    want = (device.mig.gi, device.mig.ci)
    instance = next((m for m in found.mig_of(gpu) if (m.gi, m.ci) == want), None)
    if instance is None:
        raise ClaimError(
            f"claim {ref}: MIG device {device.mig.uuid} ({device.name}: GPU instance "
            f"{want[0]}, compute instance {want[1]} of GPU {gpu.index}) does not exist any "
            f"more under {found.roots.proc}"
        )
    return edits.gpu_nodes(found, (), (instance,))


def token_mount(token: str, ref: ClaimRef, device: str) -> dict[str, Any]:
    """The claim's token, read-only at the device's place in the container."""
    return dict(edits.bind_mount(token, claimtoken.container_path(ref.uid, device)))


def claim_spec(
    found: Found,
    ref: ClaimRef,
    results: Sequence[Result],
    capabilities: tuple[str, ...],
    named: Sequence[claimtoken.ClaimDevice],
    hook: str,
    ldconfig: str,
    token: str,
    host_root: str = "/",
    holders: Holders = NOTHING,
) -> dict[str, Any]:
    """The spec for a claim's results (pure, given the driver discovered for their
    `capabilities`); `named`: their `claim_devices`, in the allocation's order (the order
    NVIDIA_VISIBLE_DEVICES gives them to CUDA); `token`: where the claim's token is, as the
    host names it. ClaimError where nothing here holds the claim to its share."""
    assert isinstance(found, driver.Driver)
    devices = []
    for r in unique(results):
        device = cdi.device(
            f"{ref.uid}-{r.device.name}", cdi.device_nodes(_nodes(found, ref, r.device))
        )
        device["containerEdits"]["mounts"] = [token_mount(token, ref, r.device.name)]
        devices.append(device)
    common = cdi.common_edits(found, capabilities)
    common.env[nvidia.VISIBLE_DEVICES_ENV] = ",".join(d.uuid for d in named)
    env, mounts = hold(results, holders)
    common.env.update(env)
    common.mounts += mounts
    return host_paths(cdi.assemble(KIND, devices, common, hook, ldconfig), host_root)


def _replacing(path: str) -> bool:
    """Whether writing `path` replaces a file, so its rename must be on the disk before the
    checkpoint names it: a crash that lost it would leave the old file, believed. A new
    file's rename is not waited for (two directory fsyncs of a prepare's three): one a crash
    loses leaves the file missing, which `prepared.Preparer` finds on the kubelet's next
    prepare and writes again, as after a reboot that emptied the CDI spec dir; a file a crash
    kept but the checkpoint does not name is removed at start. Either file is whole or
    absent: its data is fsync'd before its rename all the same."""
    return os.path.lexists(path)


# A vendor's spec for a claim: (what discovery found, the claim, its results, capabilities,
# its devices as the token names them, hook, ldconfig, the token's host path, host root,
# what holds shares) → the spec; `claim_spec` is NVIDIA's.
ClaimSpec = Callable[..., dict[str, Any]]


class CdiWriter:
    """Writes and removes claims' specs in `directory` and their tokens under
    `allocation_dir`, signed with the keys in `key_dir` (the plugin's `Writer`); the node is
    discovered as `vendor`'s and the spec is `spec`'s."""

    def __init__(
        self,
        directory: str,
        roots: Roots,
        hook: str,
        ldconfig: str,
        allocation_dir: str,
        key_dir: str,
        host_root: str = "/",
        holders: Holders = NOTHING,
        vendor: Vendor = NVIDIA,
        spec: ClaimSpec = claim_spec,
    ) -> None:
        self.vendor = vendor
        self.spec = spec
        self.directory = directory
        self.roots = roots
        self.hook = hook
        self.ldconfig = ldconfig
        self.allocation_dir = allocation_dir
        self.key_dir = key_dir
        self.host_root = host_root
        self.holders = holders

    def write(
        self, ref: ClaimRef, results: Sequence[Result], pods: tuple[str, ...]
    ) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
        wanted = capabilities(results)
        try:
            found = self.vendor.discover(self.roots, wanted)
        except VendorError as exc:
            raise ClaimError(f"claim {ref}: {exc}") from None
        named = claim_devices(results)
        proof = claimtoken.ClaimToken(ref.uid, ref.namespace, ref.name, pods, named)
        token = claimtoken.path(self.allocation_dir, ref.uid)
        spec = self.spec(
            found, ref, results, wanted, named, cdi.hook_program(self.hook, self.host_root),
            self.ldconfig, on_host(token, self.host_root), self.host_root, self.holders,
        )  # fmt: skip
        keys = self._keys(ref)
        path = os.path.join(self.directory, spec_file(ref.uid))
        try:
            claimtoken.write(self.allocation_dir, proof, keys, entry=_replacing(token))
            os.makedirs(self.directory, mode=0o755, exist_ok=True)
            atomicfile.replace(path, json.dumps(spec).encode(), 0o644, entry=_replacing(path))
        except (OSError, claimtoken.ClaimTokenError) as exc:
            self.remove((path, token))
            raise ClaimError(f"claim {ref}: {exc}") from None
        ids: dict[str, tuple[str, ...]] = {
            r.device.name: (cdi_id(ref.uid, r.device.name),) for r in results
        }
        return ids, (path, token)

    def _keys(self, ref: ClaimRef) -> KeyRing:
        keys = KeyRing.load(self.key_dir)
        if not keys.keys:
            raise ClaimError(
                f"claim {ref}: no grant key in {self.key_dir} to sign its token with (gpuwire's "
                "runtime accepts a claim's devices only with it)"
            )
        return keys

    def bind(self, ref: ClaimRef, pods: tuple[str, ...]) -> None:
        """The claim's token again, bound to `pods`, signed with the current key."""
        keys = self._keys(ref)
        was = claimtoken.read(self.allocation_dir, ref.uid, keys)
        token = claimtoken.ClaimToken(was.uid, was.namespace, was.name, pods, was.devices)
        claimtoken.write(self.allocation_dir, token, keys)

    def remove(self, files: Sequence[str]) -> None:
        for path in files:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)

    def files_of(self, uid: str) -> tuple[str, ...]:
        return os.path.join(self.directory, spec_file(uid)), claimtoken.path(
            self.allocation_dir, uid
        )

    def orphans(self, known: set[str]) -> list[str]:
        specs = Path(self.directory).glob(spec_file("*"))
        tokens = Path(claimtoken.directory(self.allocation_dir)).glob("*")
        return sorted(str(p) for p in (*specs, *tokens) if str(p) not in known)
