"""Who holds which GPU on a node, what conflicts that makes, and the `gpuwire.io/holders`
node annotation that carries it to the cluster. Pure functions; the node agent and the
`gpuwire inventory` CLI both use them, so both judge a node the same way.

Three sources name a container's GPUs: the kubelet's pod-resources API (device-plugin
allocations, as device IDs, and DRA claims' devices, `dynamic_resources`), and the runtime
side's container records (`gpuwire.records`: every container gpuwire gave GPUs, plugin-less
ones and those of DRA claims included). A container in several is one holder; its path says
how it got its GPUs (`plugin`, `plugin-less`, `dra`, with the claims it holds them through).
A container granted only the `utility` capability (a
monitoring agent, the device plugin itself) can watch a GPU through NVML but not run work or
take memory on it: it holds nothing and is left out.

Conflicts, the ways GPUs get oversubscribed silently:
- `shared-gpu`: a GPU held by two or more containers although it is not shared (the device
  plugin advertises it once, not as time-slicing replicas `<uuid>::<n>`, and no DRA claim
  holds a share of it) by containers that do not all hold it through one DRA claim (a claim
  serves every container that references it: a pod's containers, or a shared claim's pods),
  or held through DRA and another way at once (a share of a DRA GPU is no license for a
  container the scheduler did not place there);
- `all-beside-plugin`: a plugin-less container that asked for `all` GPUs of a node on which
  a device plugin also hands them out, so the scheduler places plugin pods on its GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwire.devices import Device, MigDevice
from gpuwire.records import DRA, PATHS, PLUGIN, PLUGIN_LESS, ContainerRecord

ANNOTATION = "gpuwire.io/holders"
VERSION = 1
REPLICA_SEPARATOR = "::"  # time-slicing device IDs: `<uuid>::<n>` (NVIDIA's format)
WATCH_ONLY = frozenset({"utility"})

SHARED_GPU = "shared-gpu"
ALL_BESIDE_PLUGIN = "all-beside-plugin"
GPU_AND_MIG = "gpu-and-mig"


class HoldersError(ValueError):
    """An annotation value that is not a holders list; the message says what is wrong."""


@dataclass(frozen=True)
class Holder:
    """One container and the GPUs it holds. A container outside any pod has namespace and
    pod "" and its runtime ID as `container`."""

    namespace: str
    pod: str
    container: str
    path: str  # PLUGIN, PLUGIN_LESS or DRA
    gpus: tuple[str, ...]  # UUIDs, sorted
    whole_node: bool = False  # asked for `all`
    claims: tuple[str, ...] = ()  # DRA: the claims it holds them through, `namespace/name`

    @property
    def key(self) -> tuple[str, str, str]:
        return self.namespace, self.pod, self.container

    @property
    def name(self) -> str:
        """`namespace/pod`, or `container <id>` for a container outside Kubernetes."""
        return f"{self.namespace}/{self.pod}" if self.pod else f"container {self.container[:12]}"


@dataclass(frozen=True)
class Assignment:
    """Devices of one resource the kubelet gave a container (pod-resources `List`)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Claimed:
    """A device of a DRA claim the kubelet prepared for a container (pod-resources
    `dynamic_resources`: `ClaimResource`); `share_id` for a share of a shared device."""

    namespace: str
    pod: str
    container: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    claim: str = ""  # `namespace/name`


@dataclass(frozen=True)
class NodeHolders:
    """A node's holders, its GPUs shared by time-slicing, and whether a device plugin
    allocates GPUs there: everything conflict detection needs."""

    holders: tuple[Holder, ...]
    shared: tuple[str, ...]  # UUIDs
    plugin: bool

    def of_gpu(self, uuid: str) -> list[Holder]:
        return [h for h in self.holders if uuid in h.gpus]


@dataclass(frozen=True)
class Conflict:
    kind: str  # SHARED_GPU, ALL_BESIDE_PLUGIN or GPU_AND_MIG
    gpus: tuple[str, ...]  # UUIDs
    holders: tuple[str, ...]  # Holder.name of each container involved

    def explain(self, gpu_names: Mapping[str, str] | None = None) -> str:
        """One sentence; `gpu_names` (UUID → `GPU 3`, in the order to list them) makes it
        shorter than UUIDs."""
        names = gpu_names or {}
        order = {uuid: i for i, uuid in enumerate(names)}
        ordered = sorted(self.gpus, key=lambda u: order.get(u, len(order)))
        gpus = ", ".join(names.get(u, u) for u in ordered)
        if self.kind == SHARED_GPU:
            return f"{gpus} held by {' and '.join(self.holders)}, and not shared"
        if self.kind == GPU_AND_MIG:
            whole, part = (names.get(u, u) for u in self.gpus)
            return (
                f"{whole} held whole by {self.holders[0]} while {part} is held by "
                f"{' and '.join(self.holders[1:])}"
            )
        return (
            f"{self.holders[0]} took all GPUs ({gpus}) without the device plugin, "
            "which also allocates them"
        )


