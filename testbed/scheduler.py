"""The control plane's part between a stored pod and its node, for pods with ResourceClaims:
the resourceclaim controller and the kube-scheduler, as stand-ins over the kube-apiserver
stand-in's objects.

The controller (kube-controller-manager `pkg/controller/resourceclaim/controller.go`): for
each `spec.resourceClaims` entry made from a template, a ResourceClaim with `generateName`
`<pod>-<entry>-`, the template's labels and annotations and its spec, owned by the pod, and
annotated `resource.kubernetes.io/pod-claim-name`; its name goes into the pod's
`status.resourceClaimStatuses` (the only place it can be read from).

The scheduler, one cycle for one pod: nodes in name order; a node is filtered out by the
pod's node selector, required node affinity, `spec.unschedulable`, or an extended resource it
does not have allocatable (the NodeAffinity, NodeUnschedulable and NodeResourcesFit filters'
reasons), or by its claims (DynamicResources: an allocated claim whose node selector does
not take the node, or `testbed.allocator` finding no allocation there: "cannot allocate all
claims"). Of the nodes that pass, the one whose allocation took the earliest subrequests of
firstAvailable lists wins, as DynamicResources scores them from 1.35 (kubernetes/kubernetes
#134711; the raw score here is the sum of 8 minus each chosen subrequest's index, which ranks
nodes alike), the first by name among equals (other score plugins are left out). Binding
writes, as the DynamicResources plugin's PreBind does, each
claim's finalizer `resource.kubernetes.io/delete-protection`, its `status.allocation` and
`reservedFor`, then the pod's `nodeName` and `PodScheduled` condition. A pod no node takes
gets `PodScheduled=False`, reason `Unschedulable`, and the scheduler's message
`0/N nodes are available: <count> <reason>, ...` (reasons in text order; preemption left
out); an allocator error (a CEL error, a missing class) fails the attempt with its text.

Left out: the scheduling queue and retries (`schedule` is one attempt, called by the test or
the demo), scoring, preemption, pod affinity and topology spread, taints on nodes, resource
requests other than extended resources, DRA-backed extended resources, and deallocation
(the controller's part when a claim's last consumer goes).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.allocator import ALL_ON, AllocationError, Features, InUse, allocate
from testbed.apiserver import ALPHABET, ApiServer

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
FINALIZER = "resource.kubernetes.io/delete-protection"
CANNOT_ALLOCATE = "cannot allocate all claims"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE = "node(s) were unschedulable"
NOT_AVAILABLE = "resourceclaim not available on the node"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    node: str | None  # None: not scheduled
    message: str = ""  # why not

    @property
    def scheduled(self) -> bool:
        return self.node is not None


def _holds(requirement: Mapping[str, Any], value: str | None) -> bool:
    """One node selector requirement against a label's (or field's) value."""
    op, values = requirement["operator"], requirement.get("values") or []
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if value is None or not value.lstrip("-").isdigit():
        return False
    return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])


def selects(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    """Whether a NodeSelector (terms ORed, requirements ANDed) takes the node."""
    if not selector:
        return True
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        all(_holds(r, labels.get(r["key"])) for r in term.get("matchExpressions") or ())
        and all(_holds(r, fields.get(r["key"])) for r in term.get("matchFields") or ())
        for term in selector.get("nodeSelectorTerms") or ()
    )


def unfit(pod: Mapping[str, Any], node: Mapping[str, Any], runtime_class: Obj | None) -> str:
    """Why the node filters that a GPU pod meets, DRA's aside, reject `node` ("" if none)."""
    spec = pod["spec"]
    labels = node["metadata"].get("labels") or {}
    selector = dict(spec.get("nodeSelector") or {})
    if runtime_class is not None:
        selector |= (runtime_class.get("scheduling") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return AFFINITY
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    if not selects(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), node):
        return AFFINITY
    if (node.get("spec") or {}).get("unschedulable"):
        return UNSCHEDULABLE
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for container in spec["containers"]:
        for name, count in ((container.get("resources") or {}).get("limits") or {}).items():
            if "/" in name and int(count) > int(allocatable.get(name, 0)):
                return f"Insufficient {name}"
    return ""


def _score(claims: Sequence[Obj], allocations: Sequence[Obj]) -> int:
    """How early in their firstAvailable lists the chosen subrequests are: 8 (the most a
    list holds) minus each one's index, summed."""
    score = 0
    for claim, allocation in zip(claims, allocations, strict=True):
        chosen = {r["request"] for r in allocation["devices"]["results"]}
        for request in claim["spec"]["devices"]["requests"]:
            names = [
                f"{request['name']}/{sub['name']}" for sub in request.get("firstAvailable") or ()
            ]
            score += sum(8 - i for i, name in enumerate(names) if name in chosen)
    return score


