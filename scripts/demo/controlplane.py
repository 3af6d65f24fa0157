"""What the control plane does with a pod before a node sees it: admission, storage, scheduling.

The kube-apiserver stand-in stores objects but runs no admission chain and there is no
scheduler, so these steps are done here the way those components do them: the AdmissionReview
goes to the webhook over TLS, checked against its CA (the caBundle), and the JSONPatch that
comes back is applied; the pod is stored with the API server's uid; the scheduler's filters
that a GPU pod meets (node selector, the RuntimeClass's scheduling selector, required node
affinity, extended resources) decide whether it binds to the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from gpuwire.annotations import KNOWN
from scripts.demo.cluster import Cluster
from webhook.review import decode_patch, request_for

Obj = dict[str, Any]


@dataclass(frozen=True)
class Admission:
    """A pod as submitted, and the webhook's answer."""

    pod: Obj
    allowed: bool
    patch: list[Obj] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code: int = 200
    message: str = ""

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace", "default"))

    @property
    def asked(self) -> dict[str, str]:
        """The GPU annotations and extended-resource limits the pod asks with."""
        given = self.pod["metadata"].get("annotations") or {}
        out = {k: v for k, v in given.items() if k in KNOWN}
        for container in self.pod["spec"]["containers"]:
            limits = (container.get("resources") or {}).get("limits") or {}
            out |= {f"{container['name']}: {k}": str(v) for k, v in limits.items() if "/" in k}
        return out

    def admitted(self) -> Obj:
        """The pod as the API server stores it: the patch applied."""
        assert self.allowed, "a denied pod is not stored"
        admitted: Obj = jsonpatch.apply_patch(self.pod, self.patch)  # a patched copy
        return admitted


def review(cluster: Cluster, pod: Obj) -> Admission:
    """Send `pod` to the webhook as the API server does on create (AdmissionReview v1)."""
    namespace = pod["metadata"].get("namespace", "default")
    with cluster.webhook() as http:
        reply = http.post("/mutate", json=request_for(pod, namespace, uid=pod["metadata"]["name"]))
    reply.raise_for_status()
    body = reply.json()
    answer = body["response"]
    status = answer.get("status", {})
    return Admission(
        pod=pod,
        allowed=answer["allowed"],
        patch=decode_patch(body),
        warnings=answer.get("warnings", []),
        code=status.get("code", 200),
        message=status.get("message", ""),
    )


def _holds(requirement: Obj, labels: dict[str, str]) -> bool:
    """One node selector requirement against a node's labels (the scheduler's semantics)."""
    key, op, values = requirement["key"], requirement["operator"], requirement.get("values", [])
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if key not in labels or not labels[key].lstrip("-").isdigit():
        return False
    return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])


def unfit(pod: Obj, node: Obj, runtime_class: Obj | None) -> str:
    """Why the scheduler would not bind `pod` to `node` ("" when it fits)."""
    labels = node["metadata"].get("labels", {})
    spec = pod["spec"]
    selector = {**spec.get("nodeSelector", {})}
    if runtime_class is not None:
        selector |= (runtime_class.get("scheduling") or {}).get("nodeSelector", {})
    missing = [f"{k}={v}" for k, v in selector.items() if labels.get(k) != v]
    if missing:
        return f"node selector {', '.join(missing)} does not match"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required and not any(
        all(_holds(r, labels) for r in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    ):
        return "required node affinity does not match"
    allocatable = node.get("status", {}).get("allocatable", {})
    for container in spec["containers"]:
        for name, count in ((container.get("resources") or {}).get("limits") or {}).items():
            if "/" in name and int(count) > int(allocatable.get(name, 0)):
                return f"Insufficient {name}"
    return ""


def create(cluster: Cluster, admission: Admission) -> tuple[Obj, str]:
    """Store the admitted pod and bind it to the node; the stored pod and, when it does not
    fit the node, why it stays Pending."""
    pod = cluster.api.put(admission.admitted())
    class_name = pod["spec"].get("runtimeClassName")
    runtime_class = cluster.api.get("runtimeclasses", class_name) if class_name else None
    reason = unfit(pod, cluster.node(), runtime_class)
    if not reason:
        pod["spec"]["nodeName"] = cluster.node()["metadata"]["name"]
        pod = cluster.api.put(pod)
    return pod, reason