def gpu_of(
    resource: str, device_id: str, gpus: Sequence[Device], mig: Sequence[MigDevice] = ()
) -> str | None:
    """The UUID of the GPU or MIG device behind a device plugin's device ID: `<uuid>`,
    `<uuid>::<n>`, or an index (NVIDIA's `deviceIDStrategy: index`) for a `…/gpu…`
    resource. None: not a GPU."""
    uuid = device_id.partition(REPLICA_SEPARATOR)[0]
    if any(g.uuid == uuid for g in gpus) or any(m.uuid == uuid for m in mig):
        return uuid
    if device_id.isdigit() and resource.rpartition("/")[2].startswith("gpu"):
        return next((g.uuid for g in gpus if g.index == int(device_id)), None)
    return None


def from_records(records: Iterable[ContainerRecord]) -> list[Holder]:
    return [
        Holder(
            r.namespace,
            r.pod,
            r.container if r.pod else r.id,
            r.path,
            r.gpus,
            r.whole_node,
            r.claims,
        )
        for r in records
        if r.gpus and not (r.capabilities and set(r.capabilities) <= WATCH_ONLY)
    ]  # a record without capabilities (AMD's: a vendor without them) holds its GPUs


def from_assignments(
    assignments: Iterable[Assignment], gpus: Sequence[Device], mig: Sequence[MigDevice] = ()
) -> list[Holder]:
    holders = []
    for a in assignments:
        uuids = {gpu_of(a.resource, i, gpus, mig) for i in a.device_ids} - {None}
        if uuids:
            held = tuple(sorted(u for u in uuids if u is not None))
            holders.append(Holder(a.namespace, a.pod, a.container, PLUGIN, held))
    return holders


def from_claims(claimed: Iterable[Claimed], names: Mapping[str, str]) -> list[Holder]:
    """Holders of DRA devices; `names`: the node's DRA device names → GPU or MIG UUIDs."""
    found: dict[tuple[str, str, str], tuple[set[str], set[str]]] = {}
    for c in claimed:
        uuid = names.get(c.device)
        if uuid is not None:
            uuids, claims = found.setdefault((c.namespace, c.pod, c.container), (set(), set()))
            uuids.add(uuid)
            claims |= {c.claim} if c.claim else set()
    return [
        Holder(*key, DRA, tuple(sorted(uuids)), claims=tuple(sorted(claims)))
        for key, (uuids, claims) in found.items()
    ]


def merge(holders: Iterable[Holder]) -> tuple[Holder, ...]:
    """One holder per container: the union of its GPUs and claims; its path `dra`, else
    `plugin`, if any source says so."""
    merged: dict[tuple[str, str, str], Holder] = {}
    for h in holders:
        seen = merged.get(h.key)
        if seen is not None:
            paths = (h.path, seen.path)
            h = Holder(
                *h.key,
                DRA if DRA in paths else PLUGIN if PLUGIN in paths else PLUGIN_LESS,
                tuple(sorted(set(h.gpus) | set(seen.gpus))),
                h.whole_node or seen.whole_node,
                tuple(sorted(set(h.claims) | set(seen.claims))),
            )
        merged[h.key] = h
    return tuple(merged[k] for k in sorted(merged))


