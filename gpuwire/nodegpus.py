"""`gpuwire.io/gpus`: the node annotation that lists every GPU a node agent found.

The device plugin's labeler writes it; the webhook (pinning explicit-UUID requests to the node
that holds them, naming the UUIDs that exist) and `gpuwire inventory` read it. Labels cannot
carry a list of devices, so it is compact JSON: one object per GPU, by index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

ANNOTATION = "gpuwire.io/gpus"


@dataclass(frozen=True)
class NodeGpu:
    index: int
    uuid: str
    product: str
    memory_mib: int
    numa_node: int = -1
    healthy: bool = True


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
        }
        for g in sorted(gpus, key=lambda g: g.index)
    ]
    return json.dumps(entries, separators=(",", ":"))


def decode(text: str) -> tuple[NodeGpu, ...]:
    """The GPUs an annotation value lists; ValueError when a node agent wrote something else."""
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise TypeError(f"expected a JSON array, got {type(entries).__name__}")
        return tuple(
            NodeGpu(
                index=int(e["index"]),
                uuid=str(e["uuid"]),
                product=str(e["product"]),
                memory_mib=int(e["memory_mib"]),
                numa_node=int(e.get("numa_node", -1)),
                healthy=bool(e.get("healthy", True)),
            )
            for e in entries
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed {ANNOTATION} annotation: {exc}") from exc
