"""What the DRA plugin does differently per vendor, in one place: which devices a node's GPUs
become (`devices.Kind`s) and what a prepared claim's CDI spec holds (a `cdi.ClaimSpec`). The
rest (the pool, slices, taints, claims, tokens, checkpoint, the kubelet's sockets) is the
same for every vendor, under the one driver `gpu.gpuwire.io`: NVIDIA's devices carry NVIDIA's
DRA driver's attribute names, AMD's AMD's (docs/dra.md). What the DRA plugin shares with the
device plugin per vendor (discovery, labels) is the node's `deviceplugin.vendors.NodeVendor`.
"""

from __future__ import annotations

from dataclasses import dataclass

from deviceplugin.dra import amdcdi, amddevices, cdi, devices
from deviceplugin.vendors import AMD_NODE, NVIDIA_NODE, NodeVendor


@dataclass(frozen=True)
class DraVendor:
    node: NodeVendor  # the node's discovery; its `vendor`'s finds what a claim's spec gives
    kinds: tuple[devices.Kind, ...]
    spec: cdi.ClaimSpec


NVIDIA_DRA = DraVendor(NVIDIA_NODE, devices.KINDS, cdi.claim_spec)
AMD_DRA = DraVendor(AMD_NODE, (amddevices.amd_devices,), amdcdi.claim_spec)
DRA_VENDORS = {v.node.vendor.name: v for v in (NVIDIA_DRA, AMD_DRA)}


def of(name: str) -> DraVendor:
    """The node's vendor (its config's `vendor`, already checked)."""
    return DRA_VENDORS[name]
