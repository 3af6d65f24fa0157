"""Where a GPU request can run: node affinity expressions resolved against the fleet.

"A100" is a substring; node affinity matches whole label values. So the webhook resolves the
request against the GPU nodes it knows (no API call: a snapshot) into exact label values,
denies what no node has, listing what exists, and names the candidate nodes so that limits
given as a share of the GPU can be turned into MiB.

A MIG profile (`gpuwire.io/mig-profile`) goes to the nodes that offer it (their MIG devices
in `gpuwire.io/gpus`, GFD's MIG labels). For a device plugin's pod, node affinity on GFD's
mixed-strategy label `nvidia.com/mig-<profile>.count`; for a plugin-less pod, MIG devices of
the node with the fewest free ones that still has enough (free: healthy, held by no one in
its `gpuwire.io/holders`, not named by this webhook since the snapshot), pinned by hostname.
Nothing reserves those between admission and start: two webhooks, or a pod that starts late,
can give one twice, which the inventory shows as a conflict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwire import annotations as keys
from gpuwire import nvidia
from gpuwire.annotations import GpuRequest
from webhook.fleet import (
    HOSTNAME_LABEL,
    MEMORY_LABEL,
    PRODUCT_LABEL,
    Fleet,
    Node,
)

Expression = dict[str, Any]
KEPT = 1024  # placements kept per fleet snapshot


class Unplaceable(ValueError):
    """A request that no node of the cluster can satisfy; the message says what exists."""


@dataclass(frozen=True)
class Placement:
    expressions: tuple[Expression, ...] = ()  # ANDed into every required node selector term
    nodes: tuple[Node, ...] = ()  # the known GPU nodes the pod can land on
    devices: tuple[str, ...] = ()  # explicit GPUs, spelled as their node reports them
    warnings: tuple[str, ...] = field(default=())

    def gpu_memory_mib(self) -> int | None:
        """The smallest GPU among the candidates: a share of it is never more than asked."""
        return min((m for n in self.nodes if (m := n.gpu_memory_mib)), default=None)

    def gpu_count(self) -> int | None:
        """The most GPUs a candidate node has: what `all` can mean here."""
        return max((c for n in self.nodes if (c := n.gpu_count)), default=None)


def listing(items: Sequence[str], most: int = 12) -> str:
    shown = ", ".join(items[:most]) or "none"
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _matches(name: str, words: Sequence[str]) -> bool:
    """Whether a normalised product name contains any of `words` (normalised too)."""
    for word in words:  # noqa: SIM110 - any(generator) costs twice this loop, per product
        if word in name:
            return True
    return False


class _Placer:
    def __init__(
        self,
        request: GpuRequest,
        fleet: Fleet,
        allow_unknown: bool,
        plugin: bool = True,
        named: tuple[str, ...] = (),
    ) -> None:
        self.request = request
        self.fleet = fleet
        self.allow_unknown = allow_unknown
        self.plugin = plugin
        self.named = named
        self.nodes = list(fleet.nodes)
        self.expressions: list[Expression] = []
        self.devices: tuple[str, ...] = ()
        self.warnings: list[str] = []

    def unresolved(self, sources: tuple[str, ...], reason: str) -> None:
        key, value = self.request.source(*sources)
        message = f"{key}: {value!r} {reason}"
        if not self.allow_unknown:
            raise Unplaceable(message)
        self.warnings.append(f"{key}={value} matches no known node; admitted without it")

    def models(self) -> None:
        r = self.request
        if not r.models and not r.excluded_models:
            return
        present = self.fleet.normalised
        allowed = [p for p, name in present.items() if not _matches(name, r.excluded_models)]
        if r.models:
            chosen = [p for p in allowed if _matches(present[p], r.models)]
            if not chosen:
                self.unresolved(
                    (keys.MODEL, keys.HAMI_USE_TYPE),
                    f"matches no GPU node; models present: {listing(allowed)}",
                )
                return
            self.expressions.append({"key": PRODUCT_LABEL, "operator": "In", "values": chosen})
        else:
            chosen = allowed
            self.expressions.append({"key": PRODUCT_LABEL, "operator": "Exists"})
            excluded = sorted(set(present) - set(allowed))
            if excluded:
                self.expressions.append(
                    {"key": PRODUCT_LABEL, "operator": "NotIn", "values": excluded}
                )
        self.nodes = [n for n in self.nodes if n.product in chosen]

    def memory(self) -> None:
        least = self.request.min_memory_mib
        if least is None:
            return
        fitting = [n for n in self.nodes if (n.memory_mib or 0) >= least]
        if not fitting:
            sizes = sorted({f"{n.product} {n.memory_mib} MiB" for n in self.nodes if n.memory_mib})
            self.unresolved(
                (keys.MIN_MEMORY,),
                f"(= {least} MiB) fits no GPU node{' of that model' if self.request.models else ''}"
                f"; GPUs present: {listing(sizes)}",
            )
            return
        self.expressions.append({"key": MEMORY_LABEL, "operator": "Gt", "values": [str(least - 1)]})
        self.nodes = fitting

    def uuids(self) -> None:
        wanted = self.request.uuids
        if not wanted:
            return
        found = {u: self.fleet.holder(u) for u in wanted}
        missing = [u for u, h in found.items() if h is None]
        if missing:
            present = [g.uuid for n in self.fleet.nodes for g in n.gpus]
            self.unresolved(
                (keys.UUID, keys.HAMI_USE_UUID),
                f"names {listing(missing)}, which no node has; GPUs present: {listing(present)}",
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
        if node not in self.nodes:
            raise Unplaceable(
                f"{key}: {value!r} names GPUs on node {node.name} ({node.product}), which the "
                "pod's other GPU annotations rule out"
            )
        for uuid, holder in found.items():
            if holder and not holder[1].healthy:
                self.warnings.append(f"{uuid} on node {node.name} is reported unhealthy")
        self.devices = tuple(h[1].uuid for h in found.values() if h)
        self.expressions.append(
            {"key": HOSTNAME_LABEL, "operator": "In", "values": [node.hostname]}
        )
        self.nodes = [node]

    def excluded_uuids(self) -> None:
        """A node cannot be told to skip one GPU: keep off every node holding an excluded one."""
        holding = sorted(
            {h[0].hostname for u in self.request.excluded_uuids if (h := self.fleet.holder(u))}
        )
        if holding:
            self.expressions.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": holding})
            self.nodes = [n for n in self.nodes if n.hostname not in holding]

    def mig(self) -> None:
        profile = self.request.mig_profile
        if profile is None:
            return
        offering = [n for n in self.nodes if profile in n.offers()]
        if not offering:
            of_model = " of that model" if self.request.models else ""
            present = listing(self.fleet.mig_profiles())
            if self.plugin:
                self.unresolved(
                    (keys.MIG_PROFILE,),
                    f"is offered by no GPU node{of_model}; MIG profiles present: {present}",
                )
                return
            key, value = self.request.source(keys.MIG_PROFILE)
            raise Unplaceable(f"{key}: {value!r} is offered by no GPU node{of_model}; "
                              f"MIG profiles present: {present}")  # fmt: skip
        count = self.request.count if isinstance(self.request.count, int) else 1
        self.nodes = offering
        if self.plugin:
            label = f"{nvidia.mig_resource(profile)}.count"
            self.expressions.append({"key": label, "operator": "Gt", "values": [str(count - 1)]})
            return
        before = self.named_before(offering, profile, count)
        if before is None:
            node, self.devices = self.choose(offering, profile, count)
        else:
            node, self.devices = before
        self.fleet.named.update(self.devices)
        self.expressions.append(
            {"key": HOSTNAME_LABEL, "operator": "In", "values": [node.hostname]}
        )
        self.nodes = [node]
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
        self.uuids()
        self.excluded_uuids()
        self.mig()
        return Placement(
            tuple(self.expressions), tuple(self.nodes), self.devices, tuple(self.warnings)
        )


def place(
    request: GpuRequest,
    fleet: Fleet,
    allow_unknown: bool = False,
    plugin: bool = True,
    named: tuple[str, ...] = (),
) -> Placement:
    """Resolve `request`'s model, memory and device constraints; Unplaceable when none fits.

    `allow_unknown` (policy `unknownModel: allow`) admits an unresolvable constraint with a
    warning instead of denying the pod. Placements are kept with the snapshot (a Deployment's
    pods ask alike, and resolving costs a pass over the cluster's nodes), so they are shared:
    read-only, like the expressions that go into patches. Denials are not kept. `plugin`:
    the cluster runs a device plugin (policy `devicePlugin`), which chooses MIG devices;
    `named`: the MIG devices a pod already names (an earlier admission's choice).
    """
    if request.mig_profile and not plugin:  # names devices: each pod its own
        return _Placer(request, fleet, allow_unknown, plugin, named).place()
    placed = fleet.placements
    key = (request, allow_unknown)
    found = placed.get(key)
    if not isinstance(found, Placement):  # none yet (the fleet keeps them, not knowing the type)
        if len(placed) >= KEPT:  # distinct requests beyond that: start over, memory stays bounded
            placed.clear()
        found = placed[key] = _Placer(request, fleet, allow_unknown).place()
    return found
