"""`gpuwire.io/gpus`: the node annotation that lists every GPU a node agent found.

The device plugin's labeler writes it; the webhook (every GPU of every node: mixed nodes, the
resource each GPU is advertised under, the node that holds an explicitly named GPU) and
`gpuwire inventory` read it. Labels cannot carry a list of devices, so it is compact JSON: one
object per GPU, by index. A GPU in MIG mode carries its MIG devices under `mig` (an empty
list: MIG on, no MIG devices yet); a GPU without the key is not in MIG mode. An AMD node's
entries say `"vendor": "amd"` (none: NVIDIA), and each partition of a partitioned AMD GPU is
an entry of its own naming its GPU as `parent`. A cluster holds
tens of thousands of GPUs and few distinct models, so decoding shares one string per
product and resource name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuwire import nvidia
from gpuwire.devices import Device

ANNOTATION = "gpuwire.io/gpus"


DEFAULT_VENDOR = nvidia.VENDOR  # an entry without "vendor": the annotation before AMD's


@dataclass(frozen=True)
class NodeMig:
    """A MIG device of a GPU: its UUID, profile, GPU and compute instance, memory, health."""

    uuid: str
    profile: str
    gi: int
    ci: int
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeGpu:
    index: int
    uuid: str
    product: str  # as NVML names it: NVIDIA A100-SXM4-80GB
    memory_mib: int
    numa_node: int = -1
    healthy: bool = True
    resource: str = nvidia.RESOURCE  # the extended resource the device plugin lists it under
    replicas: int = 1  # how many devices of that resource it is (time-slicing, MPS)
    mig: tuple[NodeMig, ...] | None = None  # None: not in MIG mode
    vendor: str = DEFAULT_VENDOR
    parent: str = ""  # an AMD partition's GPU (its uuid); "": a whole GPU


def described(device: Device, **known: Any) -> NodeGpu:
    """`device` as the annotation lists it (its index, UUID, product, memory, NUMA node),
    with what its node agent `known` of it besides (health, resource, vendor, ...)."""
    return NodeGpu(
        index=device.index,
        uuid=device.uuid,
        product=device.product,
        memory_mib=device.memory_mib,
        numa_node=device.numa_node,
        **known,
    )


def encode(gpus: Iterable[NodeGpu]) -> str:
    """The annotation value: by index, stable key order, no spaces."""
    entries = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "product": g.product,
            "memory_mib": g.memory_mib,
            "numa_node": g.numa_node,
            "healthy": g.healthy,
            "resource": g.resource,
            "replicas": g.replicas,
            **({} if g.mig is None else {"mig": [_mig_entry(m) for m in g.mig]}),
            **({} if g.vendor == DEFAULT_VENDOR else {"vendor": g.vendor}),
            **({"parent": g.parent} if g.parent else {}),
        }
        for g in sorted(gpus, key=lambda g: g.index)
    ]
    return json.dumps(entries, separators=(",", ":"))


def _mig_entry(m: NodeMig) -> dict[str, object]:
    return {
        "uuid": m.uuid,
        "profile": m.profile,
        "gi": m.gi,
        "ci": m.ci,
        "memory_mib": m.memory_mib,
        "healthy": m.healthy,
    }


def _mig(entries: object) -> tuple[NodeMig, ...] | None:
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise TypeError("mig: expected a JSON array")
    return tuple(
        NodeMig(
            uuid=str(m["uuid"]),
            profile=str(m["profile"]),
            gi=int(m["gi"]),
            ci=int(m["ci"]),
            memory_mib=int(m["memory_mib"]),
            healthy=bool(m.get("healthy", True)),
        )
        for m in entries
    )


def decode(text: str) -> tuple[NodeGpu, ...]:
    """The GPUs an annotation value lists; ValueError when a node agent wrote something else.
    A value written before GPUs named their resource lists them under `nvidia.com/gpu`."""
    intern = sys.intern
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise TypeError(f"expected a JSON array, got {type(entries).__name__}")
        return tuple(
            NodeGpu(
                index=int(e["index"]),
                uuid=str(e["uuid"]),
                product=intern(str(e["product"])),
                memory_mib=int(e["memory_mib"]),
                numa_node=int(e.get("numa_node", -1)),
                healthy=bool(e.get("healthy", True)),
                resource=intern(str(e.get("resource", nvidia.RESOURCE))),
                replicas=int(e.get("replicas", 1)),
                mig=_mig(e.get("mig")),
                vendor=intern(str(e.get("vendor", DEFAULT_VENDOR))),
                parent=str(e.get("parent", "")),
            )
            for e in entries
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed {ANNOTATION} annotation: {exc}") from exc
