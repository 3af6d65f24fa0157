"""An AMD node's labels and GPU annotation, computed from what AMD discovery found. Pure.

AMD's node labeller's keys (ROCm/k8s-device-plugin `cmd/k8s-node-labeller/main.go`), so that
selectors written for it keep working: `amd.com/gpu.<name>` for `product-name`, `family`,
`vram`, `cu-count`, `simd-count`, `device-id`, `driver-version`,
`compute-memory-partition`, `compute-partitioning-supported`, `memory-partitioning-supported`.
As the labeller writes them: one distinct value on the node is `<key>=<value>`, several are
`<key>.<value>=<count>`; `device-id` in hex without `0x`, `vram` in GiB with a `G`, a product
name with spaces as `_` and no parentheses, a family as amdgpu names it (`AI`, `NV`,
`GC_11_0_0`), a partition type `cpx_nps4`. They describe the devices the node advertises: a
partitioned GPU's partitions (what AMD's device plugin lists), each with its share of
compute units and memory. Beside them gpuwire's own, the same for every vendor
(`labels.own_labels`: count, model, memory, `gpuwire.io/gpu.xgmi`), and
`gpuwire.io/gpu.vendor`. The annotation `gpuwire.io/gpus` lists every device with its vendor,
and a partition with its GPU as parent. The labeller's `beta.amd.com/` copies, its firmware
and driver source versions are left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

from deviceplugin.agent.labels import GW, own_labels
from gpuwire import amd, nodegpus
from gpuwire.kfd import AmdGpu, AmdNode

KEY = amd.LABEL_PREFIX + "gpu."
VENDOR_LABEL = GW + "gpu.vendor"
OWNED = (KEY, VENDOR_LABEL)  # every key under amd.com/gpu. is the labeller's, so ours here


def _values(gpu: AmdGpu, node: AmdNode) -> dict[str, str]:
    compute, memory = node.modes.get(gpu.device.pci_bus_id, ((), ()))
    return {
        "product-name": amd.label_value(gpu.device.product),
        "family": amd.family(gpu.gfx_target_version),
        "vram": f"{round(gpu.device.memory_mib / 1024)}G",
        "cu-count": str(gpu.compute_units),
        "simd-count": str(gpu.simd_count),
        "device-id": f"{gpu.device_id:04x}",
        "driver-version": node.version,
        "compute-memory-partition": gpu.partition_type,
        "compute-partitioning-supported": str(len(compute) > 1).lower(),
        "memory-partitioning-supported": str(len(memory) > 1).lower(),
    }


def labels(node: AmdNode) -> dict[str, str]:
    """The labels of a node with these AMD GPUs (empty: none)."""
    if not node.gpus:
        return {}
    counted: dict[str, Counter[str]] = {}
    for gpu in node.gpus:
        for name, value in _values(gpu, node).items():
            if value:
                counted.setdefault(name, Counter())[value] += 1
    out: dict[str, str] = {}
    for name, values in counted.items():
        if len(values) == 1:
            out[KEY + name] = next(iter(values))
        else:
            out.update({f"{KEY}{name}.{v}": str(n) for v, n in sorted(values.items())})
    return {**out, **own_labels(node.devices, "xgmi"), VENDOR_LABEL: amd.VENDOR}


def gpus_annotation(
    node: AmdNode, resources: Mapping[str, str], unhealthy: Collection[str] = ()
) -> str:
    """`gpuwire.io/gpus`: every device (GPU or partition), its health and the resource it is
    advertised under (`resources`: uuid → name)."""
    return nodegpus.encode(
        nodegpus.described(
            g.device,
            healthy=g.healthy and g.device.uuid not in unhealthy,
            resource=resources.get(g.device.uuid, amd.RESOURCE),
            vendor=amd.VENDOR,
            parent=g.parent,
        )
        for g in node.gpus
    )
