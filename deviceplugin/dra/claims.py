"""What a ResourceClaim allocated on this node, read from the claim as the API server has it.
Pure: the claim object in, the devices and their configuration out, or a ClaimError that
names what is wrong (the kubelet reports it for that claim alone and retries later).

The kubelet sends only a claim's namespace, name and UID; the allocation is in the claim's
`status.allocation` (`resource.k8s.io/v1`): `devices.results[]` (request, driver, pool,
device, shareID, consumedCapacity, tolerations) and `devices.config[]` (opaque parameters per
driver, class configs first, then the claim's, each for some or all requests). Only results
for this driver and this node's pool are this plugin's; a result naming a device this node
does not publish, or an unhealthy GPU or MIG device whose taint the claim does not tolerate,
fails the claim.

The opaque configuration gpuwire reads (`driver: gpu.gpuwire.io`):

    apiVersion: gpu.gpuwire.io/v1alpha1
    kind: GpuConfig
    driverCapabilities: compute,utility    # NVIDIA_DRIVER_CAPABILITIES syntax; default
    limitProfile: hami                     # how a shared GPU's limits reach the container

A later config for the same request overrides an earlier one, field by field, with one
exception: an enforced `limitProfile` a DeviceClass's config sets (`source: FromClass`) is
the cluster admin's, and no claim's config (`FromClaim`) replaces it: a claim that asked
`hami` of its class and `pytorch` of itself would have its share prepared with no library,
unlimited. Such a claim fails, naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.taints import Taint
from gpuwire import limits, nvidia
from gpuwire.dra import CONFIG_API_VERSION, CONFIG_CAPABILITIES, CONFIG_KIND, CONFIG_LIMIT_PROFILE

CONFIG_FIELDS = (CONFIG_CAPABILITIES, CONFIG_LIMIT_PROFILE)


class ClaimError(ValueError):
    """Why a claim cannot be prepared on this node."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class GpuConfig:
    capabilities: tuple[str, ...] = tuple(sorted(nvidia.DEFAULT_CAPABILITIES))
    limit_profile: str = limits.DEFAULT_PROFILE


