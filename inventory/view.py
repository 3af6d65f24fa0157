"""The cluster's GPUs, who holds them and who waits for one: a pure function of API objects.

Nodes carry what their gpuwire agent found: `gpuwire.io/gpus` (each GPU: index, UUID,
product, memory, health, and its MIG devices; written by the labeler) and `gpuwire.io/holders`
(each container holding GPUs or MIG devices, from the kubelet's pod-resources and the runtime
side's records). A MIG device's holders are shown under its GPU, which counts as allocated
when it or one of its MIG devices is held. DRA claims add what the scheduler allocated: each
result of gpuwire's driver (`status.allocation`) names a device of a ResourceSlice, whose
`uuid` says which GPU or MIG device it is, held by the containers of the claim's consumers
(`reservedFor`) that use the claim (`resources.claims`) — before the kubelet has started
them; a shared GPU's shares (`consumedCapacity`) add up to its memory in use. Pods tell
which GPU pods are still Pending and why (their PodScheduled condition, or once bound, why
their containers wait). The input is the API's JSON (dicts), as `kubectl get -o json` or the
`kubernetes` client with `_preload_content=False` gives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwire import amd, dra, nodegpus, records
from gpuwire import annotations as gpu_annotations
from gpuwire import holders as holding
from gpuwire.quantity import QuantityError, api_mib
from gpuwire.vendor import VENDORS

VISIBLE_DEVICES = tuple(v.visible_env for v in VENDORS)  # a hand-written device request
GPU_TEMPLATES = "gpuwire-"  # the ResourceClaimTemplates gpuwire's webhook makes for GPU pods

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Mig:
    """A MIG device of a GPU and who holds it."""

    uuid: str
    profile: str
    gi: int
    ci: int
    memory_mib: int
    healthy: bool
    holders: tuple[holding.Holder, ...]
    conflicted: bool


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    product: str
    memory_mib: int
    healthy: bool
    holders: tuple[holding.Holder, ...]
    conflicted: bool
    mig: tuple[Mig, ...] | None = None  # None: not in MIG mode
    shared_mib: int | None = None  # a shared DRA GPU: the memory its claims' shares hold

    @property
    def name(self) -> str:
        return f"GPU {self.index}"

    @property
    def held(self) -> bool:
        """Whether a container holds it or one of its MIG devices."""
        return bool(self.holders) or any(m.holders for m in self.mig or ())


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    total: int  # its GPUs (without a gpuwire agent: the GPU resources it advertises)
    allocated: int  # its GPUs held by some container
    ready: bool
    schedulable: bool
    holders_known: bool  # the node carries a readable holders annotation
    problems: tuple[str, ...]  # annotations that could not be read
    conflicts: tuple[holding.Conflict, ...]

    def gpu_names(self) -> dict[str, str]:
        names = {g.uuid: g.name for g in self.gpus}
        names |= {
            m.uuid: f"MIG {m.profile} of GPU {g.index}" for g in self.gpus for m in g.mig or ()
        }
        return names


@dataclass(frozen=True)
class Pending:
    namespace: str
    pod: str
    request: str  # what it asks for, in words: `2 nvidia.com/gpu`, `gpu-count=all`
    node: str  # "" while unscheduled
    reason: str
    message: str


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    pending: tuple[Pending, ...]
    # The nodes looked at (a namespace filter leaves these totals alone):
    gpu_nodes: int
    total: int
    allocated: int

    @property
    def conflicts(self) -> list[tuple[Node, holding.Conflict]]:
        return [(n, c) for n in self.nodes for c in n.conflicts]


def is_gpu_resource(name: str) -> bool:
    """An extended resource that counts GPUs: `nvidia.com/gpu`, `nvidia.com/gpu.shared`,
    `amd.com/gpu`, per-model names such as `nvidia.com/gpu-a100`, AMD's partition types under
    its mixed naming (`amd.com/cpx_nps4`)."""
    domain, _, resource = name.partition("/")
    partitions = name.startswith(amd.LABEL_PREFIX) and "_nps" in resource
    return bool(domain) and "." in domain and (resource.startswith("gpu") or partitions)


def build(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    *,
    claims: Iterable[Obj] = (),
    slices: Iterable[Obj] = (),
    node: str | None = None,
    namespace: str | None = None,
) -> Inventory:
    """The inventory of `nodes` (those with GPUs) and the pending GPU pods among `pods`, with
    what the DRA `claims` allocated of gpuwire's `slices`.

    `node` keeps that node only (and the pods bound to it). `namespace` keeps the holders and
    pending pods of that namespace, and the nodes and GPUs they hold; the totals still count
    every GPU.
    """
    pods = list(pods)
    claimed = _claimed(claims, pods, _dra_devices(slices))
    views = [v for v in (_node(n, claimed) for n in nodes if node in (None, _name(n))) if v.total]
    counts = len(views), sum(v.total for v in views), sum(v.allocated for v in views)
    if namespace is not None:
        views = [v for v in (_only_namespace(v, namespace) for v in views) if v.gpus]
    waiting = [
        _pending(p)
        for p in pods
        if _is_pending_gpu_pod(p)
        and namespace in (None, _meta(p).get("namespace"))
        and node in (None, (p.get("spec") or {}).get("nodeName"))
    ]
    return Inventory(
        tuple(sorted(views, key=lambda v: v.name)),
        tuple(sorted(waiting, key=lambda p: (p.namespace, p.pod))),
        *counts,
    )


def _name(obj: Obj) -> str:
    return str(_meta(obj).get("name", ""))


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


@dataclass(frozen=True)
class _DraDevice:
    uuid: str
    shared: bool  # allows multiple allocations: its memory is handed out in shares


@dataclass
class _Claimed:
    """What the DRA claims hold: holders by node, shares of shared GPUs by UUID."""

    holders: dict[str, list[holding.Holder]]
    shared: dict[str, int]  # UUID → MiB its shares consume


def _dra_devices(slices: Iterable[Obj]) -> dict[tuple[str, str], _DraDevice]:
    """(pool, device name) → the GPU or MIG device it is, of gpuwire's driver."""
    found = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != dra.DRIVER:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for d in spec.get("devices") or ():
            uuid = ((d.get("attributes") or {}).get(dra.UUID) or {}).get("string")
            if uuid:
                found[(pool, str(d["name"]))] = _DraDevice(
                    uuid, d.get("allowMultipleAllocations") is True
                )
    return found


