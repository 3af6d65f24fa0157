"""Where a GPU request can run: node affinity resolved against every GPU of the fleet.

"A100" is a substring; node affinity matches whole label values. So the webhook resolves the
request against the GPU nodes it knows (no API call: a snapshot) into the exact set of nodes
that can run it (the candidates) and denies what no node can, listing what exists. A node
is a candidate when it holds a GPU that fits the words (model, memory, named GPUs, limit
profiles it enforces), when every GPU of it fits for a container that takes them all, and,
for a container the device plugin serves, when one of its resources lists only GPUs that fit
(else the kubelet could hand any GPU of the node): where that resource is not
`nvidia.com/gpu`, the container is asked to request it instead (`Placement.resource`).

The affinity written says exactly that set. It is GPU Feature Discovery's labels where they
do (one model per node: the common case, and what users read), with the few nodes those
labels would wrongly admit (a mixed node) named by hostname; where the labels cannot reach a
candidate (a mixed node whose label names its other model) the candidates are named instead.

A MIG profile (`gpuwire.io/mig-profile`) goes to the nodes that offer it (their MIG devices
in `gpuwire.io/gpus`, GFD's MIG labels). For a device plugin's pod, node affinity on GFD's
mixed-strategy label `nvidia.com/mig-<profile>.count`; for a plugin-less pod, MIG devices of
the node with the fewest free ones that still has enough (free: healthy, held by no one in
its `gpuwire.io/holders`, not named by this webhook since the snapshot), pinned by hostname.
Nothing reserves those between admission and start: two webhooks, or a pod that starts late,
can give one twice, which the inventory shows as a conflict.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwire import annotations as keys
from gpuwire import limits, nvidia
from gpuwire.annotations import GpuRequest
from gpuwire.vendor import VENDORS, Vendor, of_resource
from webhook.fleet import (
    HOSTNAME_LABEL,
    PRODUCT_LABEL,
    Fleet,
    Gpu,
    Group,
    Mig,
    Node,
    Shape,
)
from webhook.pod import GPU_RESOURCE

Expression = dict[str, Any]
KEPT = 1024  # placements kept per fleet snapshot


class Unplaceable(ValueError):
    """A request that no node of the cluster can satisfy; the message says what exists."""

    @classmethod
    def of(cls, request: GpuRequest, sources: tuple[str, ...], reason: str) -> Unplaceable:
        """Naming the first of the annotations `sources` the request gives, and its value."""
        key, value = request.source(*sources)
        return cls(f"{key}: {value!r} {reason}")


@dataclass(frozen=True, slots=True)
class Demand:
    """What the pod's GPU containers need of a node beyond the annotations' words."""

    plugin: int = 0  # devices the containers the device plugin serves ask for, together
    asks: str = GPU_RESOURCE  # the resource they ask for, as written
    whole: bool = False  # a container takes every GPU of its node (gpu-count: all)
    enforced: tuple[str, ...] = ()  # limit profiles the node must enforce
    profile_source: str = ""  # where those profiles were named, for denials
    device_plugin: bool = True  # the cluster runs one (policy devicePlugin): it picks MIG devices


NO_DEMAND = Demand()


@dataclass(frozen=True)
class Placement:
    expressions: tuple[Expression, ...] = ()  # ANDed into every required node selector term
    nodes: tuple[Node, ...] = ()  # the known GPU nodes the pod can land on
    devices: tuple[str, ...] = ()  # explicit GPUs, spelled as their node reports them
    warnings: tuple[str, ...] = field(default=())
    resource: str | None = None  # what device-plugin containers ask for, if not nvidia.com/gpu
    memories: tuple[int, ...] = ()  # sizes of the GPUs the pod can get there, MiB, ascending
    most_gpus: int | None = None  # the most GPUs a candidate node has
    vendors: tuple[Vendor, ...] = ()  # of those nodes, in VENDORS order: whose env a pod gets

    def gpu_memory_mib(self) -> int | None:
        """The smallest GPU the pod can get: a share of it is never more than asked."""
        return self.memories[0] if self.memories else None

    def gpu_count(self) -> int | None:
        """The most GPUs a candidate node has: what `all` can mean here."""
        return self.most_gpus


def listing(items: Sequence[str], most: int = 12, total: int | None = None) -> str:
    """The first `most` of `items` (of `total`, where only the first are given)."""
    shown = ", ".join(items[:most]) or "none"
    total = len(items) if total is None else total
    return shown + (f" and {total - most} more" if total > most else "")


def _matches(name: str, words: Sequence[str]) -> bool:
    """Whether a normalised product name contains any of `words` (normalised too)."""
    for word in words:  # noqa: SIM110 - any(generator) costs twice this loop, per product
        if word in name:
            return True
    return False


def models_matching(
    present: Mapping[str, str], includes: Sequence[str], excludes: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Of `present` (product → its normalised name): those no exclude word matches, and of
    them those an include word matches (all of them where there is no include word)."""
    allowed = [p for p, name in present.items() if not _matches(name, excludes)]
    chosen = [p for p in allowed if _matches(present[p], includes)] if includes else allowed
    return allowed, chosen