class Scheduler:
    """One scheduling attempt per call, over the API server stand-in's objects."""

    def __init__(self, api: ApiServer, features: Features = ALL_ON) -> None:
        self.api = api
        self.features = features

    # --- the resourceclaim controller

    def claims(self, pod: Obj) -> list[Obj] | str:
        """The pod's claims in entry order, generated from their templates where needed;
        or why the pod cannot have them yet."""
        meta = pod["metadata"]
        namespace = meta["namespace"]
        status = pod.setdefault("status", {})
        generated = {
            s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()
        }
        found = []
        for entry in pod["spec"].get("resourceClaims") or ():
            name = entry.get("resourceClaimName") or generated.get(entry["name"])
            if name is None:
                template = self.api.get(
                    "resourceclaimtemplates", entry["resourceClaimTemplateName"], namespace
                )
                if template is None:
                    return (
                        f'resourceclaimtemplate "{entry["resourceClaimTemplateName"]}" not found '
                        f"for claim {entry['name']}"
                    )
                name = self._generate(pod, entry["name"], template)
                status.setdefault("resourceClaimStatuses", []).append(
                    {"name": entry["name"], "resourceClaimName": name}
                )
                self.api.put(pod)
            claim = self.api.get("resourceclaims", name, namespace)
            if claim is None:
                return f'resourceclaim "{name}" not found'
            found.append(claim)
        return found

    def _generate(self, pod: Obj, entry: str, template: Obj) -> str:
        meta = pod["metadata"]
        prefix = f"{meta['name']}-{entry}"
        if len(prefix) > 57:  # both parts shortened alike, as the controller does
            half = 28
            prefix = f"{meta['name'][:half]}-{entry[:half]}"
        inner = template["spec"].get("metadata") or {}
        owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": f"{prefix}-{''.join(random.choices(ALPHABET, k=5))}",  # generateName's
                "namespace": meta["namespace"],
                "labels": dict(inner.get("labels") or {}),
                "annotations": {**(inner.get("annotations") or {}), POD_CLAIM_NAME: entry},
                "ownerReferences": [owner],
            },
            "spec": template["spec"]["spec"],
        }
        return str(self.api.put(claim)["metadata"]["name"])

    # --- the scheduler

    def schedule(self, namespace: str, name: str) -> Decision:
        pod = self.api.get("pods", name, namespace)
        assert pod is not None, f"pod {namespace}/{name} is not in the API server"
        claims = self.claims(pod)
        if isinstance(claims, str):
            return self._pending(pod, claims)
        nodes = sorted(self.api.objects("nodes"), key=lambda n: n["metadata"]["name"])
        class_name = pod["spec"].get("runtimeClassName")
        runtime_class = self.api.get("runtimeclasses", class_name) if class_name else None
        classes = {c["metadata"]["name"]: c for c in self.api.objects("deviceclasses")}
        slices = self.api.objects("resourceslices")
        mine = {c["metadata"]["uid"] for c in claims}
        in_use = InUse.of(
            c for c in self.api.objects("resourceclaims") if c["metadata"]["uid"] not in mine
        )
        pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        reasons: Counter[str] = Counter()
        feasible: list[tuple[int, str, list[Obj]]] = []
        for node in nodes:
            node_name = node["metadata"]["name"]
            reason = unfit(pod, node, runtime_class)
            if not reason and not all(
                selects(c["status"]["allocation"].get("nodeSelector"), node) for c in allocated
            ):
                reason = NOT_AVAILABLE
            if not reason:
                try:
                    found = allocate(node_name, pending, classes, slices, in_use, self.features)
                except AllocationError as exc:
                    return self._pending(pod, str(exc))
                if found is not None:
                    feasible.append((_score(pending, found), node_name, found))
                    continue
                reason = CANNOT_ALLOCATE
            reasons[reason] += 1
        if feasible:
            _, node_name, found = min(feasible, key=lambda f: (-f[0], f[1]))
            uids = [c["metadata"]["uid"] for c in pending]
            return self._bind(pod, node_name, claims, dict(zip(uids, found, strict=True)))
        listed = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        return self._pending(pod, f"0/{len(nodes)} nodes are available: {listed}.")

    def _bind(
        self, pod: Obj, node: str, claims: Sequence[Obj], found: Mapping[str, Obj]
    ) -> Decision:
        meta = pod["metadata"]
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        for claim in claims:
            status = claim.setdefault("status", {})
            if claim["metadata"]["uid"] in found:
                finalizers = claim["metadata"].setdefault("finalizers", [])
                if FINALIZER not in finalizers:
                    finalizers.append(FINALIZER)
                status["allocation"] = found[claim["metadata"]["uid"]]
            reserved = status.setdefault("reservedFor", [])
            if consumer not in reserved:
                reserved.append(consumer)
            self.api.put(claim)
        pod["spec"]["nodeName"] = node
        self._condition(pod, "True", "", "")
        self.api.put(pod)
        return Decision(node)

    def _pending(self, pod: Obj, message: str) -> Decision:
        self._condition(pod, "False", "Unschedulable", message)
        self.api.put(pod)
        return Decision(None, message)

    @staticmethod
    def _condition(pod: Obj, status: str, reason: str, message: str) -> None:
        conditions = [
            c
            for c in pod.setdefault("status", {}).get("conditions") or ()
            if c.get("type") != "PodScheduled"
        ]
        condition = {"type": "PodScheduled", "status": status}
        if reason:
            condition |= {"reason": reason, "message": message}
        pod["status"]["conditions"] = [*conditions, condition]
