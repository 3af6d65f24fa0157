"""gpuwire's DRA devices in the cluster as the webhook sees them: plain data built from
ResourceSlices (`resource.k8s.io/v1`), what the DRA path of the mutation checks requests against
before it writes a claim.

Only the driver `gpu.gpuwire.io`'s slices count, and of each pool only its slices at the highest
`pool.generation`, and only once all `pool.resourceSliceCount` of them are there: the
scheduler's allocator reads pools the same way (k8s.io/dynamic-resource-allocation
`structured/pools.go`), so a pool being rewritten is neither half-seen nor seen twice. Of a
device the webhook keeps what a request can ask about (product, UUID, memory, NVLink or XGMI
island, whether it is shared and its capacity consumable, which limit profiles hold a share of
it, a MIG device's profile, an AMD device's partition profile, a taint that keeps claims off
it). A cluster has one per GPU and few kinds of them, so each device is its node, name, UUID and
taint and a `Make` shared by every device alike (one object per distinct make-up, as
`fleet.node_from_object` shares a node's groups): 80,000 GPUs take about 13 MB. Where the slices
come from (a watch, a file) is `watch.py`'s and the CLI's business.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gpuwire import dra, limits
from gpuwire.annotations import normalise_model
from gpuwire.quantity import QuantityError, api_mib
from kubeclient import listfile
from webhook.vendors import ISLANDS

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Make:
    """What a device is, as a request can ask about it: the same object for devices alike."""

    product: str  # productName
    memory_mib: int | None
    island: int | None  # its vendor's island attribute: nvlinkIsland, xgmiIsland
    shared: bool  # the shared attribute: selected by the shared class
    consumable: bool  # allowMultipleAllocations as stored: its capacity is handed out in shares
    kind: str = dra.GPU_TYPE  # the type attribute
    profile: str | None = None  # a MIG device's
    enforces: frozenset[str] = frozenset()  # limit profiles that hold a share here (hamiLimits)
    partition: str | None = None  # an AMD device's partitionProfile (`cpx_nps4`)


@dataclass(frozen=True, slots=True)
class PoolDevice:
    node: str
    name: str  # the device's name in its pool, `gpu-<minor>`
    uuid: str
    make: Make
    taint: str = ""  # a NoSchedule or NoExecute taint it has (`key=value (effect)`), or ""

    @property
    def product(self) -> str:
        return self.make.product

    @property
    def memory_mib(self) -> int | None:
        return self.make.memory_mib

    @property
    def island(self) -> int | None:
        return self.make.island

    @property
    def shared(self) -> bool:
        return self.make.shared

    @property
    def consumable(self) -> bool:
        return self.make.consumable

    @property
    def kind(self) -> str:
        return self.make.kind

    @property
    def profile(self) -> str | None:
        return self.make.profile

    @property
    def enforces(self) -> frozenset[str]:
        return self.make.enforces

    @property
    def partition(self) -> str | None:
        return self.make.partition


def _value(attributes: Obj, name: str) -> Any:
    value = attributes.get(name)
    return next(iter(value.values()), None) if isinstance(value, dict) else None


def _mib(memory: Any) -> int | None:
    try:
        return api_mib(str(memory))
    except QuantityError:
        return None


_ENFORCEMENT = tuple((p, limits.enforcement_attribute(p)) for p in limits.ENFORCED)
_MADE_OF = (dra.PRODUCT, *ISLANDS, dra.SHARED, dra.TYPE, dra.PROFILE, dra.PARTITION_PROFILE,
            *(a for _, a in _ENFORCEMENT))  # fmt: skip
_MAKES: dict[bytes, Make] = {}  # what an entry says of its make-up, as JSON → its Make


def _make(attributes: Obj, entry: Obj) -> Make:
    """The entry's Make, shared: devices alike are found alike by the JSON of what makes
    them (one C call, where reading each attribute is eight in Python)."""
    memory = (entry.get("capacity") or {}).get(dra.MEMORY)
    multiple = entry.get("allowMultipleAllocations")
    key = orjson.dumps([[attributes.get(a) for a in _MADE_OF], memory, multiple])
    found = _MAKES.get(key)
    if found is None:
        if len(_MAKES) >= 4096:  # a few per model are expected: a bound, not a working size
            _MAKES.clear()
        profile = _value(attributes, dra.PROFILE)
        island = next((i for a in ISLANDS if (i := _value(attributes, a)) is not None), None)
        partition = _value(attributes, dra.PARTITION_PROFILE)
        found = _MAKES[key] = Make(
            product=sys.intern(str(_value(attributes, dra.PRODUCT) or "")),
            memory_mib=_mib((memory or {}).get("value") if isinstance(memory, dict) else None),
            island=island if isinstance(island, int) else None,
            shared=_value(attributes, dra.SHARED) is True,
            consumable=multiple is True,
            kind=sys.intern(str(_value(attributes, dra.TYPE) or "")),
            profile=profile if isinstance(profile, str) else None,
            enforces=frozenset(p for p, a in _ENFORCEMENT if _value(attributes, a) is True),
            partition=partition if isinstance(partition, str) else None,
        )
    return found


def _device(node: str, entry: Obj) -> PoolDevice | None:
    attributes = entry.get("attributes") or {}
    name, uuid = entry.get("name"), _value(attributes, dra.UUID)
    if not isinstance(name, str) or not isinstance(uuid, str):
        return None
    return PoolDevice(node, sys.intern(name), uuid, _make(attributes, entry), _taint(entry))


def _taint(entry: Obj) -> str:
    """The first taint that keeps a claim without a toleration off the device (the
    scheduler's: NoSchedule, NoExecute; None and unknown effects are ignored), as text."""
    for t in entry.get("taints") or ():
        if isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute"):
            value = f"={t['value']}" if t.get("value") else ""
            return f"{t.get('key')}{value} ({t['effect']})"
    return ""


@dataclass(frozen=True, slots=True)
class SliceView:
    """What the webhook keeps of one of gpuwire's ResourceSlices."""

    name: str
    pool: str
    generation: int
    count: int  # resourceSliceCount
    node: str
    devices: tuple[PoolDevice, ...]


def slice_view(obj: Obj) -> SliceView | None:
    """A ResourceSlice of gpuwire's driver, for one node, reduced to its devices; None for
    any other."""
    spec = obj.get("spec") or {}
    pool = spec.get("pool") or {}
    node = spec.get("nodeName")
    if spec.get("driver") != dra.DRIVER or not isinstance(pool.get("name"), str) or not node:
        return None
    node = sys.intern(str(node))
    devices = (_device(node, e) for e in spec.get("devices") or ())
    return SliceView(
        name=str((obj.get("metadata") or {}).get("name", "")),
        pool=sys.intern(pool["name"]),
        generation=int(pool.get("generation") or 0),
        count=int(pool.get("resourceSliceCount") or 1),
        node=node,
        devices=tuple(d for d in devices if d),
    )


def _complete(slices: list[SliceView]) -> list[SliceView]:
    """The slices of one pool a reader may use: those at its highest generation, if all of
    them are there; none otherwise."""
    generation = max(s.generation for s in slices)
    current = [s for s in slices if s.generation == generation]
    return current if len(current) == current[0].count else []


@dataclass(frozen=True)
class Pools:
    """An immutable snapshot: node → its gpuwire DRA devices, in slice order."""

    nodes: Mapping[str, tuple[PoolDevice, ...]]

    @classmethod
    def of(cls, slices: Iterable[Obj]) -> Pools:
        return cls.of_views(v for v in map(slice_view, slices) if v is not None)

    @classmethod
    def of_views(cls, views: Iterable[SliceView]) -> Pools:
        by_pool: dict[str, list[SliceView]] = {}
        for v in views:
            by_pool.setdefault(v.pool, []).append(v)
        nodes: dict[str, tuple[PoolDevice, ...]] = {}
        for _, found in sorted(by_pool.items()):
            found.sort(key=lambda v: v.name)
            for v in _complete(found):
                nodes[v.node] = nodes.get(v.node, ()) + v.devices
        return cls(nodes)

    @functools.cached_property
    def devices(self) -> tuple[PoolDevice, ...]:
        return tuple(d for node in sorted(self.nodes) for d in self.nodes[node])

    def warm(self) -> None:
        """Make what DRA admissions read now (a watch calls this in its own thread), not in
        the first admission after a change."""
        self.alike  # noqa: B018 - a cached property, made
        self.products  # noqa: B018

    @functools.cached_property
    def alike(self) -> tuple[PoolDevice, ...]:
        """The devices of one node of each make-up (its devices' `Make`s, in order): a
        cluster of 10,000 nodes has a few dozen."""
        first: dict[tuple[Make, ...], tuple[PoolDevice, ...]] = {}
        for node in sorted(self.nodes):
            devices = self.nodes[node]
            first.setdefault(tuple(d.make for d in devices), devices)
        return tuple(d for devices in first.values() for d in devices)

    @functools.cached_property
    def products(self) -> dict[str, str]:
        """Each product present → its name as model words compare with it (normalised)."""
        return {p: normalise_model(p) for p in sorted({d.product for d in self.devices})}

    @functools.cached_property
    def claims(self) -> dict[object, object]:
        """Requests already translated against this snapshot: `claims.claim` keeps its
        results here (as objects: this module does not import claims). A new snapshot
        starts with none."""
        return {}

    def holder(self, uuid: str) -> PoolDevice | None:
        """The device with GPU UUID `uuid` (compared case-insensitively, as NVIDIA's are)."""
        return self._by_uuid.get(uuid.lower())

    @functools.cached_property
    def _by_uuid(self) -> dict[str, PoolDevice]:
        return {d.uuid.lower(): d for d in self.devices}


NO_POOLS = Pools({})


class SlicesFileError(ValueError):
    """A slices file that is not a ResourceSlice list."""


def load(path: str | Path) -> Pools:
    """A `v1 List` of ResourceSlices in YAML or JSON, as `kubectl get resourceslices -o yaml`
    (or `-o json`) prints it: a static view for `gpuwire mutate`, tests and the demo."""
    return Pools.of(listfile.items(path, "ResourceSlice", SlicesFileError))
