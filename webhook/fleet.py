"""The GPU nodes of the cluster as the webhook sees them: plain data built from Node objects.

What a node has comes from its labels (its vendor's labeller's keys: NVIDIA GPU Feature
Discovery's, AMD's node labeller's, also written by gpuwire's labeler) and from gpuwire's node
annotation `gpuwire.io/gpus`, a JSON array with one object per GPU (`index`, `uuid`, `product`,
`memory_mib`, `numa_node`, `healthy`, `resource`, `vendor`), written by the node agent. A
node's vendor is its annotation's, else the one whose product label it carries
(`gpuwire.vendor.Vendor.product_label`). Labels are what node affinity can select on, but the
labellers describe one model per node; the annotation holds every GPU of a mixed node, the
resource each is advertised under, and which node holds an explicitly named GPU. A node's GPUs
are summed up as groups (one model under one resource, counted), and nodes alike share one
tuple of them: 10,000 nodes of one kind cost one. The limit profiles a node enforces are its
`gpuwire.io/limits.<profile>` labels. Where the snapshot comes from (a watch, a file) is
`watch.py`'s and the CLI's business.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwire import holders, limits, nodegpus, nvidia
from gpuwire.annotations import GpuRequest, normalise_model
from gpuwire.vendor import NVIDIA, VENDORS, Vendor
from kubeclient import listfile

log = logging.getLogger(__name__)

PRODUCT_LABEL = NVIDIA.product_label
REPLICAS_LABEL = nvidia.LABEL_PREFIX + "gpu.replicas"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPUS_ANNOTATION = nodegpus.ANNOTATION
MIG_LABEL_PREFIX = nvidia.LABEL_PREFIX + "mig-"  # GFD's mixed strategy: mig-<profile>.count
Gpu = nodegpus.NodeGpu
Mig = nodegpus.NodeMig


@dataclass(frozen=True, slots=True)
class Group:
    """A node's GPUs of one model under one resource."""

    product: str  # as its vendor's product label spells it (nvidia.com/gpu.product, …)
    memory_mib: int | None
    resource: str  # the extended resource a pod asks for them by
    gpus: int
    devices: int  # of that resource they make (count × time-slicing or MPS replicas)


@dataclass(frozen=True, slots=True)
class Shape:
    """What placement reads of a node, its name aside: a cluster has few, however large."""

    groups: tuple[Group, ...]
    product: str | None
    memory_mib: int | None
    gpu_count: int | None
    enforces: frozenset[str]
    vendor: Vendor = NVIDIA


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    hostname: str  # the kubernetes.io/hostname label: what node affinity can pin
    product: str | None  # its vendor's product label value: one model (GFD's, AMD's labeller's)
    memory_mib: int | None  # its vendor's memory label, in MiB
    count: int | None
    gpus: tuple[Gpu, ...] = ()
    groups: tuple[Group, ...] = ()  # every GPU: the annotation's, else the labels'
    enforces: frozenset[str] = frozenset()  # limit profiles enforced here
    mig_profiles: tuple[str, ...] = ()  # MIG profiles GFD's labels say the node offers
    held: frozenset[str] = frozenset()  # MIG devices its holders annotation says are held
    vendor: Vendor = NVIDIA  # whose GPUs it has

    def offers(self) -> set[str]:
        """The MIG profiles of the node: its labels' and its MIG devices'."""
        return {*self.mig_profiles, *(m.profile for g in self.gpus for m in g.mig or ())}

    def free_mig(self, profile: str, taken: Collection[str] = ()) -> list[Mig]:
        """Its healthy MIG devices of `profile` that no one holds (or was just given)."""
        return [
            m
            for g in self.gpus
            for m in g.mig or ()
            if m.profile == profile
            and m.healthy
            and m.uuid not in self.held
            and m.uuid not in taken
        ]

    @property
    def gpu_count(self) -> int | None:
        return self.count if self.count is not None else (len(self.gpus) or None)

    @property
    def gpu_memory_mib(self) -> int | None:
        if self.memory_mib is not None:
            return self.memory_mib
        return min((g.memory_mib for g in self.gpus), default=None)

    @property
    def shape(self) -> Shape:
        return Shape(
            self.groups,
            self.product,
            self.memory_mib,
            self.gpu_count,
            self.enforces,
            self.vendor,
        )


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _gpus(node: str, text: str) -> tuple[Gpu, ...]:
    """The node annotation, or nothing (logged) when a node agent wrote something else."""
    try:
        return nodegpus.decode(text)
    except ValueError as exc:
        log.warning("node %s: ignoring %s", node, exc)
        return ()


