"""The mutation, a pure function: (pod, namespace, policy, fleet, keyring) → patch or denial.

No sockets, files or clocks: the server and `gpuwire mutate` are thin shells around `mutate`,
and the tests call it directly. The rules, in the order a container meets them:

* GPU containers (named by `gpuwire.io/containers`; else those with an `nvidia.com/gpu`
  resource, or another GPU resource of the cluster's device plugins; else, when the pod asks
  by annotation, every app container) get
  `NVIDIA_VISIBLE_DEVICES` (`all`, `none` or the named GPUs; left to the device plugin where
  it chooses), `NVIDIA_DRIVER_CAPABILITIES`, the limit profiles' env and `GPUWIRE_GRANT`.
* Every other container gets `NVIDIA_VISIBLE_DEVICES=void` (policy `voidUnrequested`), and a
  hand-written value is replaced unless the namespace is trusted, where it is granted as is.
* Model, memory, device and limit requests become required node affinity; a container the
  device plugin serves asks for the resource that lists the model it wants
  (`nvidia.com/gpu: 1` → `nvidia.com/l4: 1`) where `nvidia.com/gpu` would not hand it that.
* Model, memory and device requests become required node affinity.
* A MIG profile (`gpuwire.io/mig-profile`, counted by `gpuwire.io/gpu-count`) becomes the
  device plugin's mixed-strategy resource `nvidia.com/mig-<profile>` where the cluster runs
  one, else MIG devices the webhook names for the container (`webhook/placement.py`).
* Where the policy says DRA (`allocation: dra`, or `auto` where the cluster's ResourceSlices
  can give it), a GPU container gets a ResourceClaim instead, made from a template named by
  its request (`webhook/claims.py`): an entry in `spec.resourceClaims`, the container's
  `resources.claims`, its `nvidia.com/gpu` resource dropped, and `NVIDIA_VISIBLE_DEVICES=void`
  (the claim's CDI spec gives its GPUs), and the policy's RuntimeClass as a granted pod
  does. The templates to create come back with the patch.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwire import annotations as keys
from gpuwire import devices, grant, limits, nvidia
from gpuwire.annotations import AnnotationError, GpuRequest, MemoryLimit
from gpuwire.vendor import AMD, NVIDIA, Vendor, of_resource
from webhook import affinity, hami
from webhook import claims as dra_claims
from webhook.claims import Ask, Claimed
from webhook.fleet import Fleet
from webhook.patch import Change, Op, env_ops, pointer, set_path
from webhook.placement import Demand, Placement, Unplaceable, place
from webhook.pod import GPU_RESOURCE, MIG_RESOURCE_PREFIX, Container, MalformedPod, Pod
from webhook.policy import Policy, Rule
from webhook.pools import NO_POOLS, Pools
from webhook.warned import Warned

VISIBLE = nvidia.VISIBLE_DEVICES_ENV
CAPS = nvidia.CAPABILITIES_ENV
VOID = devices.Kind.VOID.value
NO_RULE = Rule(match=(), annotations=False)
CDI_ANNOTATIONS = "cdi.k8s.io/"
NOWHERE = Placement()  # of a pod without GPU containers: no constraint
# Few distinct values, asked on every admission (the contract module stays import-light).
_capabilities = functools.lru_cache(maxsize=256)(nvidia.parse_capabilities)
# What a grant signs of a container's request, the same for a Deployment's every pod: made
# once, and each pod's grant binds it to that pod (its admission) and its limits.
_canonical = functools.lru_cache(maxsize=256)(grant.canonical_request)


@dataclass(frozen=True, slots=True)
class Denial:
    code: int  # 400: the request is wrong; 403: the policy forbids it
    message: str
    # the answer is the cluster's: no GPU node (or ResourceSlice) it has gives what the pod
    # asks (`gpuwire mutate` says how to give it one)
    of_cluster: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    patch: tuple[Op, ...] = ()
    warnings: tuple[str, ...] = ()  # each a `Warned` where the mutation says its kind
    denial: Denial | None = None
    skipped: str | None = None  # why the pod passed untouched
    # ResourceClaimTemplates the patch's claims are made from: they must exist (the server
    # creates them before answering, except on a dry run)
    templates: tuple[dict[str, Any], ...] = ()
    granted: tuple[str, ...] = ()  # what each GPU container was given, for the log

    @property
    def allowed(self) -> bool:
        return self.denial is None


class Denied(Exception):
    def __init__(self, code: int, message: str, of_cluster: bool = False) -> None:
        super().__init__(message)
        self.denial = Denial(code, message, of_cluster)


@dataclass
class _Devices:
    """The GPUs one container is granted, and the resource op that asks the plugin for them."""

    visible: str  # NVIDIA_VISIBLE_DEVICES (AMD_VISIBLE_DEVICES) value, or grant.PLUGIN_DEVICES
    devices: int | None  # how many GPUs it sees, where known
    ops: list[Op] = field(default_factory=list)
    resource: str | None = None  # the device plugin's resource that gives them, if one does


def _describe(change: Change) -> Warned:
    old = "(valueFrom)" if change.old is None else change.old
    new = "removed" if change.new is None else f"replaced by {change.new}"
    if change.name == grant.ENV:
        old = "(hand-written)"
    return Warned("env-replaced", f"container {change.container!r}: {change.name}={old} {new}")


class _Mutation:
    def __init__(
        self,
        pod: Pod,
        namespace: str,
        policy: Policy,
        fleet: Fleet,
        keyring: grant.KeyRing,
        pools: Pools = NO_POOLS,
        translated: hami.Translated | None = None,
        admission: str = "",
    ) -> None:
        self.pod = pod
        self.admission = admission  # the grants' pod (gpuwire.grant.POD_ANNOTATION)
        self.hami = translated
        self.namespace = namespace
        self.policy = policy
        self.fleet = fleet
        self.keyring = keyring
        self.pools = pools
        self.allocation = policy.allocation_for(namespace)
        self.rule = policy.rule(namespace) or NO_RULE
        self.warnings: list[str] = []
        self.granted = False
        self.given: list[str] = []  # what each GPU container gets, for the log

    # --- the whole pod

    def warn(self, kind: str, text: str) -> None:
        self.warnings.append(Warned(kind, text))

    def run(self) -> Outcome:
        self.unknown_annotations()
        cdi = self.cdi_annotations()
        try:
            request = keys.parse(self.pod.annotations)
        except AnnotationError as exc:
            raise Denied(400, str(exc)) from exc
        if self.hami is not None:
            request = self.hami_limits(request, self.hami.asked)
        if request.asks and not self.rule.annotations:
            asked = ", ".join(request.given)
            raise Denied(
                403,
                f"namespace {self.namespace!r} may not ask for GPUs by annotation ({asked}): "
                "no rule of the gpuwire policy allows it",
            )
        if request.profiles and not request.wants_limits:
            self.warn(
                "profile-without-limits",
                f"{keys.LIMIT_PROFILE} has no effect without "
                f"{keys.MEMORY_LIMIT} or {keys.CORES_LIMIT}",
            )
        gpu = self.gpu_containers(request)
        claimed = self.claims(gpu, request) if gpu and self.allocation != "devicePlugin" else {}
        placement = NOWHERE
        if rest := gpu - set(claimed):
            self.claims_only(request)
            allow = self.policy.unknown_model == "allow"
            try:
                named = self.named_mig(rest)
                demand = self.demand(request, rest)
                placement = place(request, self.fleet, allow, demand, named)
            except Unplaceable as exc:
                raise Denied(400, str(exc), of_cluster=True) from exc
            self.warnings += placement.warnings
            self.nvidia_only(request, placement)
        ops: list[Op] = cdi
        for c in self.pod.containers:
            if c.name in claimed:
                ops += self.claim_container(c, claimed[c.name])
            elif c.name in gpu:
                ops += self.gpu_container(c, request, placement)
            else:
                ops += self.other_container(c)
        ops += self.runtime_class(bool(claimed))
        ops += self.grant_pod()
        ops += affinity.require(self.pod.spec, placement.expressions)
        ops += self.claim_entries(claimed)
        templates = {c.name: c.template(self.namespace) for c in claimed.values() if c}
        return Outcome(
            tuple(ops),
            tuple(self.warnings),
            templates=tuple(templates.values()),
            granted=tuple(self.given),
        )

    def hami_limits(self, request: GpuRequest, asked: hami.Asked) -> GpuRequest:
        """The request with the limits HAMi's resources ask, said in a warning: they leave
        the containers' resources (nothing advertises them without HAMi's device plugin)."""
        try:
            merged = hami.merged(request, asked)
        except hami.HamiError as exc:
            raise Denied(400, str(exc)) from exc
        held = [f"{k}: {merged.given[k]}" for k in (keys.MEMORY_LIMIT, keys.CORES_LIMIT)
                if k in merged.given and k not in request.given]  # fmt: skip
        self.warn(
            "hami-resources",
            f"{'; '.join(held) or f'no limit (HAMi: {asked.said})'}: out of the container's "
            "resources, which no node advertises without HAMi's device plugin",
        )
        return merged

    def unknown_annotations(self) -> None:
        """Keys gpuwire does not read that look meant for it, and near misses of HAMi's
        resource names: a typo denies the pod (policy unknownAnnotations: deny) or is a
        warning; a key HAMi reads and gpuwire does not is a warning."""
        written = {k: v for k, v in self.pod.annotations.items() if k != grant.POD_ANNOTATION}
        found = keys.unknown(written)  # the grant annotation is the webhook's own
        typos = [f"{u.key}: {self.pod.annotations[u.key]!r}: {u}" for u in found if u.typo]
        misses = hami.near_misses(self.pod, self.fleet.resources)
        if (typos or misses) and self.policy.unknown_annotations == "deny":
            what = " and ".join(
                w for w, said in (("annotations", typos), ("resource names", misses)) if said
            )
            raise Denied(
                400,
                f"{'; '.join(typos + misses)} (the gpuwire policy denies {what} it does not "
                "know: unknownAnnotations: deny; docs/annotations.md)",
            )
        for u in found:
            if u.typo:
                self.warn("unknown-annotation", f"{u} (ignored)")
            else:
                self.warn("unread-annotation", f"{u} (ignored)")
        for miss in misses:
            self.warn("unknown-resource", f"{miss} (left as written)")

    def runtime_class(self, claimed: bool) -> list[Op]:
        """The policy's RuntimeClass on a pod that names none and gets a GPU, by grant or by a
        claim of gpuwire's: gpuwire's runtime checks a claim's token only where it runs."""
        name = self.policy.runtime_class
        if not (self.granted or claimed) or not name or self.pod.spec.get("runtimeClassName"):
            return []
        return [{"op": "add", "path": "/spec/runtimeClassName", "value": name}]

    def grant_pod(self) -> list[Op]:
        """The pod's grant annotation: this admission, which every grant written binds; on
        a pod granted nothing, none (a value a pod came with is never kept: a copy of another
        pod's, with that pod's grants, would pass for it)."""
        if self.granted and self.admission:
            op = set_path(self.pod.raw, "", ("metadata", "annotations", grant.POD_ANNOTATION),
                          self.admission)  # fmt: skip
            return [op] if op else []
        if grant.POD_ANNOTATION in self.pod.annotations:
            return [
                {"op": "remove", "path": pointer("/metadata/annotations", grant.POD_ANNOTATION)}
            ]
        return []

    def cdi_annotations(self) -> list[Op]:
        """containerd (>= 1.7) and CRI-O inject the CDI devices a pod annotation
        `cdi.k8s.io/<any>: <vendor/class=name>,...` names, whoever wrote it: any pod author
        could name every GPU of the node. Outside namespaces the policy trusts with them
        (`cdiAnnotations: allow`) they are removed, with a warning, or the pod is denied."""
        named = sorted(k for k in self.pod.annotations if k.startswith(CDI_ANNOTATIONS))
        if not named or self.rule.cdi_annotations == "allow":
            return []
        given = ", ".join(f"{k}={self.pod.annotations[k]!r}" for k in named)
        if self.rule.cdi_annotations == "deny":
            raise Denied(
                403,
                f"{given}: {CDI_ANNOTATIONS}* annotations name CDI devices for the runtime to "
                f"inject, which namespace {self.namespace!r} may not do; ask for GPUs with "
                "gpuwire.io annotations or a ResourceClaim",
            )
        self.warn("cdi-annotation-removed", f"{given} removed: namespace {self.namespace!r} may "
                  "not name CDI devices (policy cdiAnnotations)")  # fmt: skip
        return [{"op": "remove", "path": pointer("/metadata/annotations", k)} for k in named]

    def named_mig(self, gpu: set[str]) -> tuple[str, ...]:
        """The MIG devices the pod's GPU containers already name (a second admission)."""
        found = [c.value(VISIBLE) or "" for c in self.pod.containers if c.name in gpu]
        return tuple(u for u in found[0].split(",") if u.startswith("MIG-")) if found else ()

    def gpu_containers(self, request: GpuRequest) -> set[str]:
        if request.containers:
            unknown = [n for n in request.containers if self.pod.named(n) is None]
            if unknown:
                names = ", ".join(c.name for c in self.pod.containers)
                raise Denied(
                    400,
                    f"{keys.CONTAINERS}: {request.given[keys.CONTAINERS]!r} names "
                    f"{', '.join(unknown)}, which this pod does not have; accepted: {names}",
                )
            return set(request.containers)
        with_resource = {
            c.name
            for c in self.pod.containers
            if ((asked := self.plugin_count(c)) and asked[1]) or c.mig or self.translated(c)
        }
        if with_resource or not request.asks:
            return with_resource
        return {c.name for c in self.pod.app_containers}

    # --- the DRA path

    def translated(self, c: Container) -> bool:
        """Whether an earlier admission gave the container its claim (its entry names a
        gpuwire template): it keeps it, as it is."""
        entry = _entry(c.name)
        template = self.pod.resource_claims.get(entry)
        return entry in c.claims and bool(template and template.startswith(dra_claims.PREFIX))

    def claims(self, gpu: set[str], request: GpuRequest) -> dict[str, Claimed | None]:
        """The GPU containers that get a claim, and from which template (None: the one an
        earlier admission gave them); the others go the device-plugin way."""
        out: dict[str, Claimed | None] = {}
        for c in self.pod.containers:
            if c.name not in gpu:
                continue
            if self.translated(c):
                out[c.name] = None
                continue
            ask = self.ask(c, request)
            if ask is None:
                continue
            try:
                found = dra_claims.claim(ask, self.pools)
            except Unplaceable as exc:
                if self.allocation == "dra":
                    raise Denied(400, str(exc), of_cluster=True) from exc
                continue  # auto: the device-plugin way
            visible = "all" if ask.count == "all" else "claim"
            self.check_count(c, request, _Devices(visible, found.gpus))
            self.warnings += [w for w in found.warnings if w not in self.warnings]
            out[c.name] = found
            self.given.append(f"{c.name}: a claim from template {found.name} ({ask.count} GPU(s))")
        return out

    def ask(self, c: Container, request: GpuRequest) -> Ask | None:
        """What the container's claim must give; None where it takes the device-plugin way
        (a GPU resource the policy keeps; under `auto`, driver files without a GPU)."""
        dra_only = self.allocation == "dra"
        mig = request.mig_profile
        count: dra_claims.Count
        counted = ""
        if c.mig is not None:
            if not self.policy.claim_gpu_resources:
                return None
            self.mig_resource(c, request, *c.mig)
            mig = nvidia.mig_profile_of(c.mig[0].removeprefix(MIG_RESOURCE_PREFIX))
            count = c.mig[1]
            counted = f"container {c.name!r}'s {c.mig[0]}: {count}"
        elif (asked := self.plugin_count(c)) is not None:
            if asked[0] != GPU_RESOURCE:
                return None  # a per-model resource: the device plugin's `resources` rules
            if not self.policy.claim_gpu_resources or asked[1] == 0:
                return None
            self.check_plugin(c, request, *asked)
            count = asked[1]
            counted = f"container {c.name!r}'s {GPU_RESOURCE}: {count}"
        elif mig is not None:
            count = request.count if isinstance(request.count, int) else 1
        elif request.uuids:
            count = len(request.uuids)
            counted = f"{len(request.uuids)} named GPU(s)"
        else:
            wanted = request.count if request.count is not None else self.policy.gpu_count
            if wanted == "none":
                if not dra_only:
                    return None
                value = request.given.get(keys.COUNT, "unset (policy default gpuCount: none)")
                raise Denied(
                    400,
                    f"{keys.COUNT}: {value!r} asks for the driver's files without a GPU, which "
                    "no ResourceClaim gives (the policy sends this namespace's GPU pods the DRA "
                    "way); accepted here: all or a positive integer",
                )
            count = wanted
        profile = None
        if request.wants_limits:
            profiles = request.profiles or self.policy.limit_profiles
            if len(profiles) != 1:
                key, value = (
                    request.source(keys.LIMIT_PROFILE)
                    if request.profiles
                    else ("the policy's limitProfile", ",".join(profiles))
                )
                raise Denied(
                    400,
                    f"{key}: {value!r} names {len(profiles)} limit profiles; a claim's share "
                    "is held by one (its GpuConfig limitProfile); accepted: one of "
                    f"{', '.join(limits.PROFILES)}",
                )
            profile = profiles[0]
        caps = self.capabilities(request)
        return Ask(request, count, caps, profile, self.policy.nvlink, mig, counted)

    def claim_container(self, c: Container, claimed: Claimed | None) -> list[Op]:
        """Its claim in `resources.claims`, its GPU resource gone, and no GPU by env: the
        claim's CDI spec gives the GPUs (and names them in NVIDIA_VISIBLE_DEVICES itself)."""
        ops: list[Op] = []
        if claimed is not None:
            resources = c.raw.get("resources") or {}
            claimed_away = {GPU_RESOURCE, *(c.mig[:1] if c.mig else ())}
            for section in ("limits", "requests"):
                held = resources.get(section) or {}
                gone = [n for n in held if n in claimed_away]
                if gone and len(gone) == len(held):  # nothing else left: the section goes
                    ops.append({"op": "remove", "path": pointer(c.path, "resources", section)})
                    continue
                ops += [{"op": "remove", "path": pointer(c.path, "resources", section, n)}
                        for n in gone]  # fmt: skip
            entry = {"name": _entry(c.name)}
            if not isinstance(resources.get("claims"), list):
                op = set_path(c.raw, c.path, ("resources", "claims"), [entry])
                ops += [op] if op else []
            elif entry["name"] not in c.claims:
                ops.append({"op": "add", "path": c.path + "/resources/claims/-", "value": entry})
        void: dict[str, str | None] = {VISIBLE: VOID, grant.ENV: None}
        if claimed is not None:  # its vendor's too: no runtime injects from the image's
            void[claimed.vendor.visible_env] = VOID
        return ops + self.env(c, void)

    def claim_entries(self, claimed: dict[str, Claimed | None]) -> list[Op]:
        """The pod's claim entries, one per container that gets a claim, each made from its
        template; the pod's own entries are left alone."""
        new = []
        for container, found in claimed.items():
            if found is None:
                continue
            name = _entry(container)
            existing = self.pod.resource_claims.get(name, "")
            if existing == found.name:
                continue
            if name in self.pod.resource_claims:
                raise Denied(
                    400,
                    f"spec.resourceClaims already has an entry {name!r} (from "
                    f"{existing or 'a claim by name'}), which gpuwire uses for container "
                    f"{container!r}'s GPUs; rename the pod's own entry",
                )
            new.append({"name": name, "resourceClaimTemplateName": found.name})
        if not new:
            return []
        if isinstance(self.pod.spec.get("resourceClaims"), list):
            return [{"op": "add", "path": "/spec/resourceClaims/-", "value": e} for e in new]
        return [{"op": "add", "path": "/spec/resourceClaims", "value": new}]

    def plugin_count(self, c: Container) -> tuple[str, int] | None:
        """The GPU resource a container asks the device plugin for, and how many; the
        cluster's per-model resources (`nvidia.com/l4`) count as well as `nvidia.com/gpu`."""
        if c.gpus is not None:
            return GPU_RESOURCE, c.gpus
        for name in self.fleet.resources:
            if name != GPU_RESOURCE and (n := c.count_of(name)) is not None:
                return name, n
        return None

    def demand(self, request: GpuRequest, gpu: set[str]) -> Demand:
        """What the GPU containers need of a node: a device plugin, all its GPUs, the limit
        profiles their limits need enforced."""
        plugin, whole, asks = 0, False, GPU_RESOURCE
        count = request.count if request.count is not None else self.policy.gpu_count
        for c in self.pod.containers:
            if c.name not in gpu or c.mig is not None or request.mig_profile:
                continue  # MIG devices: placed by their profile
            asked = self.plugin_count(c)
            if asked and asked[1]:
                plugin += asked[1]
                asks = asked[0]
            elif not request.uuids and count == "all":
                whole = True
            elif not request.uuids and isinstance(count, int):
                plugin += count
        device_plugin = self.policy.device_plugin
        if not request.wants_limits:
            return Demand(plugin, asks, whole, device_plugin=device_plugin)
        names = request.profiles or self.policy.limit_profiles
        source = (
            f"{keys.LIMIT_PROFILE}: {request.given[keys.LIMIT_PROFILE]!r}"
            if request.profiles
            else f"the policy's default limitProfile: {', '.join(names)}"
        )
        for name in names:
            if not limits.PROFILES[name].enforced:
                self.warn(
                    "advisory-profile",
                    f"profile {name!r} is advisory: the framework reads it, nothing enforces it",
                )
        enforced = tuple(n for n in names if limits.PROFILES[n].enforced)
        return Demand(plugin, asks, whole, enforced, source, device_plugin)

    # --- one container

    def gpu_container(self, c: Container, request: GpuRequest, placement: Placement) -> list[Op]:
        granted = self.devices(c, request, placement)
        self.check_count(c, request, granted)
        vendors = self.vendors(granted, placement)
        caps = self.capabilities(request) if any(v.capabilities_env for v in vendors) else ""
        env: dict[str, str | None] = {}
        for vendor in vendors:  # each vendor of the nodes it may land on reads its own
            plugin = granted.visible == grant.PLUGIN_DEVICES
            env[vendor.visible_env] = None if plugin else granted.visible
            if vendor.capabilities_env:
                env[vendor.capabilities_env] = caps
        if request.wants_limits:
            env.update(self.limits(c, request, placement, granted.devices))
        env[grant.ENV] = self.sign(c, granted.visible, caps, env, vendors)
        self.given.append(_given(c.name, granted, caps, env))
        return granted.ops + self.env(c, env)

    def devices(self, c: Container, request: GpuRequest, placement: Placement) -> _Devices:
        """What the container sees: the plugin's choice, the named GPUs, all, none or N."""
        if c.mig is not None:
            return self.mig_resource(c, request, *c.mig)
        asked = self.plugin_count(c)
        if asked and asked[1]:  # nvidia.com/gpu: 0 asks the plugin for nothing
            self.check_plugin(c, request, *asked)
            resource = placement.resource if asked[0] == GPU_RESOURCE else None
            ops = self.rename(c, asked, placement)
            return _Devices(grant.PLUGIN_DEVICES, asked[1], ops, resource or asked[0])
        if request.mig_profile:
            return self.mig_devices(c, request, placement)
        if request.uuids:
            self.check_named(request)
            return _Devices(",".join(placement.devices or request.uuids), len(request.uuids))
        count = request.count if request.count is not None else self.policy.gpu_count
        if count == "all":
            self.check_all_gpus(c, request)
            return _Devices("all", placement.gpu_count())
        if count == "none":
            return _Devices("none", 0)
        if not self.policy.device_plugin:
            value = request.given.get(keys.COUNT, f"unset (policy default gpuCount: {count})")
            missing = [f"{r}: true" for r, on in self.plugin_less_rules().items() if not on]
            admin = (
                f"; an admin allows more with a rule of the gpuwire policy for the namespace: "
                f"{' or '.join(missing)}"
                if missing
                else ""
            )
            raise Denied(
                400,
                f"{keys.COUNT}: {value!r} asks for {count} GPU(s), which only a device plugin can "
                "choose, and the gpuwire policy says this cluster runs none (devicePlugin: false); "
                f"accepted here: {self.accepted_without_plugin()}{admin}",
            )
        resource = placement.resource or GPU_RESOURCE
        op = set_path(c.raw, c.path, ("resources", "limits", resource), str(count))
        return _Devices(grant.PLUGIN_DEVICES, count, [op] if op else [], resource)

    def rename(self, c: Container, asked: tuple[str, int], placement: Placement) -> list[Op]:
        """`nvidia.com/gpu` → the resource that lists the model asked for, where the plugin
        would otherwise hand any GPU of the node."""
        wanted = placement.resource
        if wanted is None or asked[0] != GPU_RESOURCE:
            return []
        ops: list[Op] = []
        for section in ("limits", "requests"):
            held = (c.raw.get("resources") or {}).get(section) or {}
            if GPU_RESOURCE in held:
                base = pointer(c.path, "resources", section)
                ops.append({"op": "remove", "path": pointer(base, GPU_RESOURCE)})
                ops.append(
                    {"op": "add", "path": pointer(base, wanted), "value": held[GPU_RESOURCE]}
                )
        self.warn(
            "resource-renamed",
            f"container {c.name!r}: {GPU_RESOURCE}: {asked[1]} asks for {wanted}: {asked[1]}, "
            "the resource holding only the GPUs asked for",
        )
        return ops

    def mig_resource(self, c: Container, request: GpuRequest, name: str, count: int) -> _Devices:
        """A container with a mixed-strategy resource: the plugin chooses its MIG devices."""
        profile = nvidia.mig_profile_of(name.removeprefix(MIG_RESOURCE_PREFIX))
        if c.gpus:
            raise Denied(
                400,
                f"container {c.name!r} asks for both whole GPUs ({GPU_RESOURCE}: {c.gpus}) "
                f"and MIG devices ({name}: {count}); a container gets one or the other",
            )
        if request.mig_profile not in (None, profile):
            key, value = request.source(keys.MIG_PROFILE)
            raise Denied(
                400,
                f"{key}: {value!r} disagrees with container {c.name!r}'s {name}: {count}; "
                f"accepted: {profile}, or no {key}",
            )
        return _Devices(grant.PLUGIN_DEVICES, count, resource=name)

    def mig_devices(self, c: Container, request: GpuRequest, placement: Placement) -> _Devices:
        """MIG devices of the asked profile: the plugin's resource, else those the placement
        named."""
        profile = request.mig_profile
        assert profile is not None
        count = request.count if isinstance(request.count, int) else 1
        if placement.devices:
            return _Devices(",".join(placement.devices), count)
        resource = nvidia.mig_resource(profile)
        op = set_path(c.raw, c.path, ("resources", "limits", resource), str(count))
        return _Devices(grant.PLUGIN_DEVICES, count, [op] if op else [], resource)

    def check_plugin(self, c: Container, request: GpuRequest, resource: str, count: int) -> None:
        """A container the device plugin serves cannot also name its GPUs or take all."""
        if request.mig_profile:
            key, value = request.source(keys.MIG_PROFILE)
            raise Denied(
                400,
                f"{key}: {value!r} asks for MIG devices, but container {c.name!r} asks for "
                f"whole GPUs ({resource}: {count}); accepted: {keys.MIG_PROFILE} "
                f"without {resource}, or {nvidia.mig_resource(request.mig_profile)}",
            )
        if request.uuids:
            key, value = request.source(keys.UUID, keys.HAMI_USE_UUID)
            raise Denied(
                400,
                f"{key}: {value!r} names GPUs, but container {c.name!r} gets its GPUs from the "
                f"device plugin ({resource}: {count}), which chooses them; "
                f"accepted: explicit GPUs on a container without {resource}",
            )
        if request.count is not None and request.count != count:
            raise Denied(
                400,
                f"{keys.COUNT}: {request.given[keys.COUNT]!r} disagrees with container "
                f"{c.name!r}'s {resource}: {count}; accepted: {count}, or no {keys.COUNT}",
            )

    def plugin_less_rules(self) -> dict[str, bool]:
        """What the namespace's rule allows of what a cluster without a device plugin can
        grant (besides no GPU): every GPU of a node, named GPUs."""
        return {"allGpus": self.rule.all_gpus, "explicitDevices": self.rule.explicit_devices}

    def accepted_without_plugin(self) -> str:
        """What a denial offers where no device plugin runs (devicePlugin: false): only what
        the namespace's rule allows, so that following it is admitted."""
        ways = {"allGpus": f"{keys.COUNT}: all", "explicitDevices": f"GPU UUIDs in {keys.UUID}"}
        allowed = [ways[r] for r, on in self.plugin_less_rules().items() if on]
        return ", or ".join([*allowed, f"no GPU ({keys.COUNT}: none)"])

    def sharing_risk(self) -> str:
        """Why taking every GPU or naming GPUs is a namespace's rule: nothing else knows."""
        if self.policy.device_plugin:
            return "the device plugin would not know, and hand the same GPUs to other pods"
        return (
            "no device plugin runs here (devicePlugin: false), so nothing keeps other pods off them"
        )

    def check_named(self, request: GpuRequest) -> None:
        """GPUs named without the device plugin or a claim: where the policy names the
        namespace (explicitDevices), as the device plugin would go on handing them out. (A
        claim's named GPUs the scheduler allocates: the DRA path needs no such rule.)"""
        if self.rule.explicit_devices:
            return
        key, value = request.source(keys.UUID, keys.HAMI_USE_UUID)
        accepted = (
            f"{keys.COUNT} and model or memory annotations"
            if self.policy.device_plugin
            else self.accepted_without_plugin()
        )
        raise Denied(
            403,
            f"{key}: {value!r} names GPUs, which namespace {self.namespace!r} may not do: "
            f"{self.sharing_risk()}; accepted here: {accepted}; an admin allows it with a "
            "rule of the gpuwire policy for the namespace: explicitDevices: true",
        )

    def check_all_gpus(self, c: Container, request: GpuRequest) -> None:
        """Every GPU of a node without the device plugin: where the policy names the
        namespace (allGpus), as the device plugin would go on handing those GPUs out."""
        if self.rule.all_gpus:
            return
        value = request.given.get(keys.COUNT, "unset (policy default gpuCount: all)")
        if self.policy.device_plugin:
            asks = "every GPU of its node without the device plugin"
            accepted = f"{keys.COUNT}: N, or {GPU_RESOURCE}: N in the container's limits"
        else:
            asks, accepted = "every GPU of its node", self.accepted_without_plugin()
        raise Denied(
            403,
            f"container {c.name!r} asks for {asks} ({keys.COUNT}: {value!r}), which namespace "
            f"{self.namespace!r} may not do: {self.sharing_risk()}; accepted here: {accepted}; "
            "an admin allows it with a rule of the gpuwire policy for the namespace: "
            "allGpus: true",
        )

    def check_count(self, c: Container, request: GpuRequest, granted: _Devices) -> None:
        """At most the rule's maxGpus; `all` passes where every node it can land on has no more."""
        most = self.rule.max_gpus
        if most == "all" or (granted.devices is not None and granted.devices <= most):
            return
        if granted.visible == "all":
            known = f", up to {granted.devices} on its nodes" if granted.devices else ""
            asks = f"all GPUs of its node{known}"
        else:
            asks = f"{granted.devices} GPUs"
        raise Denied(
            403,
            f"container {c.name!r} asks for {asks} ({keys.COUNT}: "
            f"{request.given.get(keys.COUNT, 'unset')!r}); namespace {self.namespace!r} may "
            f"have at most {most} per container",
        )

    def capabilities(self, request: GpuRequest) -> str:
        caps = request.capabilities or self.policy.capabilities
        extra = sorted(set(_capabilities(caps)).difference(self.rule.capabilities))
        if extra:
            value = request.given.get(keys.CAPABILITIES, f"unset (policy default {caps})")
            raise Denied(
                403,
                f"{keys.CAPABILITIES}: {value!r} asks for {', '.join(extra)}, which namespace "
                f"{self.namespace!r} may not have; "
                f"accepted here: {', '.join(self.rule.capabilities)}",
            )
        return caps

    def limits(
        self, c: Container, request: GpuRequest, placement: Placement, count: int | None
    ) -> dict[str, str | None]:
        memory_mib = placement.gpu_memory_mib()
        share = request.memory_limit or MemoryLimit()
        self.check_share(request, share, placement)
        mib, fraction = share.resolve(memory_mib)
        wanted = limits.Limits(mib, fraction, request.cores_limit, devices=count)
        if share.percent and len(placement.memories) > 1:
            self.warn(
                "limit-sized-by-smallest",
                f"{keys.MEMORY_LIMIT}={request.given[keys.MEMORY_LIMIT]} taken against the "
                f"smallest candidate GPU ({memory_mib} MiB)",
            )
        existing = c.values()
        env: dict[str, str | None] = {}
        for name in request.profiles or self.policy.limit_profiles:
            profile = limits.PROFILES[name]
            try:
                env.update(profile.render(wanted, existing))
            except limits.LimitError as exc:
                key = keys.MEMORY_LIMIT
                if profile.enforced:
                    raise Denied(400, f"{key}: {request.given[key]!r}: {exc}") from exc
                self.warn("profile-skipped", f"{key}: profile {name!r} skipped: {exc}")
            env.update(dict.fromkeys(profile.escaping(c.named)))
        return env

    def check_share(self, request: GpuRequest, share: MemoryLimit, placement: Placement) -> None:
        """A memory limit larger than every GPU the pod can get caps nothing: a mistake."""
        if share.mib is None or not placement.memories or share.mib <= placement.memories[-1]:
            return
        sizes = sorted(
            {
                f"{g.product} {g.memory_mib} MiB"
                for n in placement.nodes
                for g in n.gpus
                if g.memory_mib in placement.memories
            }
        )
        raise Denied(
            400,
            f"{keys.MEMORY_LIMIT}: {request.given[keys.MEMORY_LIMIT]!r} (= {share.mib} MiB) is "
            f"more than any GPU the pod can get has, so it would cap nothing; GPUs there: "
            f"{', '.join(sizes) or f'{placement.memories[-1]} MiB'}; accepted: at most "
            f"{placement.memories[-1]} MiB, or a share of the GPU (e.g. 50%)",
        )

    def other_container(self, c: Container) -> list[Op]:
        """A container that asked for nothing: void for each vendor of the cluster, unless a
        trusted namespace wrote a value, which is granted as is."""
        desired: dict[str, str | None] = {}
        signed: list[str] = []
        keep_grant = False
        for vendor in self.fleet.node_vendors:
            name = vendor.visible_env
            value = c.value(name)
            void = value is not None and (
                vendor.visible_request({name: value}).kind is devices.Kind.VOID
            )
            if c.sets(name) and self.rule.trust_visible_devices:
                if value is None:
                    self.warn(
                        "env-not-granted",
                        f"container {c.name!r}: {name} from valueFrom cannot be granted",
                    )
                    keep_grant = True
                elif not void:
                    caps_name = vendor.capabilities_env
                    caps = c.value(caps_name) if caps_name else None
                    try:
                        signed += [g for g in [self.sign(c, value, caps, {}, (vendor,))] if g]
                    except nvidia.CapabilityError as exc:
                        raise Denied(
                            400, f"container {c.name!r}: {caps_name}={caps!r}: {exc}"
                        ) from exc
                continue
            if (c.sets(name) and not void) or self.policy.void_unrequested:
                desired[name] = VOID
        if not keep_grant:
            desired[grant.ENV] = ",".join(signed) or None
        return self.env(c, desired)

    # --- shared steps

    def claims_only(self, request: GpuRequest) -> None:
        """A partition profile is selected by a claim (`partitionProfile`); the device
        plugin's way has AMD's resource per partition type for it."""
        if request.partition is None:
            return
        key, value = request.source(keys.PARTITION_PROFILE)
        raise Denied(
            400,
            f"{key}: {value!r} selects AMD partitions by their profile, which a ResourceClaim "
            "does (the policy's allocation: dra, or auto where the cluster's ResourceSlices "
            f"have them); on the device plugin's way ask for {AMD.label_prefix}"
            f"{request.partition}: N in the container's limits (AMD's mixed naming)",
            of_cluster=self.allocation == "auto",  # slices with partitions would take it
        )

    def nvidia_only(self, request: GpuRequest, placement: Placement) -> None:
        """Driver capabilities are what NVIDIA's runtime mounts, an enforced limit profile
        (MPS, HAMi-core) NVIDIA's way to share a GPU: asked for a pod that can only run on AMD
        nodes, they are a denial, not dropped (a profile without limits: not only a warning).
        (NVIDIA's other mechanisms deny on their own there: no AMD node offers a MIG profile,
        and placement denies limits no node there enforces.)"""
        vendors = placement.vendors
        if not vendors:
            return
        enforced = [p for p in request.profiles if limits.PROFILES[p].enforced]
        if keys.CAPABILITIES in request.given and not any(v.capabilities_env for v in vendors):
            key, what = keys.CAPABILITIES, "the driver capabilities NVIDIA's runtime mounts"
            why = "ROCm's user space is in the image"
        elif enforced and not any(v.limits for v in vendors):
            key, what = keys.LIMIT_PROFILE, f"{', '.join(enforced)}: a GPU shared under a limit"
            why = "a container gets its GPUs whole"
        else:
            return
        raise Denied(
            400,
            f"{key}: {request.given[key]!r} is NVIDIA's ({what}), and the pod can only run on "
            f"AMD nodes ({', '.join(sorted(n.name for n in placement.nodes))}); accepted: no "
            f"{key} for AMD GPUs ({why}), or a model NVIDIA nodes have",
        )

    def vendors(self, granted: _Devices, placement: Placement) -> tuple[Vendor, ...]:
        """Whose nodes a GPU container may land on, so whose env it gets: the vendor of the
        device plugin's resource that serves it, else the vendors of the nodes the placement
        leaves (NVIDIA where it knows none)."""
        if granted.resource:
            return (of_resource(granted.resource),)
        return placement.vendors or (NVIDIA,)

    def sign(
        self,
        c: Container,
        visible: str,
        caps: str | None,
        desired: Mapping[str, str | None],
        vendors: tuple[Vendor, ...] = (NVIDIA,),
    ) -> str | None:
        """GPUWIRE_GRANT of container `c` for `visible` and `caps`: a grant for each vendor,
        comma-separated, each bound to this admission and to the limit variables its env will
        hold (its own, with `desired` written over them); Denied where one comes from
        valueFrom (the grant must know its value)."""
        self.granted = True
        own = {n: c.value(n) for n in c.named if grant.is_limit(n)}  # the env's limits
        hidden = [n for n, value in own.items() if n not in desired and value is None]
        if hidden:
            raise Denied(
                400,
                f"container {c.name!r}: {hidden[0]} from valueFrom: its GPU grant binds the "
                "value of each limit variable; give it as a value",
            )
        env = {**own, **desired}
        limits = grant.bound_limits({k: v for k, v in env.items() if v is not None})
        if self.keyring.keys:  # each vendor's grant binds the same pod and limits
            return ",".join(self.keyring.sign(self.subject(c, visible, caps, v, limits))
                            for v in vendors)  # fmt: skip
        _canonical(visible, caps, NVIDIA)  # unknown caps: still refused
        warning = f"no grant key loaded: {grant.ENV} not written"
        if warning not in self.warnings:
            self.warn("no-grant-key", warning)
        return None

    def subject(
        self, c: Container, visible: str, caps: str | None, vendor: Vendor, limits: str
    ) -> grant.Subject:
        """What `vendor`'s grant of container `c` signs: `grant.Subject.of`, with the request's
        canonical form memoized (only the pod and the limits are this admission's)."""
        devices, capabilities = _canonical(visible, caps, vendor)
        return grant.Subject(self.namespace, c.name, devices, capabilities, vendor.grant_tag,
                             self.admission, limits)  # fmt: skip

    def env(self, c: Container, desired: Mapping[str, str | None]) -> list[Op]:
        ops, changes = env_ops(c, desired)
        self.warnings += [_describe(change) for change in changes]
        return ops


