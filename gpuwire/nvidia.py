"""Everything NVIDIA-specific that more than one component must agree on.

Env names and grammar, device nodes, the driver's files per capability, resource and label
names. Sources: NVIDIA/libnvidia-container `src/nvc_info.c` (files per capability) and
`src/nvc_internal.h`, the container toolkit docs ("Specialized Configurations with Docker":
the env), NVIDIA/k8s-device-plugin `docs/gpu-feature-discovery/README.md` (the labels). A
second vendor is a sibling module, not an edit here.
"""

from __future__ import annotations

VENDOR = "nvidia"
RESOURCE = "nvidia.com/gpu"
LABEL_PREFIX = "nvidia.com/"
CDI_KIND = "nvidia.com/gpu"

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
CAPABILITIES_ENV = "NVIDIA_DRIVER_CAPABILITIES"
# Access to MIG's config and monitor capabilities; `all` only, privileged containers only
# (NVIDIA/libnvidia-container `select_mig_config_devices`; nvidia-container-toolkit
# `cmd/nvidia-container-runtime-hook/container_config.go`).
MIG_CONTROL_ENV = {"config": "NVIDIA_MIG_CONFIG_DEVICES", "monitor": "NVIDIA_MIG_MONITOR_DEVICES"}

# NVIDIA_DRIVER_CAPABILITIES
CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")
DEFAULT_CAPABILITIES = ("compute", "utility")

# Device nodes: (name under /dev, name of the /proc/devices major or None for 195, minor).
GPU_MAJOR = 195
CTL_NODE = ("nvidiactl", None, 255)
MODESET_NODE = ("nvidia-modeset", None, 254)
UVM_NODES = (("nvidia-uvm", "nvidia-uvm", 0), ("nvidia-uvm-tools", "nvidia-uvm", 1))

# Driver files per capability (libnvidia-container nvc_info.c). Libraries are named
# `<name>.so.<driver version>`; binaries by their plain name.
LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-allocator.so",
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
    ),
    "video": (
        "libvdpau_nvidia.so",
        "libnvidia-encode.so",
        "libnvidia-opticalflow.so",
        "libnvcuvid.so",
    ),
    "graphics": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
        "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so",
        "libnvidia-cbl.so",
    ),
    "display": (),
    "ngx": ("libnvidia-ngx.so",),
    "compat32": (),
}

BINARIES: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

# A capability that also pulls in another one's libraries (video needs the compute libs,
# display the graphics libs).
IMPLIES: dict[str, tuple[str, ...]] = {"video": ("compute",), "display": ("graphics",)}

# Links libnvidia-container adds in the container besides the SONAME ones
# (`symlink_libraries`): (link name, target); `{version}` is the driver version. Each is
# made only when its target is one of the libraries mounted.
EXTRA_LINKS = (
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    ("libGLX_indirect.so.0", "libGLX_nvidia.so.{version}"),
)

# Where the container gets libraries: Debian-family rootfs (has /etc/debian_version) or not.
LIBDIR_DEBIAN = "usr/lib/x86_64-linux-gnu"
LIBDIR_DEBIAN_32 = "usr/lib/i386-linux-gnu"
LIBDIR_OTHER = "usr/lib64"
LIBDIR_OTHER_32 = "usr/lib"
BINDIR = "usr/bin"

# Host-side places to look for the driver's files, relative to the driver root.
HOST_LIBDIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib")
HOST_LIBDIRS_32 = ("usr/lib/i386-linux-gnu", "usr/lib32", "usr/lib")
HOST_BINDIRS = ("usr/bin", "bin", "usr/sbin")

PROC_DRIVER = "proc/driver/nvidia"
PROC_CAPABILITIES = PROC_DRIVER + "/capabilities"  # MIG capabilities (gpuwire.mig)
FIRMWARE_DIR = "lib/firmware/nvidia"


class CapabilityError(ValueError):
    """A driver capability outside the supported set."""


def parse_capabilities(value: str | None) -> tuple[str, ...]:
    """NVIDIA_DRIVER_CAPABILITIES → the capabilities it selects, in canonical (sorted) order.

    Unset or empty means the default `compute,utility`; `all` anywhere means every one.
    """
    entries = [e.strip() for e in (value or "").split(",") if e.strip()]
    if not entries:
        return tuple(sorted(DEFAULT_CAPABILITIES))
    if any(e == "all" for e in entries):
        return tuple(sorted(CAPABILITIES))
    unknown = [e for e in entries if e not in CAPABILITIES]
    if unknown:
        raise CapabilityError(
            f"unknown driver capability {', '.join(unknown)!s}: "
            f"accepted are {', '.join(CAPABILITIES)} or all"
        )
    return tuple(sorted(set(entries)))


def canonical_capabilities(value: str | None) -> str:
    """The form a grant signs: `all` when every capability is asked for, else a sorted list."""
    caps = parse_capabilities(value)
    return "all" if set(caps) == set(CAPABILITIES) else ",".join(caps)


def with_implied(capabilities: tuple[str, ...]) -> tuple[str, ...]:
    """Capabilities plus those whose files they need."""
    out = set(capabilities)
    for cap in capabilities:
        out.update(IMPLIES.get(cap, ()))
    return tuple(sorted(out))