def _groups(gpus: tuple[Gpu, ...], labels: Mapping[str, str], vendor: Vendor) -> tuple[Group, ...]:
    """The annotation's GPUs by model and resource, in index order; without the annotation,
    the labels' one model, under the vendor's resource."""
    if not gpus:
        product = labels.get(vendor.product_label)
        count = vendor.labelled_count(labels) or 1
        devices = count * (_int(labels.get(REPLICAS_LABEL)) or 1)
        memory = vendor.labelled_memory(labels)
        return (Group(product, memory, vendor.resource, count, devices),) if product else ()
    spelled: dict[tuple[str, int, str, int], int] = {}
    for g in gpus:  # by NVML's name first: the label's spelling is made once per model
        key = (g.product, g.memory_mib, g.resource, g.replicas)
        spelled[key] = spelled.get(key, 0) + 1
    counts: dict[tuple[str, int, str, int], int] = {}
    for (product, memory, resource, replicas), n in spelled.items():
        key = (vendor.label_product(product), memory, resource, replicas)
        counts[key] = counts.get(key, 0) + n
    return tuple(Group(p, m or None, r, n, n * k) for (p, m, r, k), n in counts.items())


_ENFORCED = {limits.enforcement_label(p): p for p, d in limits.PROFILES.items() if d.enforced}


def _mig_profiles(labels: Mapping[str, str]) -> tuple[str, ...]:
    """MIG profiles in GFD's labels: `nvidia.com/mig-<profile>.count` above 0 (mixed), a
    `-MIG-<profile>` product (single)."""
    found = {
        nvidia.mig_profile_of(key[len(MIG_LABEL_PREFIX) : -len(".count")])
        for key, value in labels.items()
        if key.startswith(MIG_LABEL_PREFIX) and key.endswith(".count") and (_int(value) or 0) > 0
    }
    _, sep, single = labels.get(PRODUCT_LABEL, "").rpartition("-MIG-")
    if sep and single != "INVALID":
        found.add(single)
    return tuple(sorted(found))


NONE_HELD: frozenset[str] = frozenset()  # one for every node: each empty one is 216 bytes


def _held(node: str, gpus: tuple[Gpu, ...], annotations: Mapping[str, str]) -> frozenset[str]:
    """The MIG devices held on a node with MIG devices (the plugin-less pods' choice)."""
    if holders.ANNOTATION not in annotations or not any(g.mig for g in gpus):
        return NONE_HELD
    try:
        found = holders.decode(annotations[holders.ANNOTATION]).holders
    except holders.HoldersError as exc:
        log.warning("node %s: ignoring %s", node, exc)
        return NONE_HELD
    return frozenset(u for h in found for u in h.gpus if u.startswith("MIG-"))


