"""HAMi's resource names → gpuwire's limits, so a pod written for HAMi works unchanged.

HAMi (Project-HAMi/HAMi v2.10.0, `pkg/device/nvidia/device.go`, `GenerateResourceRequests`
and `mutateContainerResource`; its docs' `userguide/configure.md`) reads, per container,
limits first, then requests:

* `nvidia.com/gpumem`: device memory per GPU, in **MiB**, a whole number (0: not asked);
* `nvidia.com/gpumem-percentage`: a share of each GPU's memory, 0–100 (0: not asked); read
  only where `gpumem` is not (its docs: not to be used with it);
* `nvidia.com/gpucores`: a share of the GPU's SMs, 0–100 (above 100 taken as 100; 100: the
  whole GPU, 0: not asked);
* `nvidia.com/priority`: a task priority for HAMi-core, which gpuwire does not set;

and where a container asks for any of the first three without `nvidia.com/gpu`, its webhook
adds `nvidia.com/gpu: 1` (`defaultGPUNum`). Without HAMi's device plugin nothing advertises
these resources, so a pod that keeps them stays Pending: gpuwire takes them out of the
container's resources (adding `nvidia.com/gpu: 1` as HAMi does) and holds what they ask as
`gpuwire.io/gpu-memory-limit` and `gpuwire.io/gpu-cores-limit` would (the policy's limit
profile: HAMi-core's own variables with `hami`). What it cannot hold is denied with the fix:
a priority, a size with a unit (HAMi would read `10Gi` as 10737418240 MiB), GPU containers
of one pod asking different limits (gpuwire's limits are the pod's). A near miss of these
names (`nvidia.com/gpucore`, `nvidia.com/gpumemory`) would keep the pod Pending as surely:
`near_misses` says which was meant, and the policy's `unknownAnnotations` decides as it does
for an annotation's typo.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from gpuwire import annotations as keys
from gpuwire import nvidia, quantity
from gpuwire.annotations import MemoryLimit
from webhook.patch import Op, pointer
from webhook.pod import SECTIONS, Container, Pod

MEMORY = keys.HAMI_MEMORY
MEMORY_PERCENT = keys.HAMI_MEMORY_PERCENT
CORES = keys.HAMI_CORES
PRIORITY = keys.HAMI_PRIORITY
RESOURCES = (MEMORY, MEMORY_PERCENT, CORES, PRIORITY)
_VENDOR = "nvidia.com/"
_NAMES = {name.removeprefix(_VENDOR): name for name in RESOURCES}


class HamiError(ValueError):
    """HAMi resources gpuwire cannot hold; the message names them and says what to write."""


@dataclass(frozen=True)
class Asked:
    """What one container's HAMi resources ask, as gpuwire's limits, and where each comes
    from as written (`nvidia.com/gpumem: 10240`), for messages."""

    memory: MemoryLimit | None
    cores: int | None
    said: str  # all of them
    memory_said: str = ""
    cores_said: str = ""


@dataclass(frozen=True)
class Translated:
    """The pod with HAMi's resources taken out (and `nvidia.com/gpu: 1` where HAMi adds it),
    the patch ops that make it so, and the limits they asked."""

    pod: dict[str, Any]
    ops: tuple[Op, ...]
    asked: Asked


def _number(container: str, name: str, value: object) -> int:
    text = str(value).strip()
    if text.isascii() and text.isdigit():
        return int(text)
    where = f"container {container!r}: {name}: {text!r}"
    if name != MEMORY:
        raise HamiError(f"{where} is not a whole number; accepted: a percentage, 0 to 100")
    try:  # a Kubernetes quantity: HAMi takes its value, in bytes, for a number of MiB
        mib = f"{quantity.mib_at_most(text)}"
    except quantity.QuantityError:
        mib = "a whole number"
    raise HamiError(
        f"{where}: HAMi reads this resource as a whole number of MiB, so a unit would make it "
        f"bytes taken for MiB; accepted: {name}: {mib}, or {keys.MEMORY_LIMIT}: {text}"
    )


def _written(c: Container) -> dict[str, object]:
    """HAMi's resources of `c`, each from its limits, else its requests (as HAMi reads)."""
    resources = c.raw.get("resources") or {}
    found: dict[str, object] = {}
    for section in reversed(SECTIONS):  # limits last: they win
        held = resources.get(section) or {}
        found.update({n: held[n] for n in RESOURCES if n in held})
    return found


def asked(c: Container) -> Asked | None:
    """The limits `c`'s HAMi resources ask (None: it has none); HamiError for what gpuwire
    cannot hold."""
    written = _written(c)
    if not written:
        return None
    said = ", ".join(f"{n}: {v}" for n, v in sorted(written.items()))
    if PRIORITY in written:
        raise HamiError(
            f"container {c.name!r}: {PRIORITY}: {written[PRIORITY]}: gpuwire sets no HAMi-core "
            f"task priority; accepted: the container without {PRIORITY}"
        )
    memory, memory_said = None, ""
    mib = _number(c.name, MEMORY, written[MEMORY]) if MEMORY in written else 0
    if mib:
        memory, memory_said = MemoryLimit(mib=mib), f"{MEMORY}: {written[MEMORY]}"
    elif MEMORY_PERCENT in written:
        percent = _number(c.name, MEMORY_PERCENT, written[MEMORY_PERCENT])
        if percent > 100:
            raise HamiError(
                f"container {c.name!r}: {MEMORY_PERCENT}: {percent} is more than the whole "
                "GPU; accepted: a percentage, 0 to 100"
            )
        memory = MemoryLimit(percent=percent) if percent else None
        memory_said = f"{MEMORY_PERCENT}: {percent}"
    cores = min(_number(c.name, CORES, written[CORES]), 100) if CORES in written else 0
    cores_said = f"{CORES}: {written[CORES]}" if CORES in written else ""
    return Asked(memory, cores if 0 < cores < 100 else None, said, memory_said, cores_said)


