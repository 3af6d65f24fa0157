"""Devices → ResourceSlices, and what to change so the API server holds them. Pure.

One pool per node, named after it, as NVIDIA's and the example driver do; its slices are
named `<node>-<driver>-<n>` (a hash stands in for a node name too long for that), owned by
the Node so they go with it. A slice holds at most 64 devices: 128 is the limit, but from
1.35 only 64 once any device has taints, and a fault must not change how devices are cut.

The API's rules for a pool (`resource.k8s.io/v1` ResourceSlice, `pool`): every change bumps
`generation` in *all* of the pool's slices, `resourceSliceCount` says how many there are, and
consumers use only the highest generation (a pool with fewer slices at it is incomplete).
`plan` compares what is published with what should be and says which writes bring it there:
none when nothing changed (a resync costs one list), otherwise every slice at the next
generation, extra slices deleted last. A taint keeps the `timeAdded` it was first published
with; a new one is stamped with the time it is first published.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.taints import Taint

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES = 64
MAX_NAME = 253

Obj = dict[str, Any]


@dataclass(frozen=True)
class Pool:
    """Whose slices these are: the driver, and the node (its name is the pool's)."""

    driver: str
    node: str
    node_uid: str


def slice_name(pool: Pool, index: int) -> str:
    name = f"{pool.node}-{pool.driver}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(pool.node.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(f"-{digest}-{pool.driver}-{index}")
    return f"{pool.node[:keep].rstrip('.-')}-{digest}-{pool.driver}-{index}"


def wanted(
    pool: Pool,
    devices: Sequence[DraDevice],
    taints: Mapping[str, Sequence[Taint]],
    omit: Collection[str] = (),
) -> list[Obj]:
    """The pool's slices, generation 0 (`plan` sets it). `taints`: GPU or MIG device UUID →
    its taints; `omit`: UUIDs whose devices are left out (for API servers that drop taints)."""
    entries = []
    for device in devices:
        if device.uuid in omit:
            continue
        entry = copy.deepcopy(device.entry)
        if taints.get(device.uuid):
            entry["taints"] = [dict(t) for t in taints[device.uuid]]
        entries.append(entry)
    chunks = [entries[i : i + MAX_DEVICES] for i in range(0, len(entries), MAX_DEVICES)]
    owner = {"apiVersion": "v1", "kind": "Node", "name": pool.node, "uid": pool.node_uid}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": slice_name(pool, i), "ownerReferences": [owner]},
            "spec": {
                "driver": pool.driver,
                "pool": {"name": pool.node, "generation": 0, "resourceSliceCount": len(chunks)},
                "nodeName": pool.node,
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


@dataclass
class Plan:
    """The writes that make the published slices the wanted ones, in order."""

    generation: int
    create: list[Obj] = field(default_factory=list)
    update: list[Obj] = field(default_factory=list)  # carry the resourceVersion they replace
    delete: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _taint_key(taint: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(taint.get("key")), str(taint.get("value", "")), str(taint.get("effect"))


def _stamp(slices: list[Obj], published: Sequence[Obj], now: str) -> None:
    """Give each wanted taint the timeAdded it was published with, else `now`."""
    added: dict[tuple[str, tuple[str, str, str]], str] = {}
    for obj in published:
        for device in obj.get("spec", {}).get("devices") or ():
            for t in device.get("taints") or ():
                if t.get("timeAdded"):
                    added[(device.get("name"), _taint_key(t))] = t["timeAdded"]
    for obj in slices:
        for device in obj["spec"]["devices"]:
            for t in device.get("taints", ()):
                t["timeAdded"] = added.get((device["name"], _taint_key(t)), now)


def _content(obj: Obj) -> Obj:
    """What a slice says, generation aside."""
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.get("pool", {}).pop("generation", None)
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {"spec": spec, "owners": [(o.get("kind"), o.get("uid")) for o in owners]}


def plan(wanted_slices: list[Obj], published: Sequence[Obj], now: str) -> Plan:
    """What to write so that `published` (the pool's slices as listed) becomes
    `wanted_slices`; `now` (RFC 3339) stamps new taints."""
    slices = copy.deepcopy(wanted_slices)
    _stamp(slices, published, now)
    by_name = {obj["metadata"]["name"]: obj for obj in published}
    generations = [int(o["spec"]["pool"].get("generation") or 0) for o in published]
    current = max(generations, default=0)
    same = (
        len(set(generations)) <= 1
        and set(by_name) == {o["metadata"]["name"] for o in slices}
        and all(_content(o) == _content(by_name[o["metadata"]["name"]]) for o in slices)
    )
    if same and published:
        return Plan(current)
    if not slices and not published:
        return Plan(current)
    result = Plan(current + 1)
    for obj in slices:
        obj["spec"]["pool"]["generation"] = result.generation
        old = by_name.get(obj["metadata"]["name"])
        if old is None:
            result.create.append(obj)
        else:
            obj["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
            result.update.append(obj)
    wanted_names = {o["metadata"]["name"] for o in slices}
    result.delete = sorted(name for name in by_name if name not in wanted_names)
    return result
