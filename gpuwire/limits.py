"""Limit profiles: how a container's GPU memory and SM limits become environment variables.

Whatever enforces a limit inside the container reads its own variables: HAMi-core
(`libvgpu.so`), the MPS client, or an ML framework's allocator. A profile is one row of a
table saying which variables it reads and in what syntax (HAMi's device plugin,
Project-HAMi/HAMi `pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`; NVIDIA's MPS
docs, "Appendix: Environment Variables"; the frameworks' own docs for
`TF_FORCE_GPU_ALLOW_GROWTH`, `PYTORCH_CUDA_ALLOC_CONF`, `XLA_PYTHON_CLIENT_MEM_FRACTION`).
`enforced` profiles cap the process; the framework ones are informational: the framework
honours them, but a process that ignores them is not stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuwire import hamicore, mps

DEFAULT_PROFILE = "hami"


class LimitError(ValueError):
    """Limits that a profile cannot express (e.g. a percentage where it needs MiB)."""


@dataclass(frozen=True)
class Limits:
    """One container's per-GPU limits, resolved against the GPUs it can land on.

    `memory_mib` and `memory_fraction` are two spellings of one memory limit; either may be
    unknown (None) when the GPU's size is not known at admission time.
    """

    memory_mib: int | None = None
    memory_fraction: float | None = None
    cores_percent: int | None = None
    devices: int | None = 1  # GPUs the container sees; None: not known at admission

    @property
    def memory(self) -> bool:
        return self.memory_mib is not None or self.memory_fraction is not None

    @property
    def any(self) -> bool:
        return self.memory or self.cores_percent is not None


def _need_mib(limits: Limits, profile: str) -> int:
    if limits.memory_mib is None:
        raise LimitError(
            f"profile {profile!r} needs the memory limit in MiB, and the GPU's size is not "
            "known here; give the limit as a size (e.g. 20Gi)"
        )
    return limits.memory_mib


def _need_fraction(limits: Limits, profile: str) -> str:
    if limits.memory_fraction is None:
        raise LimitError(
            f"profile {profile!r} needs the memory limit as a share of the GPU, and the GPU's "
            "size is not known here; give the limit as a percentage (e.g. 25%)"
        )
    thousandths = max(1, min(1000, int(limits.memory_fraction * 1000)))
    return f"{thousandths / 1000:.3f}".rstrip("0").rstrip(".")


def _hami(limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """HAMi-core: `<MiB>m` for every device (no `_<n>` suffix), SM percent, throttling
    forced (`gpuwire.hamicore.limit_env`)."""
    memory = _need_mib(limits, "hami") if limits.memory else None
    return hamicore.limit_env(memory, limits.cores_percent)


def _mps(limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """MPS client of its GPU's control daemon: `0=<MiB>M` (its one device), thread percentage.

    gpuwire runs one daemon per GPU and a client process names one pipe directory, so an MPS
    client has exactly one GPU.
    """
    if limits.devices != 1:
        seen = "an unknown number of" if limits.devices is None else str(limits.devices)
        raise LimitError(
            f"profile 'mps' joins a container to one GPU's MPS control daemon, and this "
            f"container sees {seen} GPUs; give it one GPU (gpuwire.io/gpu-count: 1, or "
            "nvidia.com/gpu: 1)"
        )
    memory = _need_mib(limits, "mps") if limits.memory else None
    return mps.limit_env(memory, limits.cores_percent)


def _jax(limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """XLA preallocates this share of total memory; newer JAX renamed the variable."""
    if not limits.memory:
        return {}
    fraction = _need_fraction(limits, "jax")
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": fraction, "XLA_CLIENT_MEM_FRACTION": fraction}


PYTORCH_CONF = "PYTORCH_CUDA_ALLOC_CONF"
_PYTORCH_KEY = "per_process_memory_fraction"


def _pytorch(limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """`per_process_memory_fraction` (recent PyTorch), merged into the user's allocator options."""
    if not limits.memory:
        return {}
    fraction = _need_fraction(limits, "pytorch")
    options = [
        o.strip()
        for o in existing.get(PYTORCH_CONF, "").split(",")
        if o.strip() and o.split(":", 1)[0].strip() != _PYTORCH_KEY
    ]
    return {PYTORCH_CONF: ",".join([*options, f"{_PYTORCH_KEY}:{fraction}"])}


def _tensorflow(limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """TensorFlow has no env cap; allow-growth at least stops it taking the whole GPU."""
    return {"TF_FORCE_GPU_ALLOW_GROWTH": "true"} if limits.memory else {}


@dataclass(frozen=True)
class Profile:
    name: str
    enforced: bool
    summary: str
    render: Callable[[Limits, Mapping[str, str]], dict[str, str]]
    # Hand-written variables that would lift this profile's limits; removed where it applies.
    escapes: re.Pattern[str] | None = None  # whole names, one per line (re.MULTILINE)

    def escaping(self, names: Iterable[str]) -> list[str]:
        """Those of `names` that would lift this profile's limits (one regex pass for all)."""
        return self.escapes.findall("\n".join(names)) if self.escapes else []


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "hami",
            True,
            "HAMi-core: CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT",
            _hami,
            re.compile(
                r"^(?:CUDA_DEVICE_MEMORY_LIMIT_\d+|CUDA_DEVICE_SM_LIMIT_\d+|CUDA_DISABLE_CONTROL)$",
                re.MULTILINE,
            ),
        ),
        Profile(
            "mps",
            True,
            "MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            _mps,
        ),
        Profile("jax", False, "JAX/XLA: XLA_PYTHON_CLIENT_MEM_FRACTION", _jax),
        Profile("pytorch", False, "PyTorch: PYTORCH_CUDA_ALLOC_CONF", _pytorch),
        Profile("tensorflow", False, "TensorFlow: TF_FORCE_GPU_ALLOW_GROWTH", _tensorflow),
    )
}


def render(profile: str, limits: Limits, existing: Mapping[str, str]) -> dict[str, str]:
    """The env `profile` writes for `limits`, given the container's current env."""
    return PROFILES[profile].render(limits, existing)


ENFORCED = tuple(name for name, p in PROFILES.items() if p.enforced)
ADVISORY = tuple(name for name, p in PROFILES.items() if not p.enforced)
LABEL_PREFIX = "gpuwire.io/limits."  # the node agent owns every label under it


def enforcement_label(profile: str) -> str:
    """The node label (`"true"`) saying a node enforces `profile`: its node agent found the
    mechanism (an MPS control daemon per GPU, a HAMi-core library) and the runtime applies it."""
    return LABEL_PREFIX + profile


def enforcement_attribute(profile: str) -> str:
    """The DRA device attribute (a bool) saying whether a claim's share of a shared GPU is
    held by `profile`'s mechanism there (`hamiLimits`, `mpsLimits`): the label's word, as an
    attribute name has no dot."""
    return profile + "Limits"
