"""A read-only view of the parts of a Pod the mutation reads, with their shapes checked.

The pod arrives as untrusted JSON. Every field the webhook reads is checked here, so a
malformed pod becomes one clear 400 naming the field, never a TypeError deep in the mutation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwire import nvidia
from gpuwire.annotations import HAMI_RESOURCES
from gpuwire.vendor import NVIDIA

CONTAINER_LISTS = ("initContainers", "containers")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class MalformedPod(ValueError):
    """A pod field of the wrong shape."""


def _wrong(value: object, where: str, wanted: str) -> MalformedPod:
    return MalformedPod(f"{where} is {type(value).__name__}, not {wanted}")


# Each takes the field's path in two parts, joined only for an error message.
def _mapping(value: object, where: str, field: str = "") -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):  # decoded JSON: objects are dicts
        raise _wrong(value, where + field, "an object")
    return value


def _list(value: object, where: str, field: str = "") -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _wrong(value, where + field, "a list")
    return value


def _str(value: object, where: str, field: str = "") -> str:
    if not isinstance(value, str):
        raise _wrong(value, where + field, "a string")
    return value


@dataclass(frozen=True, slots=True)
class Container:
    """One container. Env entries are indexed by name up front; a value is checked when read,
    as the webhook reads only its own few variables (the API server validates the rest)."""

    field: str  # "containers" or "initContainers"
    position: int  # in that list
    name: str
    env: list[dict[str, Any]]
    named: Mapping[str, list[int]]  # env positions by name, in order
    gpus: int | None  # the nvidia.com/gpu resource (limits, else requests), if any
    raw: Mapping[str, Any]
    mig: tuple[str, int] | None = None  # a nvidia.com/mig-<profile> resource and its count
    claims: tuple[str, ...] = ()  # resources.claims: the pod's claim entries it uses
    hami: bool = False  # it names HAMi's resources (nvidia.com/gpumem, …): webhook/hami.py
    # resources.limits and .requests, their shapes checked (quantities are read on use)
    quantities: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})

    @property
    def path(self) -> str:
        return f"/spec/{self.field}/{self.position}"

    @property
    def has_env(self) -> bool:
        return self.raw.get("env") is not None

    def at(self, position: int) -> str | None:
        """The value of the env entry at `position`; None when it comes from valueFrom."""
        entry = self.env[position]
        value = entry.get("value")
        if value is None:
            return None if "valueFrom" in entry else ""
        if not isinstance(value, str):
            raise _wrong(
                value, f"spec.{self.field}[{self.position}].env[{position}].value", "a string"
            )
        return value

    def value(self, name: str) -> str | None:
        """The env value in effect (the last entry of that name wins), None if unset."""
        found = self.named.get(name)
        return self.at(found[-1]) if found else None

    def sets(self, name: str) -> bool:
        return name in self.named

    def values(self) -> Mapping[str, str]:
        """Literal env values in effect, by name (valueFrom entries left out), read on use."""
        return _Values(self)

    def count_of(self, resource: str) -> int | None:
        """How many of an extended resource it asks for (limits, else requests), if any."""
        found = _count(self.quantities, f"spec.{self.field}[{self.position}]", resource)
        return found[1] if found else None


class _Values(Mapping[str, str]):
    def __init__(self, container: Container) -> None:
        self.container = container

    def __getitem__(self, name: str) -> str:
        value = self.container.value(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (n for n in self.container.named if self.container.value(n) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _env(raw: object, where: str) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """The env list and its positions by name (the loop every admission runs per entry)."""
    entries = _list(raw, where, ".env")
    named: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise _wrong(e, f"{where}.env[{i}]", "an object")
        name = e.get("name")
        if not isinstance(name, str):
            raise _wrong(name, f"{where}.env[{i}].name", "a string")
        if name in named:
            named[name].append(i)
        else:
            named[name] = [i]
    return entries, named


def _count(
    quantities: tuple[Mapping[str, Any], Mapping[str, Any]], where: str, wanted: str
) -> tuple[str, int] | None:
    """The first resource named `wanted` (or, ending in `-`, starting so) in the limits, else
    the requests (`quantities`), with its count."""
    prefix = wanted.endswith("-")
    for i, quantity in enumerate(quantities):
        if not prefix:  # a lookup, not a pass over every resource the container names
            if wanted not in quantity:
                continue
            name = wanted
        else:
            for name in quantity:  # the first that starts so
                if str(name).startswith(wanted):
                    break
            else:
                continue
        text = str(quantity[name]).strip()
        if not (text.isascii() and text.isdigit()):
            raise MalformedPod(
                f"{where}.resources.{SECTIONS[i]}[{name}] is {text!r}, not a whole number"
            )
        return str(name), int(text)
    return None


# The resource a pod asks for GPUs by where it names no model (`Container.gpus`): NVIDIA's,
# as GPU pods are written, and what the webhook renames to the resource that lists the model
# asked for, another vendor's included (`webhook.placement`).
GPU_RESOURCE = NVIDIA.resource
MIG_RESOURCE_PREFIX = nvidia.LABEL_PREFIX + "mig-"
SECTIONS = ("limits", "requests")


def _container(raw: object, field: str, index: int) -> Container:
    where = f"spec.{field}[{index}]"
    body = _mapping(raw, where)
    env, named = _env(body.get("env"), where)
    name = _str(body.get("name"), where, ".name")
    resources = _mapping(body.get("resources"), where, ".resources")
    quantities = (
        _mapping(resources.get("limits"), where, ".resources.limits"),
        _mapping(resources.get("requests"), where, ".resources.requests"),
    )
    gpus = _count(quantities, where, GPU_RESOURCE)
    mig = _count(quantities, where, MIG_RESOURCE_PREFIX)
    count = None if gpus is None else gpus[1]
    listed = _list(resources.get("claims"), where, ".resources.claims")
    claims = (
        tuple(
            _str(
                _mapping(c, f"{where}.resources.claims[{i}]").get("name"),
                where,
                f".resources.claims[{i}].name",
            )
            for i, c in enumerate(listed)
        )
        if listed
        else ()
    )
    hami = not (
        HAMI_RESOURCES.isdisjoint(quantities[0]) and HAMI_RESOURCES.isdisjoint(quantities[1])
    )
    return Container(field, index, name, env, named, count, body, mig, claims, hami, quantities)


def _resource_claims(spec: Mapping[str, Any]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for i, entry in enumerate(_list(spec.get("resourceClaims"), "spec", ".resourceClaims")):
        where = f"spec.resourceClaims[{i}]"
        body = _mapping(entry, where)
        template = body.get("resourceClaimTemplateName")
        found[_str(body.get("name"), where, ".name")] = (
            None if template is None else _str(template, where, ".resourceClaimTemplateName")
        )
    return found


@dataclass(frozen=True, slots=True)
class Pod:
    raw: Mapping[str, Any]
    annotations: Mapping[str, str]
    containers: tuple[Container, ...]  # init containers first, then app containers
    spec: Mapping[str, Any]
    # spec.resourceClaims: entry name → the template it is made from (None: a claim by name)
    resource_claims: Mapping[str, str | None]

    @classmethod
    def read(cls, raw: object) -> Pod:
        pod = _mapping(raw, "object")
        metadata = _mapping(pod.get("metadata"), "metadata")
        annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
        for key, value in annotations.items():
            if not isinstance(value, str):
                raise _wrong(value, f"metadata.annotations[{key}]", "a string")
        spec = _mapping(pod.get("spec"), "spec")
        containers = [
            _container(raw_container, field, i)
            for field in CONTAINER_LISTS
            for i, raw_container in enumerate(_list(spec.get(field), "spec.", field))
        ]
        if not spec.get("containers"):
            raise MalformedPod("spec.containers is empty: a pod needs at least one container")
        return cls(pod, annotations, tuple(containers), spec, _resource_claims(spec))

    @property
    def mirror(self) -> bool:
        return MIRROR_ANNOTATION in self.annotations

    @property
    def ephemeral_containers(self) -> tuple[Container, ...]:
        """spec.ephemeralContainers, which the `pods/ephemeralcontainers` subresource adds to
        a running pod (`kubectl debug`)."""
        found = _list(self.spec.get("ephemeralContainers"), "spec.", "ephemeralContainers")
        return tuple(_container(raw, "ephemeralContainers", i) for i, raw in enumerate(found))

    @property
    def app_containers(self) -> tuple[Container, ...]:
        return tuple(c for c in self.containers if c.field == "containers")

    def named(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)
