"""What the webhook's DRA path does differently per vendor, in one place: which of gpuwire's DRA
devices are a vendor's GPUs (their device types), the attribute that keeps a multi-GPU claim on
the vendor's fast links, what its claims are made of (AMD's one class, a partition profile by
selector; NVIDIA's whole or shared class by the request's limits, and gpuwire's GpuConfig), and
which vendor a claim takes where the request fits both (`choose`): a claim's class is one
vendor's. The vendor's names and env are `gpuwire.vendor.Vendor`'s; the attribute and type
names are the DRA plugin's (`gpuwire.dra`, docs/dra.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwire import annotations as keys
from gpuwire import dra
from gpuwire.annotations import GpuRequest
from gpuwire.vendor import AMD, NVIDIA, Vendor
from webhook.placement import Unplaceable, listing


@dataclass(frozen=True)
class ClaimVendor:
    vendor: Vendor  # whose env a container with its claim is voided of
    types: tuple[str, ...]  # its GPUs' (and partitions') device types
    island: str  # the attribute a multi-GPU claim matches, for fast peer links
    links: str  # what those links are called, in messages
    # the one DeviceClass its claims take; None: whole or shared, by the request's limits
    device_class: str | None
    config: bool  # its claims carry gpuwire's GpuConfig (capabilities, limit profile)


NVIDIA_CLAIMS = ClaimVendor(NVIDIA, (dra.GPU_TYPE,), dra.ISLAND, "NVLink", None, config=True)
AMD_CLAIMS = ClaimVendor(AMD, dra.AMD_TYPES, dra.XGMI_ISLAND, "XGMI", dra.AMD_CLASS, config=False)
CLAIM_VENDORS = (NVIDIA_CLAIMS, AMD_CLAIMS)
GPU_TYPES = tuple(t for v in CLAIM_VENDORS for t in v.types)  # what a claim of GPUs may take
ISLANDS = tuple(v.island for v in CLAIM_VENDORS)  # a device has its vendor's


def of_type(kind: str) -> ClaimVendor:
    """The vendor whose GPUs have device type `kind` (one of GPU_TYPES)."""
    return next(v for v in CLAIM_VENDORS if kind in v.types)


def choose(
    request: GpuRequest, fitting: Mapping[ClaimVendor, Sequence[str]]
) -> tuple[ClaimVendor, list[str]]:
    """The vendor a claim takes, and what to warn, from the products of each vendor's GPUs
    that fit the request (`fitting`, one per device): AMD's for a partition profile, NVIDIA's
    for NVIDIA's options (driver capabilities, limits: an AMD device is given whole, ROCm is
    in the image), else the vendor more of them are, with a warning. An NVIDIA option on a
    request only AMD devices fit is Unplaceable."""
    amd, nvidia = fitting.get(AMD_CLAIMS, ()), fitting.get(NVIDIA_CLAIMS, ())
    nvidia_only = [k for k in (keys.CAPABILITIES, keys.MEMORY_LIMIT, keys.CORES_LIMIT)
                   if k in request.given]  # fmt: skip
    if request.partition is not None:
        if nvidia_only:
            raise Unplaceable.of(
                request,
                (nvidia_only[0],),
                f"is NVIDIA's, and {keys.PARTITION_PROFILE} asks for AMD partitions; "
                "accepted: one vendor's options",
            )
        if not amd:
            raise Unplaceable.of(
                request,
                (keys.PARTITION_PROFILE,),
                "asks for AMD partitions, and no AMD device in the cluster's ResourceSlices "
                "fits the request",
            )
        return AMD_CLAIMS, []
    if nvidia and (nvidia_only or len(nvidia) >= len(amd)):
        if amd and not nvidia_only:
            return NVIDIA_CLAIMS, [
                f"the request fits NVIDIA and AMD GPUs and a claim takes one vendor's: "
                f"NVIDIA's, of which more fit; {keys.MODEL} chooses"
            ]
        return NVIDIA_CLAIMS, []
    if nvidia_only:
        key = nvidia_only[0]
        what = (
            "the driver capabilities NVIDIA's runtime mounts"
            if key == keys.CAPABILITIES
            else "a share of a GPU, which no AMD GPU gives: an AMD device is given whole"
        )
        products = listing(sorted(set(amd)))
        raise Unplaceable.of(
            request,
            (key,),
            f"is NVIDIA's ({what}), and the GPUs in the cluster's ResourceSlices that fit "
            f"the request are AMD's ({products}); accepted: no {key} for AMD GPUs (ROCm's "
            "user space is in the image), or a model NVIDIA nodes have",
        )
    if nvidia:
        return AMD_CLAIMS, [
            f"the request fits NVIDIA and AMD GPUs and a claim takes one vendor's: AMD's, "
            f"of which more fit; {keys.MODEL} chooses"
        ]
    return AMD_CLAIMS, []
