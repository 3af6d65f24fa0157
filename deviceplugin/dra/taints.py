"""Health as device taints (KEP-5055): what the scheduler, and with NoExecute the eviction
controller, hold against a GPU that had a critical event. Pure.

One taint per unhealthy GPU, from the worst of its critical events since it was last healthy
(the latest among equals): `gpu.gpuwire.io/xid=<XID>` for an XID, `gpu.gpuwire.io/gpu-lost`
for a GPU the driver stops answering for or an NVML failure. The effect follows the XID's
class (NVIDIA's XID catalog, docs.nvidia.com/deploy/xid-errors): **NoExecute** where the
GPU's state is lost or corrupt and the work on it cannot go on (48 double-bit ECC, 62
internal micro-controller halt, 79 fallen off the bus, 95 uncontained ECC, 119 and 120 GSP
timeout and error, 140 unrecovered ECC): pods whose claims do not tolerate it are evicted;
**NoSchedule** for every other critical XID (NVLink, page retirement, contained ECC, …): no
new claim gets the GPU, running ones keep it. The XIDs the health policy ignores (application
errors: 13, 31, 43, 45, 68, 109 by default) taint nothing. When the quiet period passes and
the driver still answers, the taint goes with the next slice update. Only NoSchedule and
NoExecute are used: `None` needs 1.35, and gpuwire publishes to 1.34.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deviceplugin.gpus.discovery import HealthEvent
from gpuwire.dra import TAINT_LOST, TAINT_XID

NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
NO_EXECUTE_XIDS = frozenset({48, 62, 79, 95, 119, 120, 140})

Taint = dict[str, str]


def effect(event: HealthEvent) -> str:
    return NO_EXECUTE if event.xid in NO_EXECUTE_XIDS else NO_SCHEDULE


def taint(events: Sequence[HealthEvent]) -> Taint:
    """The taint for a GPU with these critical events (oldest first; at least one)."""
    worst = max(reversed(events), key=lambda e: effect(e) == NO_EXECUTE)
    if worst.xid is None:
        return {"key": TAINT_LOST, "value": "", "effect": effect(worst)}
    return {"key": TAINT_XID, "value": str(worst.xid), "effect": effect(worst)}


def taints(causes: Mapping[str, Sequence[HealthEvent]]) -> dict[str, list[Taint]]:
    """GPU or MIG device UUID → its taints (none for a healthy one)."""
    return {uuid: [taint(events)] for uuid, events in causes.items() if events}