def node_from_object(
    obj: Mapping[str, Any], shared: dict[object, Any] | None = None
) -> Node | None:
    """A Node object (as JSON) → the GPU node it describes, None for a node without GPUs.
    `shared` (one per snapshot) makes nodes alike share their groups and profiles."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels: Mapping[str, str] = metadata.get("labels") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    gpus = _gpus(name, annotations[GPUS_ANNOTATION]) if GPUS_ANNOTATION in annotations else ()
    vendor = _vendor(gpus, labels)
    product = labels.get(vendor.product_label)
    if not name or (product is None and not gpus):
        return None
    memory, count = vendor.labelled_memory(labels), vendor.labelled_count(labels)
    groups = _groups(gpus, labels, vendor)
    enforces = frozenset(p for key, p in _ENFORCED.items() if labels.get(key) == "true")
    hostname = labels.get(HOSTNAME_LABEL, name)
    if shared is not None:
        groups = shared.setdefault(groups, groups)
        enforces = shared.setdefault(enforces, enforces)
        product = product and shared.setdefault(product, product)
    return Node(
        name=name,
        hostname=name if hostname == name else hostname,
        product=product,
        memory_mib=memory,
        count=count,
        gpus=gpus,
        groups=groups,
        enforces=enforces,
        mig_profiles=_mig_profiles(labels),
        held=_held(name, gpus, annotations),
        vendor=vendor,
    )


def _vendor(gpus: tuple[Gpu, ...], labels: Mapping[str, str]) -> Vendor:
    """The node's vendor: its annotation's, else the one whose product label it carries."""
    if gpus:
        return next((v for v in VENDORS if v.name == gpus[0].vendor), NVIDIA)
    return next((v for v in VENDORS if v.product_label in labels), NVIDIA)


@dataclass(frozen=True)
class Fleet:
    """An immutable snapshot; a watch replaces the whole snapshot, readers never lock."""

    nodes: tuple[Node, ...] = ()

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> Fleet:
        shared: dict[object, Any] = {}
        found = (node_from_object(o, shared) for o in objects)
        return cls.of_nodes(n for n in found if n)

    @classmethod
    def of_nodes(cls, nodes: Iterable[Node]) -> Fleet:
        return cls(tuple(sorted(nodes, key=lambda n: n.name)))

    @functools.cached_property
    def shapes(self) -> dict[Shape, tuple[Node, ...]]:
        """The nodes by shape, each in name order: what placement passes over."""
        alike: dict[tuple[int, str | None, int | None, int | None, int, str], list[Node]] = {}
        for n in self.nodes:  # by identity first: nodes alike share groups and profiles
            key = (id(n.groups), n.product, n.memory_mib, n.count, id(n.enforces), n.vendor.name)
            alike.setdefault(key, []).append(n)
        found: dict[Shape, list[Node]] = {}
        for nodes in alike.values():
            found.setdefault(nodes[0].shape, []).extend(nodes)
        return {shape: tuple(sorted(nodes, key=lambda n: n.name)) for shape, nodes in found.items()}

    @functools.cached_property
    def kinds(self) -> frozenset[tuple[Group, ...]]:
        """The distinct GPU make-ups of the nodes."""
        return frozenset(shape.groups for shape in self.shapes)

    @functools.cached_property
    def products(self) -> list[str]:
        """Every GPU model of the cluster, as the product label spells it, sorted."""
        return sorted({g.product for kind in self.kinds for g in kind})

    @functools.cached_property
    def vendors(self) -> dict[str, Vendor]:
        """Each product (as its product label spells it) → the vendor of the nodes that have
        it: whose label node affinity names it by."""
        return {g.product: shape.vendor for shape in self.shapes for g in shape.groups}

    @functools.cached_property
    def node_vendors(self) -> tuple[Vendor, ...]:
        """The vendors of the nodes, in VENDORS order, and those whose env images bake
        (`Vendor.baked`: NVIDIA's) always: whose env a container that asked for no GPU is
        voided for."""
        found = {shape.vendor for shape in self.shapes}
        return tuple(v for v in VENDORS if v.baked or v in found)

    @functools.cached_property
    def resources(self) -> tuple[str, ...]:
        """The extended resources the cluster's device plugins list GPUs under, sorted."""
        return tuple(sorted({g.resource for kind in self.kinds for g in kind if g.resource}))

    @functools.cached_property
    def enforced(self) -> dict[str, int]:
        """Limit profile → how many nodes enforce it."""
        counts: dict[str, int] = {}
        for shape, nodes in self.shapes.items():
            for profile in shape.enforces:
                counts[profile] = counts.get(profile, 0) + len(nodes)
        return counts

    @functools.cached_property
    def normalised(self) -> dict[str, str]:
        """Each product label value as model names are compared with it."""
        return {p: normalise_model(p) for p in self.products}

    @functools.cached_property
    def placements(self) -> dict[tuple[GpuRequest, bool, object], object]:
        """Requests already resolved against this snapshot: `placement.place` keeps its
        `Placement`s here, by request, policy and demand (as objects: this module does not
        import placement). A new snapshot starts with none."""
        return {}

    @functools.cached_property
    def named(self) -> set[str]:
        """MIG devices the webhook named for plugin-less pods since this snapshot was taken,
        which no holders annotation shows yet (a Deployment's pods must not all get one)."""
        return set()

    def mig_profiles(self) -> list[str]:
        """The MIG profiles any node offers, sorted."""
        return sorted({p for n in self.nodes for p in n.offers()})

    @functools.cached_property
    def gpu_nodes(self) -> dict[str, Node]:
        """The node of every GPU and MIG device, by `uuid_key` (made once per snapshot, when a
        pod first names one; the keys are the reported UUIDs themselves where already folded)."""
        found: dict[str, Node] = {}
        for node in self.nodes:
            for gpu in node.gpus:
                devices: tuple[Gpu | Mig, ...] = (gpu, *(gpu.mig or ()))
                for device in devices:
                    key = uuid_key(device.uuid)
                    found.setdefault(device.uuid if key == device.uuid else key, node)
        return found

    def holder(self, uuid: str) -> tuple[Node, Gpu | Mig] | None:
        """The node holding GPU or MIG device `uuid` (UUIDs compare case-insensitively, as
        NVIDIA's do)."""
        wanted = uuid_key(uuid)
        node = self.gpu_nodes.get(wanted)
        if node is None:
            return None
        for gpu in node.gpus:
            held: tuple[Gpu | Mig, ...] = (gpu, *(gpu.mig or ()))
            for device in held:
                if uuid_key(device.uuid) == wanted:
                    return node, device
        return None


def uuid_key(uuid: str) -> str:
    """A UUID folded so that UUIDs equal but for case are equal: NVIDIA's own spelling
    (`GPU-` or `MIG-`, then lower-case hex) is its own key."""
    return uuid[:4].upper() + uuid[4:].lower()


class FleetFileError(ValueError):
    """A nodes file that is not a Node list."""


def load(path: str | Path) -> Fleet:
    """A `v1 List` (or `NodeList`) of Node objects in YAML or JSON, as `kubectl get nodes -o
    yaml` (or `-o json`) prints it: a static fleet for local use, tests and the demo."""
    return Fleet.of(listfile.items(path, "Node", FleetFileError))