def mig_resource(profile: str) -> str:
    """NVIDIA's mixed-strategy resource of a MIG profile: `nvidia.com/mig-<profile>` with
    `+` as `.` (`1g.10gb+me` → `nvidia.com/mig-1g.10gb.me`; NVIDIA/k8s-device-plugin README,
    "MIG support"). GFD's per-profile labels are named the same way."""
    return f"{LABEL_PREFIX}mig-{profile.replace('+', '.')}"


def mig_profile_of(spelling: str) -> str:
    """The profile a resource or label spells (`1g.10gb.me` → `1g.10gb+me`): the `.` after
    the GB was a `+`."""
    head, sep, attributes = spelling.partition("gb.")
    return f"{head}gb+{attributes}" if sep else spelling


def gfd_product(name: str) -> str:
    """GPU Feature Discovery's `nvidia.com/gpu.product` value for an NVML product name."""
    kept = "".join(c for c in name if c.isalnum() or c in "-_. ")
    return kept.replace(" ", "-")


FAMILIES = (
    ((1, 0), "tesla"),
    ((2, 0), "fermi"),
    ((3, 0), "kepler"),
    ((5, 0), "maxwell"),
    ((6, 0), "pascal"),
    ((7, 0), "volta"),
    ((7, 5), "turing"),
    ((8, 0), "ampere"),
    ((8, 9), "ada-lovelace"),
    ((9, 0), "hopper"),
    ((10, 0), "blackwell"),
    ((11, 0), "undefined"),
    ((12, 0), "blackwell"),
    ((13, 0), "rubin"),
    ((14, 0), "undefined"),
)


def gfd_family(major: int, minor: int) -> str:
    """`nvidia.com/gpu.family` for a compute capability (GFD's table)."""
    family = "undefined"
    for start, name in FAMILIES:
        if (major, minor) >= start:
            family = name
    return family


# Architecture and brand as NVML names them (go-nvlib `pkg/nvlib/device/device.go`,
# GetArchitectureAsString, GetBrandAsString): the strings NVIDIA's DRA driver publishes.
ARCHITECTURES = {
    "kepler": "Kepler",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada-lovelace": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}
# NVML brand constants (pynvml NVML_BRAND_*) → go-nvlib's names.
BRANDS = {
    "NVML_BRAND_QUADRO": "Quadro",
    "NVML_BRAND_TESLA": "Tesla",
    "NVML_BRAND_NVS": "NVS",
    "NVML_BRAND_GRID": "Grid",
    "NVML_BRAND_GEFORCE": "GeForce",
    "NVML_BRAND_TITAN": "Titan",
    "NVML_BRAND_NVIDIA_VAPPS": "NvidiaVApps",
    "NVML_BRAND_NVIDIA_VPC": "NvidiaVPC",
    "NVML_BRAND_NVIDIA_VCS": "NvidiaVCS",
    "NVML_BRAND_NVIDIA_VWS": "NvidiaVWS",
    "NVML_BRAND_NVIDIA_CLOUD_GAMING": "NvidiaCloudGaming",
    "NVML_BRAND_QUADRO_RTX": "QuadroRTX",
    "NVML_BRAND_NVIDIA_RTX": "NvidiaRTX",
    "NVML_BRAND_NVIDIA": "Nvidia",
    "NVML_BRAND_GEFORCE_RTX": "GeForceRTX",
    "NVML_BRAND_TITAN_RTX": "TitanRTX",
}


# libnvidia-container's names where they differ from go-nvlib's: the names of its `brand=`
# requirements, as CUDA images write them (NVIDIA_REQUIRE_CUDA of nvidia/cuda: brand=vapps,
# brand=cloudgaming, …; compared ignoring case).
_TOOLKIT_BRANDS = {
    "NvidiaVApps": "VApps",
    "NvidiaVPC": "VPC",
    "NvidiaVCS": "VCS",
    "NvidiaVWS": "VWS",
    "NvidiaCloudGaming": "CloudGaming",
}


def toolkit_brand(brand: str) -> str:
    """The name `NVIDIA_REQUIRE_*`'s `brand=` gives the brand go-nvlib names `brand`."""
    return _TOOLKIT_BRANDS.get(brand, brand)


def architecture(major: int, minor: int) -> str:
    """`Ampere`, `Ada Lovelace`, `Hopper`, … for a compute capability (`Unknown` past the table)."""
    return ARCHITECTURES.get(gfd_family(major, minor), "Unknown")


def brand_of(product: str) -> str:
    """The brand a product name implies, where NVML's own answer is not at hand: the brand
    word in the name (GeForce, Quadro, Titan, Tesla), else `Nvidia` (data-centre GPUs since
    the A100 report NVML_BRAND_NVIDIA)."""
    words = product.lower().replace("-", " ").split()
    for word, brand in (("geforce", "GeForce"), ("quadro", "Quadro"), ("titan", "Titan")):
        if word in words:
            return brand + ("RTX" if "rtx" in words else "")
    return "Tesla" if "tesla" in words else "Nvidia"
