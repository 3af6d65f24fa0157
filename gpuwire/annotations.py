"""Pod annotations → one typed GPU request.

The grammar is the user-facing contract (docs/annotations.md). Every value is checked here,
once, and every error names the annotation, the value and what is accepted. HAMi's four
selection annotations (Project-HAMi/HAMi v2.10.0, `nvidia.com/use-gputype` and its kin,
matched by `device.CheckType` and `device.CheckUUID`) are read as aliases, so pods written for
HAMi keep working. What a request means for a given pod, cluster and policy is decided in
`webhook/`; this module only knows the words.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuwire import amd, limits, nvidia, quantity

PREFIX = "gpuwire.io/"
MODEL = PREFIX + "gpu-model"
MIN_MEMORY = PREFIX + "gpu-min-memory"
COUNT = PREFIX + "gpu-count"
UUID = PREFIX + "gpu-uuid"
CAPABILITIES = PREFIX + "driver-capabilities"
MEMORY_LIMIT = PREFIX + "gpu-memory-limit"
CORES_LIMIT = PREFIX + "gpu-cores-limit"
LIMIT_PROFILE = PREFIX + "limit-profile"
CONTAINERS = PREFIX + "containers"
MIG_PROFILE = PREFIX + "mig-profile"
PARTITION_PROFILE = PREFIX + "partition-profile"

# HAMi's resource names (per container; webhook/hami.py holds them as gpuwire's limits)
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_PRIORITY = "nvidia.com/priority"
HAMI_RESOURCES = frozenset((HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES, HAMI_PRIORITY))

HAMI_USE_TYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_TYPE = "nvidia.com/nouse-gputype"
HAMI_USE_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"

KNOWN = (
    MODEL,
    MIN_MEMORY,
    COUNT,
    UUID,
    CAPABILITIES,
    MEMORY_LIMIT,
    CORES_LIMIT,
    LIMIT_PROFILE,
    CONTAINERS,
    MIG_PROFILE,
    PARTITION_PROFILE,
    HAMI_USE_TYPE,
    HAMI_NOUSE_TYPE,
    HAMI_USE_UUID,
    HAMI_NOUSE_UUID,
)
_KNOWN = frozenset(KNOWN)

ACCEPTED = {
    MODEL: "comma-separated model names (case-insensitive substrings, e.g. A100,H100), "
    "each optionally prefixed with ! to exclude",
    MIN_MEMORY: quantity.ACCEPTED,
    COUNT: "all, none (driver files but no GPU), or a positive integer",
    UUID: "comma-separated GPU or MIG UUIDs as nvidia-smi -L prints them "
    "(GPU-xxxxxxxx-xxxx-…, MIG-xxxxxxxx-xxxx-…), AMD GPUs' and partitions' as rocminfo "
    "prints them (GPU-<16 hex digits>), each optionally prefixed with ! to exclude",
    CAPABILITIES: f"all, or a comma-separated subset of {', '.join(nvidia.CAPABILITIES)}",
    MEMORY_LIMIT: f"{quantity.ACCEPTED}, or a percentage of the GPU (1%–100%)",
    CORES_LIMIT: "a percentage of the GPU's SMs, 1–100 (e.g. 30 or 30%)",
    LIMIT_PROFILE: f"comma-separated profiles: {', '.join(limits.PROFILES)}",
    CONTAINERS: "comma-separated container names of this pod",
    MIG_PROFILE: "a MIG profile as nvidia-smi names it (1g.10gb, 3g.40gb, 1g.10gb+me, "
    "1c.3g.40gb); gpuwire.io/gpu-count then counts MIG devices",
    PARTITION_PROFILE: "an AMD partition profile as AMD's device plugin names it, "
    "<compute>_<memory> (spx_nps1, cpx_nps4; compute "
    f"{', '.join(m.lower() for m in amd.COMPUTE_PARTITIONS)}, memory "
    f"{', '.join(m.lower() for m in amd.MEMORY_PARTITIONS)}); gpuwire.io/gpu-count then "
    "counts partitions",
}
ACCEPTED[HAMI_USE_TYPE] = ACCEPTED[HAMI_NOUSE_TYPE] = "comma-separated model names"
ACCEPTED[HAMI_USE_UUID] = ACCEPTED[HAMI_NOUSE_UUID] = "comma-separated GPU UUIDs"

_MODEL_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")
_UUID = re.compile(
    r"^(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"
    r"|^GPU-[0-9a-fA-F]{16}(-p[0-9]+)?$"  # AMD's: KFD's unique id (gpuwire.amd.uuid)
)
# go-nvlib's profile grammar (`pkg/nvlib/device/mig_profile.go`): [<C>c.]<G>g.<GB>gb[+attr|-attr]
_MIG_PROFILE = re.compile(
    r"^([1-9][0-9]?c\.)?[1-9][0-9]?g\.[1-9][0-9]{0,3}gb([+-][a-z][a-z.]*[a-z])?$"
)
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PERCENT = re.compile(r"^([0-9]{1,3})\s*%$")

Count = int | Literal["all", "none"]
Words = tuple[list[str], list[str]]


@dataclass(frozen=True)
class Problem:
    annotation: str
    value: str
    reason: str

    def __str__(self) -> str:
        accepted = ACCEPTED[self.annotation]
        return f"{self.annotation}: {self.value!r} {self.reason}; accepted: {accepted}"


class AnnotationError(ValueError):
    """One or more annotations that do not parse; the message lists every one."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class MemoryLimit:
    """A per-GPU memory limit: an absolute size or a share of the GPU."""

    mib: int | None = None
    percent: int | None = None

    def resolve(self, gpu_mib: int | None) -> tuple[int | None, float | None]:
        """(MiB, share of the GPU): both, where the GPU's size `gpu_mib` makes the other known;
        (None, None) for no limit."""
        if self.percent is not None:
            return (gpu_mib * self.percent // 100 if gpu_mib else None), self.percent / 100
        if self.mib is not None:
            return self.mib, (min(1.0, self.mib / gpu_mib) if gpu_mib else None)
        return None, None


def normalise_model(name: str) -> str:
    """Lower case, spaces and underscores as dashes: `A100 SXM4` and GFD's
    `NVIDIA-A100-SXM4-80GB` compare, `Instinct MI300X` and AMD's `AMD_Instinct_MI300X` too."""
    return "-".join(name.lower().replace("_", " ").split())


@dataclass(frozen=True)
class GpuRequest:
    """Everything a pod's annotations ask for. Empty fields were not asked for."""

    models: tuple[str, ...] = ()  # normalised (normalise_model)
    excluded_models: tuple[str, ...] = ()
    min_memory_mib: int | None = None
    count: Count | None = None
    uuids: tuple[str, ...] = ()
    excluded_uuids: tuple[str, ...] = ()
    capabilities: str | None = None  # canonical (nvidia.canonical_capabilities)
    memory_limit: MemoryLimit | None = None
    cores_limit: int | None = None
    profiles: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    mig_profile: str | None = None
    partition: str | None = None  # an AMD partition profile, `cpx_nps4`
    # annotation → raw value, as asked; left out of the hash (a dict has none), not of equality
    given: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def asks(self) -> bool:
        """Whether the pod asks for a GPU at all (a profile alone asks for nothing)."""
        return len(self.given) > (LIMIT_PROFILE in self.given)

    @property
    def wants_limits(self) -> bool:
        return self.memory_limit is not None or self.cores_limit is not None

    def source(self, *keys: str) -> tuple[str, str]:
        """(annotation, value) as the user wrote it, for the first of `keys` given."""
        for key in keys:
            if key in self.given:
                return key, self.given[key]
        raise KeyError(keys)


NOTHING = GpuRequest()


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class _Parser:
    """Reads the given annotations, collecting every problem instead of stopping at the first:
    one denial lists every fix."""

    def __init__(self, given: dict[str, str]) -> None:
        self.given = given
        self.problems: list[Problem] = []

    def fail(self, key: str, reason: str) -> None:
        self.problems.append(Problem(key, self.given[key], reason))

    def split(self, keys: tuple[str, str, str], token: re.Pattern[str], what: str) -> Words:
        """(included, excluded) words of a `!`-able list, keys[0], and of its HAMi aliases,
        keys[1] (included) and keys[2] (excluded)."""
        own, _, excluding = keys
        included: list[str] = []
        excluded: list[str] = []
        for key in keys:
            for item in _items(self.given.get(key, "")):
                negated = key == own and item.startswith("!")
                word = item[1:].strip() if negated else item
                if not token.match(word):
                    self.fail(key, f"has {item!r}, which is not {what}")
                elif negated or key == excluding:
                    excluded.append(word)
                else:
                    included.append(word)
        return included, excluded

    def conflict(self, keys: tuple[str, ...], inc: Iterable[str], exc: Iterable[str]) -> None:
        both = sorted(set(inc) & set(exc))
        if both:
            key = keys[0] if keys[0] in self.given else keys[1]
            self.fail(key, f"both asks for and excludes {', '.join(both)}")

    def models(self) -> dict[str, tuple[str, ...]]:
        included, excluded = self.split(MODEL_KEYS, _MODEL_TOKEN, "a model name")
        inc = _unique(normalise_model(m) for m in included)
        exc = _unique(normalise_model(m) for m in excluded)
        self.conflict(MODEL_KEYS, inc, exc)
        return {"models": inc, "excluded_models": exc}

    def uuids(self) -> dict[str, tuple[str, ...]]:
        included, excluded = self.split(UUID_KEYS, _UUID, "a GPU UUID")
        inc, exc = _unique(included, key=str.lower), _unique(excluded, key=str.lower)
        self.conflict(UUID_KEYS, (u.lower() for u in inc), (u.lower() for u in exc))
        return {"uuids": inc, "excluded_uuids": exc}

    def count(self, value: str) -> Count | None:
        value = value.strip().lower()
        if value in ("all", "none"):
            return "all" if value == "all" else "none"
        if value.isascii() and value.isdigit() and int(value) > 0:
            return int(value)
        self.fail(COUNT, "is not a GPU count")
        return None

    def size(self, key: str, text: str, mib: Callable[[str], int], unsized: str) -> int | None:
        """`text` in whole MiB (rounded by `mib`), at least 1."""
        try:
            found = mib(text)
        except quantity.QuantityError:
            self.fail(key, unsized)
            return None
        if found <= 0:
            self.fail(key, "is less than 1 MiB")
            return None
        return found

    def min_memory(self, value: str) -> int | None:
        return self.size(MIN_MEMORY, value, quantity.mib_at_least, "is not a memory size")

    def capabilities(self, value: str) -> str | None:
        unknown = [c for c in _items(value) if c not in (*nvidia.CAPABILITIES, "all")]
        if unknown:
            self.fail(CAPABILITIES, f"has unknown capability {', '.join(unknown)}")
            return None
        return nvidia.canonical_capabilities(value)

    def percent(self, key: str, text: str) -> int | None:
        m = _PERCENT.match(text)
        if m and 1 <= int(m.group(1)) <= 100:
            return int(m.group(1))
        self.fail(key, "is not a percentage from 1 to 100")
        return None

    def memory_limit(self, value: str) -> MemoryLimit | None:
        text = value.strip()
        if text.endswith("%"):
            percent = self.percent(MEMORY_LIMIT, text)
            return MemoryLimit(percent=percent) if percent is not None else None
        unsized = "is neither a memory size nor a percentage"
        mib = self.size(MEMORY_LIMIT, text, quantity.mib_at_most, unsized)
        return MemoryLimit(mib=mib) if mib is not None else None

    def cores_limit(self, value: str) -> int | None:
        text = value.strip()
        return self.percent(CORES_LIMIT, text if text.endswith("%") else text + "%")

    def profiles(self, value: str) -> tuple[str, ...]:
        names = _unique(p.lower() for p in _items(value))
        unknown = [n for n in names if n not in limits.PROFILES]
        if unknown:
            self.fail(LIMIT_PROFILE, f"names unknown profile {', '.join(unknown)}")
        return tuple(n for n in names if n in limits.PROFILES)

    def containers(self, value: str) -> tuple[str, ...]:
        names = _unique(_items(value))
        bad = [n for n in names if not _CONTAINER_NAME.match(n)]
        if bad:
            self.fail(CONTAINERS, f"has {', '.join(bad)}, not a container name")
        return names

    def mig_profile(self, value: str) -> str | None:
        text = value.strip()
        if _MIG_PROFILE.match(text):
            return text
        self.fail(MIG_PROFILE, "is not a MIG profile")
        return None

    def partition(self, value: str) -> str | None:
        compute, _, memory = value.strip().upper().partition("_")
        if compute in amd.COMPUTE_PARTITIONS and memory in amd.MEMORY_PARTITIONS:
            return amd.partition_type(compute, memory)
        self.fail(PARTITION_PROFILE, "is not a partition profile")
        return None

    def consistent(self, fields: dict[str, Any]) -> None:
        """Explicit devices fix the count; a count that says otherwise is a mistake. A MIG
        profile asks for MIG devices, so it counts them and takes no memory or devices."""
        count, uuids = fields.get("count"), fields.get("uuids", ())
        if uuids and count is not None and count != len(uuids):
            self.fail(COUNT, f"disagrees with the {len(uuids)} GPU(s) named by {UUID}")
        if MIG_PROFILE in self.given and PARTITION_PROFILE in self.given:
            self.fail(PARTITION_PROFILE, f"cannot go with {MIG_PROFILE}: AMD partitions are "
                      "no MIG devices")  # fmt: skip
        if MIG_PROFILE not in self.given:
            return
        if count in ("all", "none"):
            self.fail(COUNT, f"is not a number of MIG devices, which {MIG_PROFILE} asks for")
        for key, what in ((MIN_MEMORY, "its memory"), (UUID, "its devices")):
            if key in self.given:
                self.fail(MIG_PROFILE, f"cannot go with {key}: the profile fixes {what}")


MODEL_KEYS = (MODEL, HAMI_USE_TYPE, HAMI_NOUSE_TYPE)
UUID_KEYS = (UUID, HAMI_USE_UUID, HAMI_NOUSE_UUID)
# Annotation → (GpuRequest field, reader); each runs only when its annotation is given.
_SINGLE: dict[str, tuple[str, Callable[[_Parser, str], object]]] = {
    COUNT: ("count", _Parser.count),
    MIN_MEMORY: ("min_memory_mib", _Parser.min_memory),
    CAPABILITIES: ("capabilities", _Parser.capabilities),
    MEMORY_LIMIT: ("memory_limit", _Parser.memory_limit),
    CORES_LIMIT: ("cores_limit", _Parser.cores_limit),
    LIMIT_PROFILE: ("profiles", _Parser.profiles),
    CONTAINERS: ("containers", _Parser.containers),
    MIG_PROFILE: ("mig_profile", _Parser.mig_profile),
    PARTITION_PROFILE: ("partition", _Parser.partition),
}


def _unique(items: Iterable[str], key: Callable[[str], str] = str) -> tuple[str, ...]:
    """Items in first-seen order, each once (by `key`)."""
    seen: dict[str, str] = {}
    for item in items:
        seen.setdefault(key(item), item)
    return tuple(seen.values())


def parse(annotations: Mapping[str, str]) -> GpuRequest:
    """A pod's annotations → its GPU request; AnnotationError lists every bad value.

    Empty values count as not given (as HAMi treats its annotations).
    """
    given = tuple(
        [(k, annotations[k]) for k in KNOWN if k in annotations and annotations[k].strip()]
    )
    return _parse(given) if given else NOTHING  # most pods ask for nothing


@functools.lru_cache(maxsize=1024)
def _parse(items: tuple[tuple[str, str], ...]) -> GpuRequest:
    """Memoized: a Deployment's pods all carry the same annotations. The request returned is
    shared, so it is read-only, `given` included; errors are not kept (each raises afresh)."""
    given = dict(items)
    p = _Parser(given)
    fields: dict[str, Any] = {}
    if not given.keys().isdisjoint(MODEL_KEYS):
        fields.update(p.models())
    if not given.keys().isdisjoint(UUID_KEYS):
        fields.update(p.uuids())
    for key, (name, read) in _SINGLE.items():
        if key in given:
            fields[name] = read(p, given[key])
    p.consistent(fields)
    if p.problems:
        raise AnnotationError(p.problems)
    return GpuRequest(**fields, given=given)


# HAMi's other pod annotations (v2.10.0, `pkg/device/nvidia/device.go`, `pkg/util/types.go`):
# a pod written for HAMi may carry them; gpuwire does not read them, and says so.
HAMI_UNREAD = {
    "nvidia.com/vgpu-mode": "HAMi's choice of hami-core or MIG sharing",
    "nvidia.com/numa-bind": "HAMi's NUMA binding of a container's GPUs",
    "hami.io/gpu-scheduler-policy": "HAMi's GPU scheduling policy",
    "hami.io/node-scheduler-policy": "HAMi's node scheduling policy",
    "hami.io/device-scoring-weights": "HAMi's device scoring weights",
}
# HAMi's resource names, which belong in a container's resources, not in annotations
MISPLACED = {
    "nvidia.com/gpu": COUNT,
    HAMI_MEMORY: MEMORY_LIMIT,
    HAMI_MEMORY_PERCENT: MEMORY_LIMIT,
    HAMI_CORES: CORES_LIMIT,
}
_PREFIXES = ("gpuwire.io", "nvidia.com")
_LOWER = {k.lower(): k for k in KNOWN}
_NAMES = [k.removeprefix(PREFIX) for k in KNOWN if k.startswith(PREFIX)]


@dataclass(frozen=True)
class Unknown:
    """An annotation key gpuwire does not read that looks meant for it: a typo, a case
    variant, a HAMi key it does not read, a resource name written as an annotation."""

    key: str
    suggestion: str | None  # the known key it most likely means
    unread: str | None = None  # what HAMi reads it for, where it is HAMi's

    @property
    def typo(self) -> bool:
        """Whether it is a mistake (the policy's unknownAnnotations decides), not a key of
        HAMi's that gpuwire leaves alone."""
        return self.unread is None

    def __str__(self) -> str:
        if self.unread is not None:
            return f"{self.key} is {self.unread}, which gpuwire does not read"
        if self.key in MISPLACED:
            return (
                f"{self.key} is a resource (a container's resources.limits), not an "
                f"annotation: did you mean {self.suggestion}?"
            )
        if self.suggestion is not None:
            return f"unknown annotation {self.key}: did you mean {self.suggestion}?"
        return f"unknown annotation {self.key}; gpuwire reads {PREFIX}{{{','.join(_NAMES)}}}"


def _close(text: str, candidates: Iterable[str], cutoff: float) -> str | None:
    found = difflib.get_close_matches(text, list(candidates), n=1, cutoff=cutoff)
    return found[0] if found else None


def _suspect(key: str) -> Unknown | None:
    """What `key` (not a known one) is, where it looks meant for gpuwire; None otherwise."""
    lower = key.lower()
    if lower in _LOWER:  # a case variant: GPU-Model
        return Unknown(key, _LOWER[lower])
    if key in HAMI_UNREAD:
        return Unknown(key, None, HAMI_UNREAD[key])
    if key in MISPLACED:
        return Unknown(key, MISPLACED[key])
    prefix, slash, _ = lower.partition("/")
    if not slash:
        return None
    if prefix == PREFIX[:-1]:  # gpuwire's own: anything unknown there is a mistake
        name = _close(lower.removeprefix(PREFIX), _NAMES, 0.6)
        return Unknown(key, PREFIX + name if name else None)
    if prefix in _PREFIXES or _close(prefix, _PREFIXES, 0.8):  # nvidia.com, gpuwire.oi, …
        near = _close(lower, _LOWER, 0.85)
        if near is not None:
            return Unknown(key, _LOWER[near])
    return None


@functools.lru_cache(maxsize=1024)
def _unknown(keys: tuple[str, ...]) -> tuple[Unknown, ...]:
    """Memoized by the pod's annotation keys: a Deployment's pods all carry the same."""
    found = (_suspect(k) for k in keys if k not in _KNOWN)
    return tuple(sorted((u for u in found if u is not None), key=lambda u: u.key))


def unknown(annotations: Mapping[str, str]) -> tuple[Unknown, ...]:
    """The keys of `annotations` gpuwire does not read that look meant for it: every unknown
    `gpuwire.io/` key, and near misses (case variants, a letter off, another prefix) of
    gpuwire's and HAMi's keys, each with the key it most likely means; HAMi's keys that
    gpuwire does not read; HAMi's resource names written as annotations."""
    return _unknown(tuple(annotations))