def _given(container: str, granted: _Devices, caps: str, env: Mapping[str, str | None]) -> str:
    """What one container was granted, in a few words, for the admission's log line."""
    if granted.visible == grant.PLUGIN_DEVICES:
        asked = [op["path"].rsplit("/", 1)[-1].replace("~1", "/") for op in granted.ops
                 if op["op"] == "add"]  # fmt: skip
        what = f"{granted.devices} from the device plugin" + (f" ({asked[0]})" if asked else "")
    elif granted.visible in ("all", "none"):
        what = f"{granted.visible} GPUs of its node" if granted.visible == "all" else "no GPU"
    else:
        what = f"GPUs {granted.visible}"
    limited = sorted(k for k, v in env.items() if v is not None and k not in _GRANT_ENV)
    return f"{container}: {what}, {caps}" + (f", {','.join(limited)}" if limited else "")


_GRANT_ENV = (VISIBLE, CAPS, grant.ENV)


def _entry(container: str) -> str:
    """The pod's claim entry for a container's GPUs (a DNS label: at most 63 characters)."""
    name = dra_claims.PREFIX + container
    if len(name) <= 63:
        return name
    return dra_claims.PREFIX + hashlib.sha256(container.encode()).hexdigest()[:16]


def mutate(
    raw_pod: Any,
    namespace: str,
    policy: Policy,
    fleet: Fleet,
    keyring: grant.KeyRing,
    pools: Pools = NO_POOLS,
    admission: str = "gpuwire-mutate",
) -> Outcome:
    """The JSON patch (or denial) the webhook answers for a pod being created in `namespace`;
    `pools`: the cluster's DRA devices, for the policy's DRA path; `admission`: the
    AdmissionReview's request UID, which the pod's grants bind (gpuwire.grant)."""
    if policy.excluded(namespace):
        return Outcome(skipped=f"namespace {namespace} is excluded by the policy")
    try:
        pod = Pod.read(raw_pod)
        if pod.mirror:
            return Outcome(skipped="mirror pod")
        translated = hami.translate(pod)
        if translated is None:
            return _Mutation(pod, namespace, policy, fleet, keyring, pools, None, admission).run()
        # the mutation of the pod as gpuwire reads HAMi's resources, after the ops making it so
        view = Pod.read(translated.pod)
        outcome = _Mutation(
            view, namespace, policy, fleet, keyring, pools, translated, admission
        ).run()
        return dataclasses.replace(outcome, patch=(*translated.ops, *outcome.patch))
    except hami.HamiError as exc:
        return Outcome(denial=Denial(400, str(exc)))
    except MalformedPod as exc:
        return Outcome(denial=Denial(400, f"malformed pod: {exc}"))
    except Denied as exc:
        return Outcome(denial=exc.denial)