def node_holders(
    gpus: Sequence[Device],
    records: Iterable[ContainerRecord],
    assignments: Sequence[Assignment],
    allocatable: Sequence[tuple[str, tuple[str, ...]]],
    plugin: bool = False,
    mig: Sequence[MigDevice] = (),
    claimed: Sequence[Claimed] = (),
    dra_names: Mapping[str, str] | None = None,
) -> NodeHolders:
    """Everything the node's sources say. `allocatable`: (resource, device IDs) from
    pod-resources `GetAllocatableResources` (empty where the kubelet does not offer it).
    `plugin`: a device plugin is known to allocate here (the agent runs inside it), whatever
    pod-resources says. `mig`: the node's MIG devices, held like GPUs (by their UUIDs).
    `claimed`: DRA claims' devices of gpuwire's driver, `dra_names` naming their GPUs. A GPU
    a DRA claim holds as a share (of a shared GPU's consumable capacity) is shared, whether
    pod-resources or a record says so."""
    records = list(records)
    advertised = [(r, i) for r, ids in allocatable for i in ids]
    advertised += [(a.resource, i) for a in assignments for i in a.device_ids]
    on_gpus = [(i, gpu_of(r, i, gpus, mig)) for r, i in advertised]
    shared = {uuid for i, uuid in on_gpus if uuid is not None and REPLICA_SEPARATOR in i}
    names = dra_names or {}
    shared |= {u for c in claimed if c.share_id and (u := names.get(c.device)) is not None}
    shared |= {uuid for r in records for uuid in r.shares}
    holders = merge([
        *from_records(records),
        *from_assignments(assignments, gpus, mig),
        *from_claims(claimed, names),
    ])  # fmt: skip
    plugin = plugin or any(uuid is not None for _, uuid in on_gpus)
    return NodeHolders(holders, tuple(sorted(shared)), plugin)


def conflicts(node: NodeHolders, parents: Mapping[str, str] | None = None) -> list[Conflict]:
    """What the node's holders collide on. `parents` (MIG device UUID → its GPU's UUID) adds a
    GPU held whole beside one of its MIG devices held by someone else: the whole GPU's holder
    reaches every MIG device's memory and SMs."""
    found = []
    for uuid in sorted({u for h in node.holders for u in h.gpus}):
        holding = node.of_gpu(uuid)
        paths = {h.path for h in holding}
        mixed = DRA in paths and len(paths) > 1  # a DRA share is not anyone's to take
        one_claim = bool(set.intersection(*(set(h.claims) for h in holding)))
        if len(holding) > 1 and (mixed or (uuid not in node.shared and not one_claim)):
            found.append(Conflict(SHARED_GPU, (uuid,), tuple(h.name for h in holding)))
    for mig, parent in sorted((parents or {}).items()):
        whole = node.of_gpu(parent)
        others = [h for h in node.of_gpu(mig) if h not in whole]
        for h in whole:
            apart = [o for o in others if not set(h.claims) & set(o.claims)]
            if apart:
                found.append(
                    Conflict(GPU_AND_MIG, (parent, mig), (h.name, *(o.name for o in apart)))
                )
    if node.plugin:
        for h in node.holders:
            if h.path == PLUGIN_LESS and h.whole_node:
                found.append(Conflict(ALL_BESIDE_PLUGIN, h.gpus, (h.name,)))
    return found


def encode(node: NodeHolders) -> str:
    """The annotation value: compact JSON, keys and lists in a stable order, so the same
    holders always give the same text and the agent writes only when something changed."""
    holders = []
    for h in node.holders:
        entry: dict[str, object] = {
            "namespace": h.namespace,
            "pod": h.pod,
            "container": h.container,
            "path": h.path,
            "gpus": list(h.gpus),
        }
        if h.whole_node:
            entry["all"] = True
        if h.claims:
            entry["claims"] = list(h.claims)
        holders.append(entry)
    value = {"v": VERSION, "plugin": node.plugin, "shared": list(node.shared), "holders": holders}
    return json.dumps(value, separators=(",", ":"))


def decode(text: str) -> NodeHolders:
    try:
        raw = json.loads(text)
        version = raw.get("v")
    except (ValueError, AttributeError):
        raise HoldersError(f"not a {ANNOTATION} value: not a JSON object") from None
    if version != VERSION:
        raise HoldersError(f"{ANNOTATION} version {version!r} is not supported: expected {VERSION}")
    try:
        holders = tuple(
            Holder(
                str(h["namespace"]),
                str(h["pod"]),
                str(h["container"]),
                _path(h["path"]),
                tuple(str(u) for u in h["gpus"]),
                bool(h.get("all", False)),
                tuple(str(c) for c in h.get("claims", ())),
            )
            for h in raw["holders"]
        )
        return NodeHolders(holders, tuple(str(u) for u in raw["shared"]), bool(raw["plugin"]))
    except (KeyError, TypeError, AttributeError) as exc:
        raise HoldersError(f"not a {ANNOTATION} value: missing or wrong {exc}") from None


def _path(value: object) -> str:
    if value not in PATHS:
        raise HoldersError(f"path {value!r}: expected one of {', '.join(PATHS)}")
    return str(value)
