"""Pod annotations → one typed GPU request.

The grammar is the user-facing contract (docs/annotations.md). Every value is checked here,
once, and every error names the annotation, the value and what is accepted. HAMi's four
selection annotations (reference ecosystem.md 1.4) are read as aliases, so pods written for
HAMi keep working. What a request means for a given pod, cluster and policy is decided in
`webhook/`; this module only knows the words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuwire import limits, nvidia, quantity

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
    HAMI_USE_TYPE,
    HAMI_NOUSE_TYPE,
    HAMI_USE_UUID,
    HAMI_NOUSE_UUID,
)

ACCEPTED = {
    MODEL: "comma-separated model names (case-insensitive substrings, e.g. A100,H100), "
    "each optionally prefixed with ! to exclude",
    MIN_MEMORY: quantity.ACCEPTED,
    COUNT: "all, none (driver files but no GPU), or a positive integer",
    UUID: "comma-separated GPU UUIDs as nvidia-smi -L prints them (GPU-xxxxxxxx-xxxx-…), "
    "each optionally prefixed with ! to exclude",
    CAPABILITIES: f"all, or a comma-separated subset of {', '.join(nvidia.CAPABILITIES)}",
    MEMORY_LIMIT: f"{quantity.ACCEPTED}, or a percentage of the GPU (1%–100%)",
    CORES_LIMIT: "a percentage of the GPU's SMs, 1–100 (e.g. 30 or 30%)",
    LIMIT_PROFILE: f"comma-separated profiles: {', '.join(limits.PROFILES)}",
    CONTAINERS: "comma-separated container names of this pod",
}
ACCEPTED[HAMI_USE_TYPE] = ACCEPTED[HAMI_NOUSE_TYPE] = "comma-separated model names"
ACCEPTED[HAMI_USE_UUID] = ACCEPTED[HAMI_NOUSE_UUID] = "comma-separated GPU UUIDs"

_MODEL_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*$")
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PERCENT = re.compile(r"^([0-9]{1,3})\s*%$")

Count = int | Literal["all", "none"]


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

    def resolve(self, gpu_mib: int | None) -> limits.Limits:
        """Both spellings, where the GPU's size (`gpu_mib`) makes the other one known."""
        if self.percent is not None:
            mib = gpu_mib * self.percent // 100 if gpu_mib else None
            return limits.Limits(memory_mib=mib, memory_fraction=self.percent / 100)
        fraction = min(1.0, self.mib / gpu_mib) if self.mib is not None and gpu_mib else None
        return limits.Limits(memory_mib=self.mib, memory_fraction=fraction)


