"""A read-only view of the parts of a Pod the mutation reads, with their shapes checked.

The pod arrives as untrusted JSON. Every field the webhook reads is checked here, so a
malformed pod becomes one clear 400 naming the field, never a TypeError deep in the mutation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwire import nvidia

CONTAINER_LISTS = ("initContainers", "containers")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class MalformedPod(ValueError):
    """A pod field of the wrong shape."""


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedPod(f"{where} is {type(value).__name__}, not an object")
    return value


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(f"{where} is {type(value).__name__}, not a list")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedPod(f"{where} is {type(value).__name__}, not a string")
    return value


@dataclass(frozen=True)
class EnvVar:
    index: int
    name: str
    value: str | None  # None: set through valueFrom, unknown at admission


@dataclass(frozen=True)
class Container:
    field: str  # "containers" or "initContainers"
    index: int
    name: str
    env: tuple[EnvVar, ...]
    has_env: bool
    resources: Mapping[str, Any]
    raw: Mapping[str, Any]

    @property
    def path(self) -> str:
        return f"/spec/{self.field}/{self.index}"

    @property
    def where(self) -> str:
        return f"spec.{self.field}[{self.index}]"

    def value(self, name: str) -> str | None:
        """The env value in effect (the last entry of that name wins), None if unset."""
        found = [e for e in self.env if e.name == name]
        return found[-1].value if found else None

    def sets(self, name: str) -> bool:
        return any(e.name == name for e in self.env)

    def values(self) -> dict[str, str]:
        """Literal env values in effect, by name (valueFrom entries left out)."""
        return {e.name: e.value for e in self.env if e.value is not None}

    def gpu_resource(self) -> int | None:
        """The `nvidia.com/gpu` count from limits (else requests), None if neither has one."""
        for section in ("limits", "requests"):
            quantity = _mapping(self.resources.get(section), f"{self.where}.resources.{section}")
            if nvidia.RESOURCE in quantity:
                text = str(quantity[nvidia.RESOURCE]).strip()
                if not (text.isascii() and text.isdigit()):
                    raise MalformedPod(
                        f"{self.where}.resources.{section}[{nvidia.RESOURCE}] is {text!r}, "
                        "not a whole number"
                    )
                return int(text)
        return None


def _container(raw: object, field: str, index: int) -> Container:
    where = f"spec.{field}[{index}]"
    body = _mapping(raw, where)
    env: list[EnvVar] = []
    for i, entry in enumerate(_list(body.get("env"), f"{where}.env")):
        e = _mapping(entry, f"{where}.env[{i}]")
        name = _str(e.get("name"), f"{where}.env[{i}].name")
        value = e.get("value")
        if value is None and "valueFrom" not in e:
            value = ""
        env.append(
            EnvVar(i, name, None if value is None else _str(value, f"{where}.env[{i}].value"))
        )
    resources = _mapping(body.get("resources"), f"{where}.resources")
    return Container(
        field=field,
        index=index,
        name=_str(body.get("name"), f"{where}.name"),
        env=tuple(env),
        has_env=body.get("env") is not None,
        resources=resources,
        raw=body,
    )


@dataclass(frozen=True)
class Pod:
    raw: Mapping[str, Any]
    annotations: Mapping[str, str]
    containers: tuple[Container, ...]  # init containers first, then app containers
    spec: Mapping[str, Any]

    @classmethod
    def read(cls, raw: object) -> Pod:
        pod = _mapping(raw, "object")
        metadata = _mapping(pod.get("metadata"), "metadata")
        annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
        for key, value in annotations.items():
            _str(value, f"metadata.annotations[{key}]")
        spec = _mapping(pod.get("spec"), "spec")
        containers = tuple(
            _container(raw_container, field, i)
            for field in CONTAINER_LISTS
            for i, raw_container in enumerate(_list(spec.get(field), f"spec.{field}"))
        )
        if not any(c.field == "containers" for c in containers):
            raise MalformedPod("spec.containers is empty: a pod needs at least one container")
        return cls(pod, annotations, containers, spec)

    @property
    def mirror(self) -> bool:
        return MIRROR_ANNOTATION in self.annotations

    @property
    def app_containers(self) -> tuple[Container, ...]:
        return tuple(c for c in self.containers if c.field == "containers")

    def named(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)