def _holds(e: Expression, shape: Shape) -> bool:
    """A model or memory expression against a node's two label values as spelled there
    (those of its vendor's labeller: a node of another vendor has neither)."""
    vendor, value = shape.vendor, None
    if e["key"] == vendor.product_label:
        value = shape.product
    elif e["key"] == vendor.memory_label and shape.memory_mib is not None:
        value = vendor.label_memory(shape.memory_mib)
    if e["operator"] == "Exists":
        return value is not None
    if e["operator"] == "In":
        return value in e["values"]
    if e["operator"] == "NotIn":
        return value is None or value not in e["values"]
    return value is not None and value.isdigit() and int(value) > int(e["values"][0])  # Gt


def _group_of(node: Node, device: Gpu | Mig) -> Group:
    """A named GPU or MIG device as the group it would be of (a MIG device: its parent's
    model, its own memory, advertised as no whole GPU)."""
    if isinstance(device, Gpu):
        product = node.vendor.label_product(device.product)
        return Group(product, device.memory_mib, device.resource, 1, 1)
    parent = next(g for g in node.gpus if device in (g.mig or ()))
    return Group(node.vendor.label_product(parent.product), device.memory_mib, "", 1, 1)


class _Kind:
    """What one make-up of a node (its groups) offers a request: computed once per kind."""

    __slots__ = ("devices", "every", "fitting", "pure")

    def __init__(self, groups: tuple[Group, ...], fits: dict[Group, bool]) -> None:
        self.fitting = tuple(g for g in groups if fits[g])
        self.every = len(self.fitting) == len(groups)
        self.devices: dict[str, int] = {}  # resource → how many devices it lists
        unfit: set[str] = set()
        for g in groups:
            if not g.resource:  # a GPU advertised only as MIG devices
                continue
            self.devices[g.resource] = self.devices.get(g.resource, 0) + g.devices
            if not fits[g]:
                unfit.add(g.resource)
        # the resources listing only fitting GPUs
        self.pure = {r: n for r, n in self.devices.items() if r not in unfit}


Shapes = dict[Shape, tuple[Node, ...]]


