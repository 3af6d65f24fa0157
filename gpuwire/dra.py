"""gpuwire's DRA driver as both sides see it: the names the DRA plugin publishes and reads
(`deviceplugin.dra`) and the webhook's claims ask for (`webhook.claims`), so that they agree
(docs/dra.md). Kubernetes `resource.k8s.io/v1`; attribute names in the driver's own domain
are unprefixed in a slice and `device.attributes["gpu.gpuwire.io"].<name>` in CEL.
"""

from __future__ import annotations

DRIVER = "gpu.gpuwire.io"

# DeviceClasses (deploy/overlays/dra/deviceclasses.yaml): whole GPUs, and shared GPUs whose
# memory and cores are consumable capacity.
WHOLE_CLASS = "gpu.gpuwire.io"
SHARED_CLASS = "shared.gpu.gpuwire.io"
MIG_CLASS = "mig.gpu.gpuwire.io"
AMD_CLASS = "amd.gpu.gpuwire.io"  # AMD GPUs and partitions (AMD's driver's class `gpu.amd.com`)
# The limitProfile the shared class's config enforces: a claim of it naming another fails its
# prepare (`deviceplugin.dra.claims`), so the webhook asks for no other.
SHARED_CLASS_PROFILE = "hami"

# Device attributes.
TYPE = "type"
GPU_TYPE = "gpu"
MIG_TYPE = "mig"
UUID = "uuid"
PRODUCT = "productName"
MODEL = "model"
ISLAND = "nvlinkIsland"
SHARED = "shared"
PROFILE = "profile"  # of a MIG device

# An AMD node's devices, with AMD's DRA driver's names (ROCm/k8s-gpu-dra-driver
# `docs/driver-attributes.md`): a whole GPU (SPX, or no partition modes) and a partition.
AMD_GPU_TYPE = "amdgpu"
AMD_PARTITION_TYPE = "amdgpu-partition"
AMD_TYPES = (AMD_GPU_TYPE, AMD_PARTITION_TYPE)
PARTITION_PROFILE = "partitionProfile"  # `cpx_nps4`; none on a GPU without partition modes
DEVICE_ID = "deviceID"  # the PCI device id, `0x74a1`
XGMI_ISLAND = "xgmiIsland"  # gpuwire's: as nvlinkIsland, over XGMI

# Capacities: a GPU's memory; on a shared GPU also its cores, in percent of its SMs.
MEMORY = "memory"
CORES = "cores"
COMPUTE_UNITS = "computeUnits"  # an AMD device's (AMD's DRA driver's)
SIMD_UNITS = "simdUnits"
# A shared GPU's memory is handed out in whole GiB: its request policy's step and minimum.
MEMORY_STEP_MIB = 1024

# Health as device taints (the DRA plugin's, docs/dra.md): an XID, or a GPU that stopped
# answering; `gpu-count: all` tolerates both (docs/dra.md, "Unhealthy GPUs").
TAINT_XID = f"{DRIVER}/xid"
TAINT_LOST = f"{DRIVER}/gpu-lost"

# The most devices one claim holds: `status.allocation.devices.results` has at most 32
# entries (`AllocationResultsMaxSize`, k8s.io/api `resource/v1/types.go`), and the scheduler's
# allocator refuses a claim asking for more (k8s.io/dynamic-resource-allocation
# `structured/internal/incubating/allocator_incubating.go`: "exceeds the claim limit").
CLAIM_DEVICES_MAX = 32

# The opaque configuration of a claim or class (`devices.config[].opaque.parameters`).
CONFIG_API_VERSION = "gpu.gpuwire.io/v1alpha1"
CONFIG_KIND = "GpuConfig"
CONFIG_CAPABILITIES = "driverCapabilities"
CONFIG_LIMIT_PROFILE = "limitProfile"


def qualified(name: str) -> str:
    """An attribute's fully qualified name, as constraints name it: `gpu.gpuwire.io/<name>`."""
    return f"{DRIVER}/{name}"