def _meant(name: str, advertised: Collection[str]) -> str | None:
    """The HAMi resource name `name` most likely means (a case variant, a letter off, another
    spelling of the prefix); None for HAMi's own, one the cluster advertises, or any other."""
    if name in RESOURCES or name in advertised or name == nvidia.RESOURCE:
        return None
    prefix, slash, rest = name.lower().partition("/")
    vendor = _VENDOR.removesuffix("/")
    if not slash or not difflib.get_close_matches(prefix, [vendor], n=1, cutoff=0.8):
        return None
    found = difflib.get_close_matches(rest, list(_NAMES), n=1, cutoff=0.75)
    return _NAMES[found[0]] if found else None


def near_misses(pod: Pod, advertised: Collection[str]) -> list[str]:
    """The resources of the pod's containers that look like HAMi's and are not (which no
    node advertises: the pod would stay Pending), each with the name meant; `advertised`:
    the cluster's device plugins' resources, which are never one."""
    found: dict[tuple[str, str], str] = {}
    for c in pod.containers:
        resources = c.raw.get("resources") or {}
        for section in SECTIONS:
            for name, value in (resources.get(section) or {}).items():
                meant = _meant(str(name), advertised)
                if meant is not None:
                    found.setdefault(
                        (c.name, name),
                        f"container {c.name!r}: {name}: {value}: unknown resource, which no "
                        f"node advertises (the pod would stay Pending): did you mean {meant}?",
                    )
    return list(found.values())


def _ops(c: Container, pod: dict[str, Any]) -> list[Op]:
    """Ops taking HAMi's resources out of `c` (in `pod`, the copy made to match) and adding
    `nvidia.com/gpu: 1` to its limits where it asks for no GPU count, as HAMi's webhook does."""
    resources = c.raw.get("resources") or {}
    copied = _at(pod, c)["resources"]
    ops: list[Op] = []
    for section in SECTIONS:
        held = resources.get(section) or {}
        for name in RESOURCES:
            if name in held:
                ops.append({"op": "remove", "path": pointer(c.path, "resources", section, name)})
                del copied[section][name]
    if c.gpus is None and c.mig is None:
        if isinstance(resources.get("limits"), dict):
            path = pointer(c.path, "resources", "limits", nvidia.RESOURCE)
            ops.append({"op": "add", "path": path, "value": "1"})
        else:
            ops.append({"op": "add", "path": pointer(c.path, "resources", "limits"),
                        "value": {nvidia.RESOURCE: "1"}})  # fmt: skip
        copied.setdefault("limits", {})[nvidia.RESOURCE] = "1"
    return ops


def _at(pod: dict[str, Any], c: Container) -> dict[str, Any]:
    found: dict[str, Any] = pod["spec"][c.field][c.position]
    return found


def translate(pod: Pod) -> Translated | None:
    """The pod as gpuwire reads HAMi's resources (None where it has none); HamiError for
    what it cannot hold, containers asking different limits included."""
    found = {c.name: (c, a) for c in pod.containers if c.hami and (a := asked(c)) is not None}
    if not found:
        return None
    wanted = {(a.memory, a.cores) for _, a in found.values()}
    others = [c.name for c in pod.containers if c.gpus and c.name not in found]
    if len(wanted) > 1 or others:
        each = "; ".join(f"container {n!r}: {a.said}" for n, (_, a) in found.items())
        each += "".join(f"; container {n!r}: {nvidia.RESOURCE} alone" for n in others)
        raise HamiError(
            f"HAMi's resources ask different limits of this pod's GPU containers ({each}); "
            "gpuwire holds one memory and cores limit for every GPU container of a pod; "
            "accepted: the same nvidia.com/gpumem, gpumem-percentage and gpucores on each, "
            f"or {keys.MEMORY_LIMIT} and {keys.CORES_LIMIT} (with {keys.CONTAINERS} naming "
            "the containers that get GPUs)"
        )
    raw: dict[str, Any] = copy.deepcopy(dict(pod.raw))
    ops = [op for c, _ in found.values() for op in _ops(c, raw)]
    first = next(iter(found.values()))[1]
    return Translated(raw, tuple(ops), first)


def merged(request: keys.GpuRequest, asked: Asked) -> keys.GpuRequest:
    """The pod's request with the limits HAMi's resources ask; HamiError where its
    annotations ask others."""
    given: dict[str, str] = dict(request.given)
    fields: dict[str, Any] = {}
    for key, mine, theirs, source in (
        (keys.MEMORY_LIMIT, asked.memory, request.memory_limit, asked.memory_said),
        (keys.CORES_LIMIT, asked.cores, request.cores_limit, asked.cores_said),
    ):
        if mine is None:
            continue
        if theirs is not None and theirs != mine:
            raise HamiError(
                f"{key}: {request.given[key]!r} disagrees with the GPU containers' {source}; "
                "accepted: one of them, or both saying the same"
            )
        given.setdefault(key, f"{_as_written(mine)} (HAMi's {source})")
        fields["memory_limit" if key == keys.MEMORY_LIMIT else "cores_limit"] = mine
    return replace(request, **fields, given=given)


def _as_written(limit: MemoryLimit | int) -> str:
    """A limit as its annotation would say it."""
    if isinstance(limit, int):
        return f"{limit}%"
    return f"{limit.percent}%" if limit.percent is not None else f"{limit.mib}Mi"