class _Placer:
    """Narrows the candidates shape by shape (a cluster has few shapes, however many nodes);
    only named GPUs, exclusions and MIG devices look at single nodes."""

    def __init__(
        self,
        request: GpuRequest,
        fleet: Fleet,
        allow_unknown: bool,
        demand: Demand,
        named: tuple[str, ...] = (),
    ) -> None:
        self.request = request
        self.fleet = fleet
        self.allow_unknown = allow_unknown
        self.demand = demand
        self.includes = request.models
        self.excludes = request.excluded_models
        self.least = request.min_memory_mib
        self.words = False  # a model or memory constraint is in force
        self.narrowed = False  # nodes were chosen by name or by the profiles they enforce
        self.shapes: Shapes = dict(fleet.shapes)  # the candidates, by shape
        self.labelled: list[Expression] = []  # the model and memory expressions (GFD labels)
        self.exact: list[Expression] = []  # enforcement labels and hostnames
        self.pinned = False  # a hostname In: the affinity names the node
        self.kept_off: frozenset[str] = frozenset()  # hostnames of nodes holding excluded GPUs
        self.named = named  # MIG devices an earlier admission of this pod named
        self.devices: tuple[str, ...] = ()
        self.warnings: list[str] = []
        self.resource: str | None = None
        self._kinds: dict[tuple[Group, ...], _Kind] = {}

    # --- what fits

    def fits(self, group: Group) -> bool:
        name = self.fleet.normalised[group.product]
        if self.includes and not _matches(name, self.includes):
            return False
        if self.excludes and _matches(name, self.excludes):
            return False
        return self.least is None or (group.memory_mib or 0) >= self.least

    def kind(self, groups: tuple[Group, ...]) -> _Kind:
        found = self._kinds.get(groups)
        if found is None:
            found = self._kinds[groups] = _Kind(groups, {g: self.fits(g) for g in groups})
        return found

    def holds(self, shape: Shape) -> bool:
        """Whether nodes of `shape` can run the pod as far as their GPUs go."""
        kind = self.kind(shape.groups)
        if not kind.fitting or (self.demand.whole and not kind.every):
            return False
        wanted = self.demand.plugin
        return not wanted or any(n >= wanted for n in kind.pure.values())

    @property
    def nodes(self) -> list[Node]:
        return [n for nodes in self.shapes.values() for n in nodes]

    # --- the steps, each narrowing the candidates or denying

    def given(self, *sources: str) -> list[tuple[str, str]]:
        return [(k, self.request.given[k]) for k in sources if k in self.request.given]

    def placing(self) -> list[tuple[str, str]]:
        """The placement annotations given, as written."""
        return self.given(*keys.MODEL_KEYS, keys.MIN_MEMORY, *keys.UUID_KEYS)

    def others(self, left_out: tuple[str, ...]) -> str:
        given = [
            (k, v)
            for k, v in (*self.placing(), *self.given(keys.LIMIT_PROFILE))
            if k not in left_out
        ]
        return ", ".join(f"{k}: {v!r}" for k, v in given) or "none"

    def unresolved(self, sources: tuple[str, ...], reason: str) -> None:
        """Deny, or (policy unknownModel: allow) warn and go on without the constraint."""
        key, value = self.request.source(*sources)
        message = f"{key}: {value!r} {reason}"
        if not self.allow_unknown:
            raise Unplaceable(message)
        self.warnings.append(f"{key}={value} matches no known node; admitted without it")

    def models(self) -> None:
        if not self.includes and not self.excludes:
            return
        present = self.fleet.normalised
        allowed, chosen = models_matching(present, self.includes, self.excludes)
        if self.includes:
            if not chosen:
                self.unresolved(
                    (keys.MODEL, keys.HAMI_USE_TYPE),
                    f"matches no GPU node; models present: {listing(allowed)}",
                )
                self.includes = self.excludes = ()
                return
            for key, products in self.by_label(chosen):
                self.labelled.append({"key": key, "operator": "In", "values": products})
        else:
            gone = set(present) - set(allowed)
            for key, _ in self.by_label(allowed):
                self.labelled.append({"key": key, "operator": "Exists"})
                excluded = sorted(p for p in gone if self.fleet.vendors[p].product_label == key)
                if excluded:
                    self.labelled.append({"key": key, "operator": "NotIn", "values": excluded})
        self.words = True

    def by_label(self, products: Sequence[str]) -> list[tuple[str, list[str]]]:
        """Products by the label that names them (their vendor's), in vendor order. Models of
        two vendors need two labels, which no node carries both of: such candidates are then
        named by hostname (`expressions`)."""
        found: dict[str, list[str]] = {}
        for p in products:
            found.setdefault(self.fleet.vendors[p].product_label, []).append(p)
        return sorted(found.items(), key=lambda item: item[0] != PRODUCT_LABEL)

    def memory(self) -> None:
        least = self.least
        if least is None:
            return
        self.least = None  # the model words alone, to list what they leave
        named = {g for kind in self.fleet.kinds for g in kind if self.fits(g)}
        if not any((g.memory_mib or 0) >= least for g in named):
            sizes = sorted({f"{g.product} {g.memory_mib} MiB" for g in named if g.memory_mib})
            of_model = " of that model" if self.request.models else ""
            self.unresolved(
                (keys.MIN_MEMORY,),
                f"(= {least} MiB) fits no GPU node{of_model}; GPUs present: {listing(sizes)}",
            )
            return
        self.least = least
        for vendor in VENDORS:  # the floor as each vendor's label says it, where GPUs fit
            shapes = [s for s in self.fleet.shapes if s.vendor is vendor]
            if any(self.fits(g) for s in shapes for g in s.groups):
                labelled = (s.memory_mib for s in shapes if s.memory_mib is not None)
                self.labelled.append(vendor.memory_requirement(least, labelled))
        self.words = True

    def candidates(self) -> None:
        if not self.words:
            return
        held = {shape: nodes for shape, nodes in self.shapes.items() if self.holds(shape)}
        if held:
            self.shapes = held
            return
        if self.demand.plugin:
            whom = "a container the device plugin serves"
            why = (
                f"no node lists {self.demand.plugin} such device(s) under a resource that holds "
                "no other GPUs, and the device plugin may hand any GPU of a resource"
            )
            accepted = (
                "as many such GPUs as one node lists under a resource of their own (the device "
                f"plugin's `resources` rules), or {keys.COUNT}: all, or named GPUs"
            )
        else:
            whom = f"a container that takes every GPU of its node ({keys.COUNT}: all)"
            why = "every node with such GPUs has other GPUs too"
            accepted = f"a number of GPUs, or named GPUs ({keys.UUID})"
        raise Unplaceable(
            f"no GPU node satisfies {self.others(())} for {whom}: {why}; accepted: {accepted}; "
            f"models present: {listing(self.fleet.products)}"
        )

    def enforcement(self) -> None:
        """Limits go only to nodes that enforce their profile; none anywhere is a denial, and
        so are limits for a pod whose candidates are all of vendors no profile shares (AMD's),
        said so."""
        wanted = self.demand.enforced
        if not wanted:
            return
        asked = ", ".join(f"{k}: {v!r}" for k, v in self.given(keys.MEMORY_LIMIT, keys.CORES_LIMIT))
        vendors = self.vendors()
        if vendors and not any(v.limits for v in vendors):
            sharers = " or ".join(v.name.upper() for v in VENDORS if v.limits)
            raise Unplaceable(
                f"{asked} needs profile {', '.join(wanted)} ({self.demand.profile_source}), "
                f"{sharers}'s way to share a GPU under a limit, and the pod can only run on "
                f"{' or '.join(v.name.upper() for v in vendors)} nodes "
                f"({listing(sorted(n.name for n in self.nodes))}), whose GPUs a container gets "
                f"whole; accepted: no limit there ({keys.MEMORY_LIMIT}, {keys.CORES_LIMIT} or "
                f"HAMi's resources), or a model {sharers} nodes have"
            )
        available = self.fleet.enforced
        enforced_here = ", ".join(
            f"{p} ({available[p]} node{'s' if available[p] > 1 else ''})" for p in sorted(available)
        )
        accepted = (
            f"profiles enforced in this cluster: {enforced_here or 'none'}; advisory (allowed, "
            f"not enforced): {', '.join(limits.ADVISORY)}"
        )
        for profile in wanted:
            if profile not in available:
                raise Unplaceable(
                    f"{asked} needs profile {profile!r} ({self.demand.profile_source}), which no "
                    f"GPU node of this cluster enforces; {accepted}"
                )
        enforcing = {s: nodes for s, nodes in self.shapes.items() if s.enforces.issuperset(wanted)}
        if not enforcing:
            have = sorted(
                {
                    g.product
                    for s in self.fleet.shapes
                    if s.enforces.issuperset(wanted)
                    for g in s.groups
                }
            )
            asking = ", ".join(f"{k}: {v!r}" for k, v in self.placing()) or "the pod's GPUs"
            raise Unplaceable(
                f"{asked} needs profile {', '.join(wanted)} ({self.demand.profile_source}), "
                f"which no node with {asking} enforces; nodes enforcing it have: "
                f"{listing(have)}; {accepted}"
            )
        self.shapes = enforcing
        self.narrowed = True
        for profile in wanted:
            label = limits.enforcement_label(profile)
            self.exact.append({"key": label, "operator": "In", "values": ["true"]})

    def uuids(self) -> None:
        wanted = self.request.uuids
        if not wanted:
            return
        found = {u: self.fleet.holder(u) for u in wanted}
        missing = [u for u, h in found.items() if h is None]
        if missing:
            gpus = (g.uuid for n in self.fleet.nodes for g in n.gpus)
            total = sum(len(n.gpus) for n in self.fleet.nodes)
            present = listing(list(itertools.islice(gpus, 12)), total=total)
            self.unresolved(
                (keys.UUID, keys.HAMI_USE_UUID),
                f"names {listing(missing)}, which no node has; GPUs present: {present}",
            )
            return
        holders = {h[0].name: h[0] for h in found.values() if h}
        key, value = self.request.source(keys.UUID, keys.HAMI_USE_UUID)
        if len(holders) > 1:
            where = ", ".join(f"{u} on {h[0].name}" for u, h in found.items() if h)
            raise Unplaceable(
                f"{key}: {value!r} names GPUs on different nodes ({where}); a pod runs on one node"
            )
        (node,) = holders.values()
        named = [h[1] for h in found.values() if h]
        groups = {g.uuid: _group_of(node, g) for g in named}
        unfit = [g for g in named if self.words and not self.fits(groups[g.uuid])]
        if unfit or node not in self.shapes.get(node.shape, ()):
            what = ", ".join(sorted({groups[g.uuid].product for g in unfit or named}))
            raise Unplaceable(
                f"{key}: {value!r} names GPUs on node {node.name} ({what}), which the pod's other "
                f"GPU annotations rule out ({self.others(keys.UUID_KEYS)}); accepted: GPUs "
                "that fit them, or no model, memory or profile annotations"
            )
        for uuid, holder in found.items():
            if holder and not holder[1].healthy:
                self.warnings.append(f"{uuid} on node {node.name} is reported unhealthy")
        self.devices = tuple(g.uuid for g in named)
        self.exact.append({"key": HOSTNAME_LABEL, "operator": "In", "values": [node.hostname]})
        self.shapes = {node.shape: (node,)}
        self.pinned = self.narrowed = True

    def excluded_uuids(self) -> None:
        """A node cannot be told to skip one GPU: keep off every node holding an excluded one.
        Where GPUs are named the container gets exactly those, which leave the excluded ones
        out already (HAMi's `use-gpuuuid: A,B` with `nouse-gpuuuid: C`, all on one node)."""
        if self.request.uuids:
            return
        holding = {
            h[0].hostname: h[1].uuid
            for u in self.request.excluded_uuids
            if (h := self.fleet.holder(u))
        }
        if not holding:
            return
        remaining = {
            shape: kept
            for shape, nodes in self.shapes.items()
            if (kept := tuple(n for n in nodes if n.hostname not in holding))
        }
        if not remaining and self.shapes:
            sources = self.given(*keys.UUID_KEYS)
            kept_off = ", ".join(f"{host} (holds {uuid})" for host, uuid in sorted(holding.items()))
            raise Unplaceable(
                f"{'; '.join(f'{k}: {v!r}' for k, v in sources)} keeps the pod off {kept_off}, "
                "and no other GPU node satisfies the pod's GPU annotations "
                f"({self.others(())}); accepted: exclusions of GPUs on nodes other than the "
                "ones the pod can run on"
            )
        self.exact.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(holding)})
        self.shapes = remaining
        self.kept_off = frozenset(holding)
        self.narrowed = True

    def plugin_resource(self) -> None:
        """The one resource device-plugin containers ask for, listing enough devices: where
        they name a model, the resource that lists only fitting GPUs on most candidates (ties:
        the one asked, then by name); the candidates narrow to its nodes, with a warning
        naming those it leaves out. A container's resources are an AND, so an OR of models
        under two resources (two vendors' GPUs) is one of them there. Limits are sized from
        the candidates' GPUs: there, the nodes that list the resource."""
        wanted, asks = self.demand.plugin, self.demand.asks
        # a cluster without the asked resource's vendor (an AMD-only one asked for
        # `nvidia.com/gpu`): the resource that its nodes list
        present = self.fleet.resources
        unlisted = bool(present) and all(of_resource(r) is not of_resource(asks) for r in present)
        if not wanted or not (self.words or self.narrowed or self.request.wants_limits or unlisted):
            return
        by_resource: dict[str, Shapes] = {}
        for shape, nodes in self.shapes.items():
            kind = self.kind(shape.groups)
            for resource, devices in (kind.pure if self.words else kind.devices).items():
                if devices >= wanted:
                    by_resource.setdefault(resource, {})[shape] = nodes
        renames = asks == GPU_RESOURCE and (self.words or unlisted)
        if not renames and asks in by_resource:
            self.shapes = by_resource[asks]
            return
        if not renames or not by_resource:
            listed = sorted({r for s in self.shapes for r in self.kind(s.groups).devices})
            left = f" that {self.others(())} leaves" if self.words or self.narrowed else ""
            raise Unplaceable(
                f"no GPU node{left} lists {wanted} {asks} for the pod's containers; "
                f"resources they list: {listing(listed)}; accepted: one of those resources, or "
                f"{keys.MODEL} naming a model one of them lists alone"
            )
        counted = {r: sum(map(len, shapes.values())) for r, shapes in by_resource.items()}
        chosen = min(counted, key=lambda r: (-counted[r], r != asks, r))
        self.left_out(by_resource, chosen, counted)
        self.resource = None if chosen == asks else chosen
        self.shapes = by_resource[chosen]

    def left_out(
        self, by_resource: dict[str, Shapes], chosen: str, counted: dict[str, int]
    ) -> None:
        """Warn of the candidates the chosen resource leaves out (nodes where only another
        resource lists fitting GPUs: another vendor's, a model listed apart) and what they have."""
        kept = by_resource[chosen]
        dropped = {s for shapes in by_resource.values() for s in shapes if s not in kept}
        if not dropped:
            return
        nodes = sorted(n.name for s in dropped for n in self.shapes[s])
        fitting = (g for s in dropped for g in self.kind(s.groups).fitting if g.resource != chosen)
        products = sorted({g.product for g in fitting})
        others = sorted(set(by_resource) - {chosen})
        if sum(n == counted[chosen] for n in counted.values()) == 1:
            why = "the most of them"
        elif chosen == self.demand.asks:
            why = "as many as any, ties going to the resource asked"
        else:
            why = "as many as any, ties going to the first by name"
        self.warnings.append(
            f"the pod's GPU annotations ({self.others(())}) fit GPUs under "
            f"{' and '.join(sorted(by_resource))}, and a container asks for one resource: "
            f"{chosen}, listed on {counted[chosen]} of the candidate nodes ({why}); left out: "
            f"{listing(products)} on {listing(nodes)} ({', '.join(others)}); {keys.MODEL} chooses"
        )

    # --- the affinity

    def own_labels(self) -> None:
        """Keep the model and memory expressions on the labels of the candidates' vendors: no
        node carries two vendors' labels, so another vendor's expression (of a model a count
        or memory floor left out, of the vendor a resource left out) would only force the
        candidates to be named by hostname."""
        wanted = {key for v in self.vendors() for key in (v.product_label, v.memory_label)}
        self.labelled = [e for e in self.labelled if e["key"] in wanted]

    def vendors(self) -> tuple[Vendor, ...]:
        """The candidates' vendors, in VENDORS order."""
        return tuple(v for v in VENDORS if any(s.vendor is v for s, n in self.shapes.items() if n))

    def expressions(self) -> tuple[Expression, ...]:
        """Expressions admitting exactly the candidates among the nodes the pod could land
        on, naming the fewest hostnames: the model and memory labels (plus the nodes they
        would wrongly admit); for a device-plugin container, the resource alone (plus those);
        else the candidates by name."""
        if not self.labelled:
            return tuple(self.exact)
        if self.pinned:  # the hostname says it all; the labels too, where they hold there
            labels_hold = all(self.labels_admit(s) for s in self.shapes)
            return (*(self.labelled if labels_hold else ()), *self.exact)
        asked = (self.resource or self.demand.asks) if self.demand.plugin else None
        # shapes the pod could land on besides the candidates, as far as enforcement goes
        wanted = self.demand.enforced
        others = [
            shape
            for shape in self.fleet.shapes
            if shape not in self.shapes
            and (asked is None or asked in self.kind(shape.groups).devices)
            and shape.enforces.issuperset(wanted)
        ]
        options: list[tuple[int, list[Shape], tuple[Expression, ...]]] = []
        if all(self.labels_admit(s) for s in self.shapes):
            options.append(self.excluding([s for s in others if self.labels_admit(s)], True))
        if asked is not None:
            options.append(self.excluding(others, False))
        named = sum(map(len, self.shapes.values()))
        if not options or named < min(o[0] for o in options):
            hosts = sorted(n.hostname for n in self.nodes)
            return (*self.exact, {"key": HOSTNAME_LABEL, "operator": "In", "values": hosts})
        count, excess, chosen = min(options, key=lambda o: o[0])
        if not count:
            return chosen
        hosts = sorted(
            n.hostname
            for s in excess
            for n in self.fleet.shapes[s]
            if n.hostname not in self.kept_off
        )
        return (*chosen, {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": hosts})

    def excluding(
        self, excess: list[Shape], labels: bool
    ) -> tuple[int, list[Shape], tuple[Expression, ...]]:
        """(how many hostnames a NotIn must name, the shapes of those nodes, the expressions
        before it); nodes the exclusions keep off already are not named again."""
        count = (
            sum(1 for s in excess for n in self.fleet.shapes[s] if n.hostname not in self.kept_off)
            if self.kept_off
            else sum(len(self.fleet.shapes[s]) for s in excess)
        )
        return count, excess, (*(self.labelled if labels else ()), *self.exact)

    def labels_admit(self, shape: Shape) -> bool:
        """What the scheduler makes of the model and memory expressions on such nodes."""
        return all(_holds(e, shape) for e in self.labelled)

    def memories(self) -> tuple[int, ...]:
        asked = (self.resource or self.demand.asks) if self.demand.plugin else None
        sizes: set[int] = set()
        for kind in {s.groups for s in self.shapes}:
            groups = self.kind(kind).fitting if self.words else kind
            sizes.update(
                g.memory_mib for g in groups if g.memory_mib and asked in (None, g.resource)
            )
        return tuple(sorted(sizes))

    def mig(self) -> None:
        profile = self.request.mig_profile
        if profile is None:
            return
        offering = {
            shape: kept
            for shape, nodes in self.shapes.items()
            if (kept := tuple(n for n in nodes if profile in n.offers()))
        }
        plugin = self.demand.device_plugin
        if not offering:
            of_model = " of that model" if self.request.models else ""
            present = listing(self.fleet.mig_profiles())
            if plugin:
                self.unresolved(
                    (keys.MIG_PROFILE,),
                    f"is offered by no GPU node{of_model}; MIG profiles present: {present}",
                )
                return
            key, value = self.request.source(keys.MIG_PROFILE)
            raise Unplaceable(f"{key}: {value!r} is offered by no GPU node{of_model}; "
                              f"MIG profiles present: {present}")  # fmt: skip
        count = self.request.count if isinstance(self.request.count, int) else 1
        self.shapes = offering
        self.pinned = True  # the MIG label or the hostname says where; the labels stay as they are
        if plugin:
            label = f"{nvidia.mig_resource(profile)}.count"
            self.exact.append({"key": label, "operator": "Gt", "values": [str(count - 1)]})
            return
        nodes = self.nodes
        before = self.named_before(nodes, profile, count)
        if before is None:
            node, self.devices = self.choose(nodes, profile, count)
        else:
            node, self.devices = before
        self.fleet.named.update(self.devices)
        self.exact.append({"key": HOSTNAME_LABEL, "operator": "In", "values": [node.hostname]})
        self.shapes = {node.shape: (node,)}
        self.warnings.append(
            f"{keys.MIG_PROFILE}={profile}: MIG device(s) {', '.join(self.devices)} on node "
            f"{node.name} named without a device plugin: nothing reserves them until the pod "
            "starts"
        )

    def choose(
        self, offering: list[Node], profile: str, count: int
    ) -> tuple[Node, tuple[str, ...]]:
        """`count` free MIG devices of `profile` on the node with the fewest that still has
        enough (the others' larger free sets stay whole); Unplaceable where none has."""
        named = self.fleet.named
        fits = [(n, free) for n in offering if len(free := n.free_mig(profile, named)) >= count]
        if not fits:
            key, value = self.request.source(keys.MIG_PROFILE)
            have = ", ".join(f"{n.name} {len(n.free_mig(profile, named))}" for n in offering)
            raise Unplaceable(
                f"{key}: {value!r}: no node has {count} free {profile} MIG device(s) "
                f"(healthy and held by no one); free per node: {have}"
            )
        node, free = min(fits, key=lambda fit: (len(fit[1]), fit[0].name))
        return node, tuple(m.uuid for m in free[:count])

    def named_before(
        self, offering: list[Node], profile: str, count: int
    ) -> tuple[Node, tuple[str, ...]] | None:
        """The MIG devices an earlier admission of this pod named, while they are free
        devices of the profile on one node: admitting an admitted pod again changes
        nothing."""
        found = [self.fleet.holder(u) for u in self.named]
        places = [h for h in found if h is not None and h[0] in offering]
        if not places or len(places) != len(found) or len(found) != count:
            return None
        node = places[0][0]
        free = {m.uuid for m in node.free_mig(profile)}
        if any(n is not node or d.uuid not in free for n, d in places):
            return None
        return node, tuple(d.uuid for _, d in places)

    def place(self) -> Placement:
        self.models()
        self.memory()
        self.candidates()
        self.enforcement()
        self.uuids()
        self.excluded_uuids()
        self.mig()
        self.plugin_resource()
        self.own_labels()
        return Placement(
            self.expressions(),
            tuple(sorted(self.nodes, key=lambda n: n.name)),
            self.devices,
            tuple(self.warnings),
            self.resource,
            self.memories(),
            max((s.gpu_count for s, n in self.shapes.items() if n and s.gpu_count), default=None),
            self.vendors(),
        )


def place(
    request: GpuRequest,
    fleet: Fleet,
    allow_unknown: bool = False,
    demand: Demand = NO_DEMAND,
    named: tuple[str, ...] = (),
) -> Placement:
    """Resolve `request`'s model, memory, device, MIG and limit constraints for a pod that
    needs `demand`; Unplaceable when no node can run it.

    `allow_unknown` (policy `unknownModel: allow`) admits an unresolvable model, memory or
    device constraint with a warning instead of denying the pod. Placements are kept with the
    snapshot (a Deployment's pods ask alike, and resolving costs a pass over the cluster's
    nodes), so they are shared: read-only, like the expressions that go into patches. Denials
    are not kept. `named`: the MIG devices a pod already names (an earlier admission's
    choice).
    """
    if request.mig_profile and not demand.device_plugin:  # names devices: each pod its own
        return _Placer(request, fleet, allow_unknown, demand, named).place()
    placed = fleet.placements
    key = (request, allow_unknown, demand)
    found = placed.get(key)
    if not isinstance(found, Placement):  # none yet (the fleet keeps them, not knowing the type)
        if len(placed) >= KEPT:  # distinct requests beyond that: start over, memory stays bounded
            placed.clear()
        found = placed[key] = _Placer(request, fleet, allow_unknown, demand).place()
    return found