def _mib(text: object) -> int:
    try:
        return api_mib(str(text))
    except QuantityError:
        return 0


def _users(claim: Obj, pods: Mapping[tuple[str, str], Obj]) -> list[tuple[str, str]]:
    """(pod, container) of each container of the claim's consumers that uses it."""
    meta = _meta(claim)
    namespace, name = meta.get("namespace"), meta.get("name")
    out = []
    for consumer in (claim.get("status") or {}).get("reservedFor") or ():
        pod = pods.get((str(namespace), str(consumer.get("name"))))
        if pod is None:
            out.append((str(consumer.get("name")), ""))
            continue
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        generated = {s.get("name"): s.get("resourceClaimName") for s in statuses}
        spec = pod.get("spec") or {}
        entries = {
            e.get("name")
            for e in spec.get("resourceClaims") or ()
            if name in (e.get("resourceClaimName"), generated.get(e.get("name")))
        }
        for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
            uses = (c.get("resources") or {}).get("claims") or ()
            if any(r.get("name") in entries for r in uses):
                out.append((_name(pod), str(c.get("name"))))
    return out


def _claimed(
    claims: Iterable[Obj], pods: Sequence[Obj], devices: Mapping[tuple[str, str], _DraDevice]
) -> _Claimed:
    by_name = {(str(_meta(p).get("namespace")), _name(p)): p for p in pods}
    found = _Claimed({}, {})
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        held: dict[str, set[str]] = {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            device = devices.get((str(r.get("pool")), str(r.get("device"))))
            if r.get("driver") != dra.DRIVER or device is None:
                continue
            held.setdefault(str(r["pool"]), set()).add(device.uuid)
            if r.get("shareID"):
                memory = (r.get("consumedCapacity") or {}).get(dra.MEMORY, 0)
                found.shared[device.uuid] = found.shared.get(device.uuid, 0) + _mib(memory)
        namespace = str(_meta(claim).get("namespace", ""))
        named = (f"{namespace}/{_name(claim)}",)
        for node, uuids in held.items():
            gpus = tuple(sorted(uuids))
            for pod, container in _users(claim, by_name):
                holder = holding.Holder(namespace, pod, container, records.DRA, gpus, claims=named)
                found.holders.setdefault(node, []).append(holder)
    for device in devices.values():
        if device.shared:
            found.shared.setdefault(device.uuid, 0)
    return found


def _node(obj: Obj, claimed: _Claimed) -> Node:
    annotations = _meta(obj).get("annotations") or {}
    problems = []
    listed: tuple[nodegpus.NodeGpu, ...] = ()
    if nodegpus.ANNOTATION in annotations:
        try:
            listed = nodegpus.decode(annotations[nodegpus.ANNOTATION])
        except ValueError as exc:
            problems.append(str(exc))
    held: holding.NodeHolders | None = None
    if holding.ANNOTATION in annotations:
        try:
            held = holding.decode(annotations[holding.ANNOTATION])
        except holding.HoldersError as exc:
            problems.append(str(exc))
    known = held is not None
    extra = claimed.holders.get(_name(obj), [])
    if extra or held is not None:
        base = held or holding.NodeHolders((), (), False)
        shares = {u for u in claimed.shared if any(u in h.gpus for h in extra)}
        held = holding.NodeHolders(holding.merge([*base.holders, *extra]),
                                   tuple(sorted({*base.shared, *shares})), base.plugin)  # fmt: skip
    parents = {m.uuid: g.uuid for g in listed for m in g.mig or ()}
    conflicts = tuple(holding.conflicts(held, parents)) if held is not None else ()
    conflicted = {u for c in conflicts for u in c.gpus}

    def holders_of(uuid: str) -> tuple[holding.Holder, ...]:
        return tuple(held.of_gpu(uuid)) if held is not None else ()

    gpus = tuple(
        Gpu(
            g.index,
            g.uuid,
            g.product,
            g.memory_mib,
            g.healthy,
            holders_of(g.uuid),
            g.uuid in conflicted,
            None
            if g.mig is None
            else tuple(
                Mig(
                    m.uuid,
                    m.profile,
                    m.gi,
                    m.ci,
                    m.memory_mib,
                    m.healthy,
                    holders_of(m.uuid),
                    m.uuid in conflicted,
                )
                for m in g.mig
            ),
            claimed.shared.get(g.uuid),
        )
        for g in sorted(listed, key=lambda g: g.index)
    )
    status = obj.get("status") or {}
    capacity = sum(
        int(v) for k, v in (status.get("capacity") or {}).items() if is_gpu_resource(k) and _int(v)
    )
    conditions = status.get("conditions") or ()
    condition: Obj = next((c for c in conditions if c.get("type") == "Ready"), {})
    ready = condition.get("status", "True") == "True"  # no condition yet: nothing to flag
    return Node(
        _name(obj),
        gpus,
        len(gpus) or capacity,
        sum(1 for g in gpus if g.held),
        ready,
        not (obj.get("spec") or {}).get("unschedulable", False),
        known,
        tuple(problems),
        conflicts,
    )


def _int(value: object) -> bool:
    return str(value).isdigit()


def _only_namespace(view: Node, namespace: str) -> Node:
    """`view` with the holders of `namespace` only, and only the GPUs (and MIG devices) they
    hold."""

    def ours(holders: tuple[holding.Holder, ...]) -> tuple[holding.Holder, ...]:
        return tuple(h for h in holders if h.namespace == namespace)

    gpus = []
    for gpu in view.gpus:
        mig = (
            None
            if gpu.mig is None
            else tuple(replace(m, holders=ours(m.holders)) for m in gpu.mig if ours(m.holders))
        )
        mine = replace(gpu, holders=ours(gpu.holders), mig=mig)
        if mine.held:
            gpus.append(mine)
    mentioned = f"{namespace}/"
    conflicts = tuple(c for c in view.conflicts if any(h.startswith(mentioned) for h in c.holders))
    return replace(view, gpus=tuple(gpus), conflicts=conflicts)


def _requests(pod: Obj) -> list[str]:
    """What a pod asks for in GPUs, in words (empty: not a GPU pod): GPU resources, else the
    gpuwire annotations (if the webhook did not mutate it yet), else a device request in its
    environment."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or ()
    counts: dict[str, int] = {}
    for c in containers:
        for resource, value in ((c.get("resources") or {}).get("limits") or {}).items():
            if is_gpu_resource(resource) and _int(value):
                counts[resource] = counts.get(resource, 0) + int(value)
    if any(counts.values()):
        return [f"{n} {r}" for r, n in sorted(counts.items()) if n]
    asked = _annotated(_meta(pod).get("annotations") or {})
    if asked:
        return asked
    named = [str(e.get("resourceClaimTemplateName", "")) for e in spec.get("resourceClaims") or ()]
    templates = [t for t in named if t.startswith(GPU_TEMPLATES)]
    if templates:
        return [f"claim from {t}" for t in templates]
    for c in containers:
        for e in c.get("env") or ():
            if e.get("name") in VISIBLE_DEVICES and e.get("value") not in (
                None,
                "",
                "void",
                "none",
            ):
                return [f"{e['name']}={e['value']}"]
    return []


def _annotated(annotations: Mapping[str, str]) -> list[str]:
    """The GPU request of a pod's gpuwire (or HAMi) annotations, as written; `gpu-count: none`
    asks for driver files, not a GPU."""
    try:
        request = gpu_annotations.parse(annotations)
    except gpu_annotations.AnnotationError:  # the webhook refuses such a pod; say what it has
        request = gpu_annotations.GpuRequest(
            given={k: v for k, v in annotations.items() if k in gpu_annotations.KNOWN}
        )
    if not request.asks or request.count == "none":
        return []
    return [f"{key.rpartition('/')[2]}={value}" for key, value in sorted(request.given.items())]


def _is_pending_gpu_pod(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Pending" and bool(_requests(pod))


def _pending(pod: Obj) -> Pending:
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    reason, message = "Pending", ""
    scheduled = next(
        (c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), None
    )
    if scheduled is not None and scheduled.get("status") == "False":
        reason = scheduled.get("reason") or "Unschedulable"
        message = scheduled.get("message") or ""
    elif node:
        waiting = [
            (s.get("state") or {}).get("waiting") or {}
            for s in [
                *status.get("initContainerStatuses", []),
                *status.get("containerStatuses", []),
            ]
        ]
        first = next((w for w in waiting if w.get("reason")), None)
        if first is not None:
            reason, message = first["reason"], first.get("message") or ""
        else:
            reason = "Scheduled"
    return Pending(
        str(_meta(pod).get("namespace", "")),
        _name(pod),
        ", ".join(_requests(pod)),
        node,
        reason,
        message,
    )


def as_json(inventory: Inventory) -> dict[str, Any]:
    """The inventory as plain data (`-o json`)."""

    def holder(h: holding.Holder) -> dict[str, Any]:
        return {
            "namespace": h.namespace,
            "pod": h.pod,
            "container": h.container,
            "path": h.path,
            **({"all": True} if h.whole_node else {}),
            **({"claims": list(h.claims)} if h.claims else {}),
        }

    def mig(g: Gpu) -> dict[str, Any]:
        if g.mig is None:
            return {}
        devices = [
            {
                "uuid": m.uuid,
                "profile": m.profile,
                "gi": m.gi,
                "ci": m.ci,
                "memoryMiB": m.memory_mib,
                "healthy": m.healthy,
                "conflict": m.conflicted,
                "holders": [holder(h) for h in m.holders],
            }
            for m in g.mig
        ]
        return {"mig": devices}

    return {
        "gpuNodes": inventory.gpu_nodes,
        "total": inventory.total,
        "allocated": inventory.allocated,
        "nodes": [
            {
                "name": n.name,
                "ready": n.ready,
                "schedulable": n.schedulable,
                "total": n.total,
                "allocated": n.allocated,
                "holdersKnown": n.holders_known,
                "problems": list(n.problems),
                "gpus": [
                    {
                        "index": g.index,
                        "uuid": g.uuid,
                        "product": g.product,
                        "memoryMiB": g.memory_mib,
                        "healthy": g.healthy,
                        "conflict": g.conflicted,
                        "holders": [holder(h) for h in g.holders],
                        **mig(g),
                        **(
                            {"sharedMemory": {"usedMiB": g.shared_mib, "totalMiB": g.memory_mib}}
                            if g.shared_mib is not None
                            else {}
                        ),
                    }
                    for g in n.gpus
                ],
            }
            for n in inventory.nodes
        ],
        "pending": [p.__dict__ for p in inventory.pending],
        "conflicts": [
            {
                "node": n.name,
                "kind": c.kind,
                "gpus": list(c.gpus),
                "holders": list(c.holders),
                "message": c.explain(n.gpu_names()),
            }
            for n, c in inventory.conflicts
        ],
    }
