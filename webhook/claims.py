"""The DRA path of the mutation: a GPU request → the ResourceClaimTemplate that asks the
scheduler for exactly that. Pure: checked against the cluster's pools (`webhook.pools`),
never an API call.

What each annotation becomes in the template's one request, `gpus` (`resource.k8s.io/v1`
DeviceClaim; CEL in the allocator's environment, k8s.io/dynamic-resource-allocation
`cel/compile.go`; docs/annotations.md, "The DRA path"):

* models (`gpu-model`, HAMi's `use-gputype`/`nouse-gputype`) → selectors on `productName`,
  lower-cased with spaces as dashes, containing a word (any of those asked, none excluded):
  the same case-insensitive substring the device-plugin path matches labels with;
* `gpu-min-memory` → `capacity memory >= <MiB>`; named GPUs (`gpu-uuid`, `use-gpuuuid`) and
  excluded ones → selectors on `uuid` (exactly those GPUs, not their whole node);
* a count → `ExactCount` (at most `dra.CLAIM_DEVICES_MAX`, what a claim can hold), `all` →
  `All` (denied where a node has more that fit than a claim holds), tolerating gpuwire's
  health taints: every GPU of the node, the unhealthy included,
  as on the plugin-less path (an untolerated taint on one of them would keep the claim off
  the node whole: the allocator gathers All's devices by the selectors, then fails on a
  taint); several GPUs → a `matchAttribute` constraint on
  `gpu.gpuwire.io/nvlinkIsland`: required, or preferred as a `firstAvailable` list (the
  subrequest `linked` under the constraint first, `any` second; KEP-4816);
* memory and cores limits → the shared class, whose GPUs hand out `memory` and `cores` as
  consumable capacity (KEP-5075): `capacity.requests` per GPU, memory in whole GiB (the DRA
  plugin's request policy), a share of the GPU taken against the smallest shared GPU that
  fits; the DRA plugin turns what was consumed into the limit profile's env at prepare; an
  enforced profile (hami, mps) → a selector on its `<profile>Limits` attribute, the shared
  GPUs whose node holds a share with it; an advisory one is denied (the shared class
  enforces `hami`: the plugin would fail the claim's prepare);
* a MIG profile (`mig-profile`, or a container's `nvidia.com/mig-<profile>`) → the MIG class
  and a selector on `profile`, counted by the count; named MIG devices by their `uuid`;
* capabilities and the limit profile → the claim's opaque `GpuConfig`;
* AMD GPUs and partitions (AMD's DRA driver's names, `deviceplugin.dra.amddevices`): AMD's
  class, the same model, memory and UUID selectors, `partition-profile` → a guarded selector
  on `partitionProfile`, several devices on one `xgmiIsland`; a claim is one vendor's
  (`webhook.vendors`, which holds what differs per vendor): NVIDIA's options (capabilities,
  limits) on a request only AMD devices fit are a denial, as on the device-plugin path.

The template is named by its content (`gpuwire-<hash of its spec>`), so every pod of a
namespace asking the same shares one, and a second admission finds the same name. A request
no pool can ever satisfy is Unplaceable, saying what the cluster's slices hold.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuwire import annotations as keys
from gpuwire import dra, limits
from gpuwire.annotations import GpuRequest
from gpuwire.quantity import canonical_mib
from gpuwire.vendor import NVIDIA, Vendor
from webhook import vendors
from webhook.placement import Unplaceable, listing, models_matching
from webhook.pools import PoolDevice, Pools

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceClaimTemplate"
PREFIX = "gpuwire-"  # templates, and the pod's claim entries pointing at them
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuwire"
TEMPLATE_LABEL = "gpuwire.io/template"  # carried into each claim: the template that made it
REQUEST = "gpus"
LINKED, ANY = "linked", "any"

Obj = dict[str, Any]
Count = int | Literal["all"]
NVLink = Literal["required", "preferred"]

_ATTRIBUTES = f'device.attributes["{dra.DRIVER}"]'
_CAPACITY = f'device.capacity["{dra.DRIVER}"]'
_PRODUCT = f'{_ATTRIBUTES}.{dra.PRODUCT}.lowerAscii().replace(" ", "-")'
_UUID = f"{_ATTRIBUTES}.{dra.UUID}.lowerAscii()"


@dataclass(frozen=True)
class Claimed:
    """What a container's claim asks for: the template's name and spec, the most GPUs it
    can give a container (for the policy's maxGpus), and what the webhook should say."""

    name: str
    spec: Obj  # ResourceClaimTemplateSpec
    gpus: int
    warnings: tuple[str, ...] = ()
    vendor: Vendor = NVIDIA  # of its devices: the claim's spec names them in its visible env

    def template(self, namespace: str) -> Obj:
        """The ResourceClaimTemplate object, as the webhook creates it."""
        meta = {"name": self.name, "namespace": namespace, "labels": {MANAGED_BY: MANAGER}}
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": self.spec}


@dataclass(frozen=True)
class Ask:
    """One container's request on the DRA path: the pod's annotations and what the policy
    and the container add."""

    request: GpuRequest
    count: Count
    capabilities: str  # canonical
    profile: str | None  # the limit profile, where the request has limits
    nvlink: NVLink
    mig: str | None = None  # the MIG profile asked for
    counted: str = ""  # where the count comes from, where no annotation says it


def _quoted(words: Sequence[str]) -> str:
    return ", ".join(json.dumps(w) for w in words)


def _contains(word: str) -> str:
    return f"{_PRODUCT}.contains({json.dumps(word)})"


def _content_name(spec: Obj) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return PREFIX + digest[:16]


class _Translation:
    def __init__(self, ask: Ask, pools: Pools, devices: Sequence[PoolDevice]) -> None:
        self.ask = ask
        self.request = ask.request
        self.pools = pools
        self.devices = devices  # what it passes over: all of the pools' devices, or `alike`
        self.kind = dra.MIG_TYPE if ask.mig or self._named_mig() else dra.GPU_TYPE
        self.kinds = (dra.MIG_TYPE,) if self.kind == dra.MIG_TYPE else vendors.GPU_TYPES
        self.selectors: list[str] = []
        self.warnings: list[str] = []
        self.capacity: dict[str, str] = {}
        self.share_mib: int | None = None  # the memory share asked of each shared GPU
        self.vendor = vendors.NVIDIA_CLAIMS  # whose devices it takes (`one_vendor`)

    def of_kind(self, device: PoolDevice) -> bool:
        """A device the claim may take: a MIG device for MIG; else a GPU, NVIDIA's or AMD's
        (a GPU or partition), until `one_vendor` chooses."""
        return device.kind in self.kinds

    def _named_mig(self) -> bool:
        named = {u[:4].upper() for u in self.request.uuids}
        if len(named) > 1:
            raise self.fail((keys.UUID, keys.HAMI_USE_UUID), "names GPUs and MIG devices; a "
                            "claim takes one kind: accepted: GPUs, or MIG devices")  # fmt: skip
        return named == {"MIG-"}

    def fail(self, sources: tuple[str, ...], reason: str) -> Unplaceable:
        return Unplaceable.of(self.request, sources, reason)

    # --- what each annotation leaves of the cluster's GPUs

    def models(self, devices: list[PoolDevice]) -> list[PoolDevice]:
        r = self.request
        if not r.models and not r.excluded_models:
            return devices
        allowed, chosen = models_matching(self.pools.products, r.models, r.excluded_models)
        if not chosen:
            raise self.fail(
                (keys.MODEL, keys.HAMI_USE_TYPE, keys.HAMI_NOUSE_TYPE),
                "matches no GPU in the cluster's ResourceSlices; "
                f"models present: {listing(allowed)}",
            )
        if r.models:
            self.selectors.append(" || ".join(_contains(w) for w in r.models))
        self.selectors += [f"!{_contains(w)}" for w in r.excluded_models]
        return [d for d in devices if d.product in chosen]

    def memory(self, devices: list[PoolDevice]) -> list[PoolDevice]:
        least = self.request.min_memory_mib
        if least is None:
            return devices
        fitting = [d for d in devices if (d.memory_mib or 0) >= least]
        if not fitting:
            sizes = sorted({f"{d.product} {d.memory_mib} MiB" for d in devices if d.memory_mib})
            of_model = " of that model" if self.request.models else ""
            raise self.fail(
                (keys.MIN_MEMORY,),
                f"(= {least} MiB) fits no GPU{of_model} in the cluster's ResourceSlices; "
                f"GPUs present: {listing(sizes)}",
            )
        quantity = canonical_mib(least)
        self.selectors.append(f'{_CAPACITY}.{dra.MEMORY}.compareTo(quantity("{quantity}")) >= 0')
        return fitting

    def uuids(self, devices: list[PoolDevice]) -> list[PoolDevice]:
        r, sources = self.request, (keys.UUID, keys.HAMI_USE_UUID)
        if r.uuids:
            found = {u: self.pools.holder(u) for u in r.uuids}
            missing = [u for u, d in found.items() if d is None]
            if missing:
                present = [d.uuid for d in self.pools.devices]
                raise self.fail(
                    sources,
                    f"names {listing(missing)}, which no ResourceSlice holds; "
                    f"GPUs present: {listing(present)}",
                )
            nodes = sorted({d.node for d in found.values() if d})
            if len(nodes) > 1:
                where = ", ".join(f"{u} on {d.node}" for u, d in found.items() if d)
                raise self.fail(
                    sources, f"names GPUs on different nodes ({where}); a pod runs on one node"
                )
            named = [d for d in found.values() if d]
            self.warnings += [
                f"{d.uuid} is tainted, {d.taint}: the pod stays Pending until the GPU is "
                "healthy again (the DRA plugin lifts a taint after its quiet period)"
                for d in named
                if d.taint
            ]
            ruled_out = [d.uuid for d in named if d not in devices]
            if ruled_out:
                raise self.fail(
                    sources,
                    f"names {listing(ruled_out)}, which the pod's other GPU annotations rule out",
                )
            self.selectors.append(f"{_UUID} in [{_quoted([u.lower() for u in r.uuids])}]")
            devices = named
        if r.excluded_uuids:
            self.selectors.append(
                f"!({_UUID} in [{_quoted([u.lower() for u in r.excluded_uuids])}])"
            )
            excluded = {u.lower() for u in r.excluded_uuids}
            devices = [d for d in devices if d.uuid.lower() not in excluded]
        return devices

    def one_vendor(self, devices: list[PoolDevice]) -> list[PoolDevice]:
        """The GPUs of the vendor the claim takes (`vendors.choose`)."""
        by_vendor: dict[vendors.ClaimVendor, list[PoolDevice]] = {}
        for d in devices:
            by_vendor.setdefault(vendors.of_type(d.kind), []).append(d)
        fitting = {v: [d.product for d in found] for v, found in by_vendor.items()}
        self.vendor, warnings = vendors.choose(self.request, fitting)
        self.warnings += warnings
        return by_vendor.get(self.vendor, [])

    def partitions(
        self, devices: list[PoolDevice], class_name: str
    ) -> tuple[str, list[PoolDevice]]:
        """The vendor's one class (AMD's), and its devices of the partition profile asked, if
        one is: a selector on `partitionProfile`, guarded (a GPU without partition modes has
        none, and a missing attribute is a CEL error that fails the pod's scheduling)."""
        profile = self.request.partition
        if profile is None:
            return class_name, devices
        of = [d for d in devices if d.partition == profile]
        if not of:
            offered = sorted({d.partition for d in self.pools.devices if d.partition})
            raise self.fail(
                (keys.PARTITION_PROFILE,),
                f"is offered by no AMD device in the cluster's ResourceSlices that fits the "
                f"request; partition profiles present: {listing(offered) if offered else 'none'}",
            )
        name = dra.PARTITION_PROFILE
        self.selectors.append(
            f'"{name}" in {_ATTRIBUTES} && {_ATTRIBUTES}.{name} == {json.dumps(profile)}'
        )
        return class_name, of

    def sharing(self, devices: list[PoolDevice]) -> tuple[str, list[PoolDevice]]:
        """The class, and the GPUs of it: shared ones where the request has limits (their
        capacity consumable, or nothing would hold the limits), whole ones otherwise."""
        if not self.request.wants_limits:
            whole = [d for d in devices if not d.shared]
            if not whole:
                uuids = listing(sorted(d.uuid for d in devices), 3)
                raise Unplaceable(
                    f"the GPUs that fit the request are all shared ({uuids}): they are handed "
                    f"out in shares; add {keys.MEMORY_LIMIT} or {keys.CORES_LIMIT} to take one"
                )
            return dra.WHOLE_CLASS, whole
        shared = [d for d in devices if d.shared and d.consumable]
        if not shared:
            why = (
                "they are shared but the API server keeps no consumable capacity "
                "(DRAConsumableCapacity off: Kubernetes < 1.36)"
                if any(d.shared for d in devices)
                else "none is shared (the DRA plugin's dra.sharedGpus)"
            )
            raise self.fail(
                (keys.MEMORY_LIMIT, keys.CORES_LIMIT),
                f"needs a shared GPU whose memory and cores are handed out in shares; of the "
                f"GPUs that fit the request, {why}",
            )
        shared = self.enforcing(shared)
        self.shares(shared)
        return dra.SHARED_CLASS, [d for d in shared if self.fits(d)]

    def enforcing(self, shared: list[PoolDevice]) -> list[PoolDevice]:
        """Of the shared GPUs, those where the limit profile's mechanism holds a share (its
        `<profile>Limits` attribute true; the DRA plugin refuses to prepare a share elsewhere).
        An advisory profile is held by nothing, and the shared class enforces its own
        (`dra.SHARED_CLASS_PROFILE`), whose prepare fails a claim naming another: a denial
        here (under `auto`, the device-plugin way, where a share is held whatever the
        profile)."""
        profile = self.ask.profile
        if profile is None:
            return shared
        if profile not in limits.ENFORCED:
            enforced = dra.SHARED_CLASS_PROFILE
            raise self.fail(
                (keys.LIMIT_PROFILE, keys.MEMORY_LIMIT, keys.CORES_LIMIT),
                f"holds the share with limit profile {profile!r}, which is advisory (held by "
                f"nothing); a share of a shared GPU is held by the profile its DeviceClass "
                f"{dra.SHARED_CLASS} enforces, {enforced!r}, and the DRA plugin fails a claim "
                f"that names another; accepted: {keys.LIMIT_PROFILE}: {enforced}",
            )
        held = [d for d in shared if profile in d.enforces]
        if not held:
            here = sorted({p for d in shared for p in d.enforces})
            raise self.fail(
                (keys.MEMORY_LIMIT, keys.CORES_LIMIT),
                f"needs limit profile {profile!r} to hold the share, and no shared GPU that fits "
                f"the request holds one with it (held there: {', '.join(here) or 'none'}; "
                f"advisory, held by nothing: {', '.join(limits.ADVISORY)})",
            )
        attribute = limits.enforcement_attribute(profile)
        self.selectors.append(f'"{attribute}" in {_ATTRIBUTES} && {_ATTRIBUTES}.{attribute}')
        return held

    def shares(self, shared: list[PoolDevice]) -> None:
        r = self.request
        if r.memory_limit is not None:
            smallest = min(d.memory_mib or 0 for d in shared)
            mib, _ = r.memory_limit.resolve(smallest)
            assert mib is not None
            step = dra.MEMORY_STEP_MIB
            self.share_mib = max(step, -(-mib // step) * step)  # as the request policy rounds
            if r.memory_limit.percent and len({d.memory_mib for d in shared}) > 1:
                self.warnings.append(
                    f"{keys.MEMORY_LIMIT}={r.given[keys.MEMORY_LIMIT]} taken against the "
                    f"smallest shared GPU ({smallest} MiB)"
                )
            if not any(self.fits(d) for d in shared):
                largest = max(shared, key=lambda d: d.memory_mib or 0)
                most = (largest.memory_mib or 0) // step * step  # the largest share it gives
                raise self.fail(
                    (keys.MEMORY_LIMIT,),
                    f"(= {canonical_mib(self.share_mib)} in whole GiB) is more than any shared "
                    f"GPU has; largest: {largest.product} {largest.memory_mib} MiB; accepted: "
                    f"at most {canonical_mib(most)} (a share is whole GiB), or a share of the "
                    "GPU (e.g. 50%)",
                )
            self.capacity[dra.MEMORY] = canonical_mib(self.share_mib)
        if r.cores_limit is not None:
            self.capacity[dra.CORES] = str(r.cores_limit)

    def fits(self, device: PoolDevice) -> bool:
        return self.share_mib is None or (device.memory_mib or 0) >= self.share_mib

    def count(self, devices: list[PoolDevice]) -> int:
        """The most GPUs a node gives this claim; Unplaceable where no node has enough."""
        by_node: dict[str, list[PoolDevice]] = {}
        for d in devices:
            by_node.setdefault(d.node, []).append(d)
        if not by_node:
            raise Unplaceable(self.nothing_left())
        limit = dra.CLAIM_DEVICES_MAX
        most = max(len(found) for found in by_node.values())
        want = self.ask.count
        if want == "all":
            self.all_within(limit, {n: len(found) for n, found in by_node.items()})
            return most
        if want > limit:
            raise Unplaceable(
                f"{self.count_source()} asks for {want} {self.what()}s in one claim; a claim "
                f"holds at most {limit} (the Kubernetes limit on a claim's devices)"
            )
        if most < want:
            raise Unplaceable(
                f"{self.count_source()} asks for {want} GPUs of one node; the most any node "
                f"has that fit the request: {most}"
            )
        if want > 1 and self.ask.nvlink == "required" and self.kind == dra.GPU_TYPE:
            island = max(
                sum(1 for d in found if d.island == i and i is not None)
                for found in by_node.values()
                for i in {d.island for d in found}
            )
            if island < want:
                raise Unplaceable(
                    f"{self.count_source()} asks for {want} GPUs on one {self.link()} island "
                    f"(policy dra.nvlink: required); the most on one island that fit the "
                    f"request: {island}"
                )
        return want

    def all_within(self, limit: int, counts: dict[str, int]) -> None:
        """`all` on a node with more devices than a claim holds is a claim the scheduler's
        allocator refuses there ("exceeds the claim limit"), failing the pod's scheduling
        attempt at that node whatever the others have: Unplaceable, naming it."""
        over = sorted((n for n, k in counts.items() if k > limit), key=lambda n: (-counts[n], n))
        if not over:
            return
        node = over[0]
        beside = f" ({len(over) - 1} more node(s) over {limit})" if len(over) > 1 else ""
        fitting = sorted(f"{n}: {k}" for n, k in counts.items() if k <= limit)
        anyway = f", whichever other node would fit ({listing(fitting, 3)})" if fitting else ""
        raise Unplaceable(
            f"{self.count_source()} asks for every {self.what()} of a node that fits the "
            f"request, and node {node} has {counts[node]}{beside}; a claim holds at most "
            f"{limit} (the Kubernetes limit on a claim's devices), and the scheduler's "
            "allocator fails the pod's scheduling at a node with more ('exceeds the claim "
            f"limit'){anyway}; accepted: {keys.COUNT} up to {limit}, or a narrower request "
            "(fewer of a node's devices fit it)"
        )

    def what(self) -> str:
        if self.request.partition is not None:
            return "partition"
        return "MIG device" if self.kind == dra.MIG_TYPE else "GPU"

    def link(self) -> str:
        """The fast links a multi-GPU claim keeps together: AMD's XGMI, NVIDIA's NVLink."""
        return self.vendor.links

    def count_source(self) -> str:
        given = self.request.given.get(keys.COUNT)
        return (
            f"{keys.COUNT}: {given!r}"
            if given is not None
            else f"a request for {self.ask.count} GPU(s)"
        )

    def nothing_left(self) -> str:
        asked = ", ".join(f"{k}={v}" for k, v in sorted(self.request.given.items()))
        products = listing(sorted(self.pools.products)) if self.pools.products else "none"
        return (
            f"no {self.what()} in the cluster's ResourceSlices fits the request "
            f"({asked or 'a GPU'}); models present: {products}"
        )

    # --- the template

    def exactly(self, class_name: str, count: Count) -> Obj:
        entry: Obj = {"deviceClassName": class_name}
        if count == "all":
            entry["allocationMode"] = "All"
            entry["tolerations"] = [
                {"key": key, "operator": "Exists"} for key in (dra.TAINT_XID, dra.TAINT_LOST)
            ]
        else:
            entry |= {"allocationMode": "ExactCount", "count": count}
        if self.selectors:
            entry["selectors"] = [{"cel": {"expression": s}} for s in self.selectors]
        if self.capacity:
            entry["capacity"] = {"requests": dict(sorted(self.capacity.items()))}
        return entry

    def mig(self, devices: list[PoolDevice]) -> tuple[str, list[PoolDevice]]:
        """The MIG class, and the MIG devices of the profile asked (or named)."""
        if self.request.wants_limits:
            raise self.fail((keys.MEMORY_LIMIT, keys.CORES_LIMIT),
                            "asks for a share, and a MIG device is allocated whole")  # fmt: skip
        profile = self.ask.mig
        if profile is None:
            return dra.MIG_CLASS, devices
        offered = sorted(
            {d.profile for d in self.pools.devices if d.kind == dra.MIG_TYPE and d.profile}
        )
        of = [d for d in devices if d.profile == profile]
        if not of:
            raise Unplaceable(
                f"MIG profile {profile} is offered by no MIG device in the cluster's "
                f"ResourceSlices{' of that model' if self.request.models else ''}; "
                f"MIG profiles present: {listing(offered)}"
            )
        self.selectors.append(f"{_ATTRIBUTES}.{dra.PROFILE} == {json.dumps(profile)}")
        return dra.MIG_CLASS, of

    def claim(self) -> Claimed:
        gpus = [d for d in self.devices if self.of_kind(d)]
        if not gpus:
            raise Unplaceable(
                f"no {self.what()} is published for DRA in this cluster (no ResourceSlice of "
                f"driver {dra.DRIVER} has one): the policy sends this namespace's GPU pods the "
                "DRA way"
            )
        devices = self.uuids(self.memory(self.models(gpus)))
        if not devices:
            raise Unplaceable(self.nothing_left())
        if self.kind == dra.MIG_TYPE:
            class_name, devices = self.mig(devices)
        else:
            devices = self.one_vendor(devices)
            one = self.vendor.device_class
            class_name, devices = self.partitions(devices, one) if one else self.sharing(devices)
        most = self.count(devices)
        count = self.ask.count
        request: Obj = {"name": REQUEST}
        constraints: list[Obj] = []
        island = {"matchAttribute": dra.qualified(self.vendor.island)}
        linked = self.kind == dra.GPU_TYPE and isinstance(count, int) and count > 1
        if linked and self.ask.nvlink == "preferred":
            sub = self.exactly(class_name, count)
            request["firstAvailable"] = [{"name": LINKED, **sub}, {"name": ANY, **sub}]
            constraints.append({"requests": [f"{REQUEST}/{LINKED}"], **island})
        else:
            request["exactly"] = self.exactly(class_name, count)
            if linked:
                constraints.append({"requests": [REQUEST], **island})
        parameters: Obj = {
            "apiVersion": dra.CONFIG_API_VERSION,
            "kind": dra.CONFIG_KIND,
            dra.CONFIG_CAPABILITIES: self.ask.capabilities,
        }
        if self.ask.profile is not None:
            parameters[dra.CONFIG_LIMIT_PROFILE] = self.ask.profile
        devices_spec: Obj = {"requests": [request]}
        if constraints:
            devices_spec["constraints"] = constraints
        if self.vendor.config:  # an AMD claim has none: no capabilities, no limit profile
            devices_spec["config"] = [{"opaque": {"driver": dra.DRIVER, "parameters": parameters}}]
        spec: Obj = {
            "metadata": {"labels": {MANAGED_BY: MANAGER}},
            "spec": {"devices": devices_spec},
        }
        name = _content_name(spec)
        spec["metadata"]["labels"][TEMPLATE_LABEL] = name
        return Claimed(name, spec, most, tuple(self.warnings), self.vendor.vendor)


def claim(ask: Ask, pools: Pools) -> Claimed:
    """The template `ask` becomes on the DRA path; Unplaceable when no pool can ever give it.

    Kept with the pools snapshot (a Deployment's pods ask alike), so the result is shared:
    read-only. A translation passes over one node of each make-up (`Pools.alike`: nodes alike
    give any claim the same), over all GPUs only where GPUs are named; a denial is worded
    from all of them (its UUIDs and counts), and is not kept."""
    kept = pools.claims
    found = kept.get(ask)
    if not isinstance(found, Claimed):
        if len(kept) >= 1024:
            kept.clear()
        named = ask.request.uuids or ask.request.excluded_uuids
        try:
            found = _Translation(ask, pools, pools.devices if named else pools.alike).claim()
        except Unplaceable:
            _Translation(ask, pools, pools.devices).claim()
            raise
        kept[ask] = found
    return found