def normalise_model(name: str) -> str:
    """Lower case, spaces as dashes: `A100 SXM4` and GFD's `NVIDIA-A100-SXM4-80GB` compare."""
    return "-".join(name.lower().split())


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
    given: Mapping[str, str] = field(default_factory=dict)  # annotation → raw value, as asked

    @property
    def asks(self) -> bool:
        """Whether the pod asks for a GPU at all (a profile alone asks for nothing)."""
        return any(k != LIMIT_PROFILE for k in self.given)

    @property
    def wants_limits(self) -> bool:
        return self.memory_limit is not None or self.cores_limit is not None

    def source(self, *keys: str) -> tuple[str, str]:
        """(annotation, value) as the user wrote it, for the first of `keys` given."""
        for key in keys:
            if key in self.given:
                return key, self.given[key]
        raise KeyError(keys)


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class _Parser:
    """Collects every problem instead of stopping at the first: one denial, every fix."""

    def __init__(self, annotations: Mapping[str, str]) -> None:
        self.given = {k: v for k, v in annotations.items() if k in KNOWN and v.strip()}
        self.problems: list[Problem] = []

    def fail(self, key: str, reason: str) -> None:
        self.problems.append(Problem(key, self.given[key], reason))

    def split(self, key: str, token: re.Pattern[str], what: str) -> tuple[list[str], list[str]]:
        """(included, excluded) tokens of a `!`-able list; bad tokens become problems."""
        included: list[str] = []
        excluded: list[str] = []
        for item in _items(self.given.get(key, "")):
            negated = item.startswith("!")
            word = item[1:].strip() if negated else item
            if not token.match(word):
                self.fail(key, f"has {item!r}, which is not {what}")
            else:
                (excluded if negated else included).append(word)
        return included, excluded

    def models(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        included, excluded = self.split(MODEL, _MODEL_TOKEN, "a model name")
        for alias, into in ((HAMI_USE_TYPE, included), (HAMI_NOUSE_TYPE, excluded)):
            words, _ = self.split(alias, _MODEL_TOKEN, "a model name")
            into.extend(words)
        inc = _unique(normalise_model(m) for m in included)
        exc = _unique(normalise_model(m) for m in excluded)
        both = sorted(set(inc) & set(exc))
        if both:
            key = MODEL if MODEL in self.given else HAMI_USE_TYPE
            self.fail(key, f"both asks for and excludes {', '.join(both)}")
        return inc, exc

    def uuids(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        included, excluded = self.split(UUID, _UUID, "a GPU UUID")
        for alias, into in ((HAMI_USE_UUID, included), (HAMI_NOUSE_UUID, excluded)):
            words, _ = self.split(alias, _UUID, "a GPU UUID")
            into.extend(words)
        inc, exc = _unique(included, key=str.lower), _unique(excluded, key=str.lower)
        both = sorted({u.lower() for u in inc} & {u.lower() for u in exc})
        if both:
            key = UUID if UUID in self.given else HAMI_USE_UUID
            self.fail(key, f"both asks for and excludes {', '.join(both)}")
        return inc, exc

    def count(self) -> Count | None:
        value = self.given.get(COUNT, "").strip().lower()
        if not value:
            return None
        if value in ("all", "none"):
            return "all" if value == "all" else "none"
        if value.isascii() and value.isdigit() and int(value) > 0:
            return int(value)
        self.fail(COUNT, "is not a GPU count")
        return None

    def min_memory(self) -> int | None:
        if MIN_MEMORY not in self.given:
            return None
        try:
            mib = quantity.mib_at_least(self.given[MIN_MEMORY])
        except quantity.QuantityError:
            self.fail(MIN_MEMORY, "is not a memory size")
            return None
        if mib <= 0:
            self.fail(MIN_MEMORY, "is not more than zero")
            return None
        return mib

    def capabilities(self) -> str | None:
        if CAPABILITIES not in self.given:
            return None
        value = self.given[CAPABILITIES]
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

    def memory_limit(self) -> MemoryLimit | None:
        text = self.given.get(MEMORY_LIMIT, "").strip()
        if not text:
            return None
        if text.endswith("%"):
            percent = self.percent(MEMORY_LIMIT, text)
            return MemoryLimit(percent=percent) if percent is not None else None
        try:
            mib = quantity.mib_at_most(text)
        except quantity.QuantityError:
            self.fail(MEMORY_LIMIT, "is neither a memory size nor a percentage")
            return None
        if mib <= 0:
            self.fail(MEMORY_LIMIT, "is less than 1 MiB")
            return None
        return MemoryLimit(mib=mib)

    def cores_limit(self) -> int | None:
        text = self.given.get(CORES_LIMIT, "").strip()
        if not text:
            return None
        return self.percent(CORES_LIMIT, text if text.endswith("%") else text + "%")

    def profiles(self) -> tuple[str, ...]:
        names = _unique(p.lower() for p in _items(self.given.get(LIMIT_PROFILE, "")))
        unknown = [n for n in names if n not in limits.PROFILES]
        if unknown:
            self.fail(LIMIT_PROFILE, f"names unknown profile {', '.join(unknown)}")
        return tuple(n for n in names if n in limits.PROFILES)

    def containers(self) -> tuple[str, ...]:
        names = _unique(_items(self.given.get(CONTAINERS, "")))
        bad = [n for n in names if not _CONTAINER_NAME.match(n)]
        if bad:
            self.fail(CONTAINERS, f"has {', '.join(bad)}, not a container name")
        return names

    def consistent(self, count: Count | None, uuids: tuple[str, ...]) -> None:
        """Explicit devices fix the count; a count that says otherwise is a mistake."""
        if not uuids or count is None:
            return
        if count != len(uuids):
            self.fail(COUNT, f"disagrees with the {len(uuids)} GPU(s) named by {UUID}")


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
    p = _Parser(annotations)
    models, excluded_models = p.models()
    uuids, excluded_uuids = p.uuids()
    count = p.count()
    p.consistent(count, uuids)
    request = GpuRequest(
        models=models,
        excluded_models=excluded_models,
        min_memory_mib=p.min_memory(),
        count=count,
        uuids=uuids,
        excluded_uuids=excluded_uuids,
        capabilities=p.capabilities(),
        memory_limit=p.memory_limit(),
        cores_limit=p.cores_limit(),
        profiles=p.profiles(),
        containers=p.containers(),
        given=dict(p.given),
    )
    if p.problems:
        raise AnnotationError(p.problems)
    return request


def unknown(annotations: Mapping[str, str]) -> list[str]:
    """`gpuwire.io/` keys this grammar does not know (typos, most likely)."""
    return sorted(k for k in annotations if k.startswith(PREFIX) and k not in KNOWN)
