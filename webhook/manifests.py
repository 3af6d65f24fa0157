"""Manifests as people keep them → the pods the API server would be asked to create, and the
admitted pods put back: what `gpuwire mutate` checks offline.

A Pod is itself; a Deployment, StatefulSet, DaemonSet, ReplicaSet or Job makes its pods
from `spec.template`, a CronJob from `spec.jobTemplate.spec.template` (the kinds of
apps/v1 and batch/v1); a `List` (`kubectl get -o yaml`) holds its items. Every other kind
(a Service, a ConfigMap) makes no pod, and is left out, by name. A template's pod is what
its controller sends: the template's metadata and spec, in the workload's namespace, named
by `generateName` after the workload.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwire import grant

Obj = dict[str, Any]
# kind → the path of its pod template in the object
TEMPLATES: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
KINDS = ("Pod", *TEMPLATES)


class ManifestError(ValueError):
    """A document that names a workload kind but is not one (no template where it must be)."""


@dataclass(frozen=True)
class Workload:
    """One object of the file that makes pods, and the pod it makes."""

    kind: str
    name: str
    namespace: str | None  # as written; None: the command's default
    pod: Obj
    source: Obj  # the object as written

    @property
    def title(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    def admitted(self, pod: Obj) -> Obj:
        """The object as written with its pods made like `pod` (the admitted one)."""
        if self.kind == "Pod":
            return pod
        out = copy.deepcopy(self.source)
        template = _at(out, TEMPLATES[self.kind])
        meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k not in _MADE}
        if grant.POD_ANNOTATION in meta.get("annotations", {}):  # each pod gets its own
            meta["annotations"] = {
                k: v for k, v in meta["annotations"].items() if k != grant.POD_ANNOTATION
            }
        template["metadata"] = meta
        template["spec"] = pod["spec"]
        return out


# fields of the pod made here, not of the template it came from
_MADE = ("namespace", "generateName")


def _at(obj: Obj, path: tuple[str, ...]) -> Obj:
    found: Any = obj
    for key in path:
        found = found.get(key) if isinstance(found, dict) else None
    if not isinstance(found, dict):
        raise ManifestError(f"has no {'.'.join(path)} (the pod template of a {obj['kind']})")
    return found


def _pod_of(obj: Obj) -> Obj:
    kind = obj["kind"]
    if kind == "Pod":
        return obj
    template = _at(obj, TEMPLATES[kind])
    meta = obj.get("metadata") or {}
    pod_meta: Obj = copy.deepcopy(template.get("metadata") or {})
    pod_meta.setdefault("generateName", f"{meta.get('name', kind.lower())}-")
    if meta.get("namespace"):
        pod_meta["namespace"] = meta["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_meta,
        "spec": copy.deepcopy(template.get("spec")),
    }


def read(documents: Iterable[object]) -> tuple[list[Workload], list[str]]:
    """(the workloads of `documents`, in order; the objects left out, as `Kind name`).
    ManifestError names the document that claims a workload kind and is none."""
    found: list[Workload] = []
    skipped: list[str] = []
    queue = [d for d in documents if d is not None]
    for position, doc in enumerate(_flattened(queue), 1):
        if not isinstance(doc, Mapping):
            skipped.append(f"document {position} ({type(doc).__name__}, not an object)")
            continue
        obj = dict(doc)
        kind = str(obj.get("kind") or "")
        raw_meta = obj.get("metadata")
        meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        name = str(meta.get("name") or meta.get("generateName") or f"(document {position})")
        if kind not in KINDS:
            skipped.append(f"{kind or 'an object without kind'} {name}")
            continue
        try:
            pod = _pod_of(obj)
        except ManifestError as exc:
            raise ManifestError(f"{kind} {name} {exc}") from None
        namespace = meta.get("namespace")
        found.append(Workload(kind, name, str(namespace) if namespace else None, pod, obj))
    return found, skipped


def _flattened(documents: list[object]) -> Iterable[object]:
    """Documents, a `List`'s items in its place."""
    for doc in documents:
        items = doc.get("items") if isinstance(doc, Mapping) else None
        if (
            isinstance(doc, Mapping)
            and str(doc.get("kind", "")).endswith("List")
            and isinstance(items, list)
        ):
            yield from items
        else:
            yield doc