@dataclass(frozen=True)
class Result:
    """One allocated device of this node: the request it serves (the base name, as the
    kubelet matches containers' `resources.claims[].request` against it), the device, and
    for a shared GPU its share and what the share consumes."""

    request: str
    device: DraDevice
    share_id: str | None = None
    consumed: Mapping[str, str] = field(default_factory=dict)
    config: GpuConfig = GpuConfig()


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    """The allocator's rule: effect empty or equal; key empty or equal; Equal compares the
    value, Exists ignores it (an empty key needs Exists)."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("key") not in (None, "", taint["key"]):
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint["value"]:
            return True
    return False


def _parameters(opaque: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = opaque.get("parameters")
    if not isinstance(params, dict):
        raise ClaimError(f"{where}: parameters must be an object")
    version, kind = params.get("apiVersion"), params.get("kind")
    if (version, kind) != (CONFIG_API_VERSION, CONFIG_KIND):
        raise ClaimError(
            f"{where}: {version}/{kind} is not a gpuwire config: "
            f"expected apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}"
        )
    unknown = sorted(set(params) - {"apiVersion", "kind", *CONFIG_FIELDS})
    if unknown:
        raise ClaimError(
            f"{where}: unknown field {unknown[0]!r}; known: {', '.join(CONFIG_FIELDS)}"
        )
    return {k: v for k, v in params.items() if k in CONFIG_FIELDS}


def _config(fields: Mapping[str, Any], where: str) -> GpuConfig:
    config = GpuConfig()
    if CONFIG_CAPABILITIES in fields:
        value = fields[CONFIG_CAPABILITIES]
        try:
            if not isinstance(value, str):
                raise nvidia.CapabilityError("expected a string, e.g. compute,utility")
            config = GpuConfig(nvidia.parse_capabilities(value), config.limit_profile)
        except nvidia.CapabilityError as exc:
            raise ClaimError(f"{where}: {CONFIG_CAPABILITIES} {value!r}: {exc}") from None
    if CONFIG_LIMIT_PROFILE in fields:
        profile = fields[CONFIG_LIMIT_PROFILE]
        if profile not in limits.PROFILES:
            known = ", ".join(limits.PROFILES)
            raise ClaimError(f"{where}: {CONFIG_LIMIT_PROFILE} {profile!r}: accepted are {known}")
        config = GpuConfig(config.capabilities, str(profile))
    return config


FROM_CLASS = "FromClass"  # resource.k8s.io/v1 DeviceAllocationConfiguration.source


@dataclass(frozen=True)
class _Config:
    requests: tuple[str, ...]  # those it covers; empty: all
    params: dict[str, Any]
    where: str
    of_class: bool  # a DeviceClass's (the admin's), not the claim's own


def _configs(allocation: Mapping[str, Any], driver: str, ref: ClaimRef) -> list[_Config]:
    """Each of this driver's configs, in order (the classes' first)."""
    out = []
    for i, entry in enumerate(allocation.get("devices", {}).get("config") or ()):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        source = entry.get("source", "FromClaim")
        where = f"claim {ref}: config {i} ({source})"
        requests = tuple(entry.get("requests") or ())
        out.append(_Config(requests, _parameters(opaque, where), where, source == FROM_CLASS))
    return out


def _merged(configs: list[_Config], request: str) -> dict[str, Any]:
    """The fields of the configs that cover `request`, later over earlier; ClaimError where
    a claim's config would replace its class's enforced limit profile."""
    fields: dict[str, Any] = {}
    enforced: _Config | None = None  # the class config that enforces the profile
    for config in (c for c in configs if _covers(c.requests, request)):
        profile = config.params.get(CONFIG_LIMIT_PROFILE)
        if profile is not None and config.of_class:
            enforced = config if profile in limits.ENFORCED else None
        elif profile is not None and enforced is not None:
            held = enforced.params[CONFIG_LIMIT_PROFILE]
            if profile != held:
                raise ClaimError(
                    f"{config.where}: {CONFIG_LIMIT_PROFILE} {profile!r} would replace {held!r}, "
                    f"which its DeviceClass enforces ({enforced.where}); a class's enforced "
                    f"profile holds: drop the claim's {CONFIG_LIMIT_PROFILE}, or use a class "
                    "that enforces none"
                )
        fields.update(config.params)
    return fields


def _covers(requests: tuple[str, ...], request: str) -> bool:
    return not requests or request in requests or request.split("/")[0] in requests


def owner_pod(claim: Mapping[str, Any]) -> str | None:
    """The UID of the pod a claim was generated for from a ResourceClaimTemplate (its
    controller owner is that Pod, KEP-4381), whose alone it is; None for a claim any pod of
    its namespace may reference."""
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("controller") and (owner.get("apiVersion"), owner.get("kind")) == (
            "v1",
            "Pod",
        ):
            return str(owner.get("uid") or "") or None
    return None


def reserved_pods(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """The UIDs of the pods a claim's `status.reservedFor` names (the scheduler adds each pod
    it binds with the claim; the kubelet starts no pod the claim is not reserved for)."""
    found = (claim.get("status") or {}).get("reservedFor") or ()
    return tuple(
        sorted({str(r["uid"]) for r in found if r.get("resource") == "pods"
                and not r.get("apiGroup") and r.get("uid")})
    )  # fmt: skip


def results(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    driver: str,
    pool: str,
    devices: Mapping[str, DraDevice],
    taints: Mapping[str, Sequence[Taint]],
) -> list[Result]:
    """The claim's devices on this node, with their configuration; ClaimError if the claim
    is not one this node can prepare."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(
            f"claim {ref} has UID {meta.get('uid')}, the kubelet asked for {ref.uid} "
            "(deleted and created again?)"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref} is not allocated")
    mine = [
        r for r in allocation.get("devices", {}).get("results") or () if r.get("driver") == driver
    ]
    if not mine:
        raise ClaimError(f"claim {ref} has no device of driver {driver}")
    configs = _configs(allocation, driver, ref)
    out = []
    for r in mine:
        where = f"claim {ref}: request {r.get('request')}"
        if r.get("pool") != pool:
            raise ClaimError(
                f"{where}: device {r.get('device')} is in pool {r.get('pool')}, "
                f"not this node's ({pool})"
            )
        device = devices.get(str(r.get("device")))
        if device is None:
            have = ", ".join(sorted(devices)) or "none"
            raise ClaimError(
                f"{where}: this node has no device {r.get('device')!r} (it has {have})"
            )
        for taint in taints.get(device.uuid, ()):
            if not _tolerates(r.get("tolerations") or (), taint):
                raise ClaimError(
                    f"{where}: {device.name} ({device.uuid}) is unhealthy: taint "
                    f"{taint['key']}={taint['value']}:{taint['effect']}, not tolerated"
                )
        request = str(r.get("request", ""))
        fields = _merged(configs, request)
        out.append(
            Result(
                request=request.split("/")[0],
                device=device,
                share_id=r.get("shareID"),
                consumed=dict(r.get("consumedCapacity") or {}),
                config=_config(fields, where),
            )
        )
    return out
