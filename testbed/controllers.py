"""kube-controller-manager and kube-scheduler, as far as a gpuwire install needs them, over
the API server stand-in: one loop that keeps DaemonSets, Deployments, Services' endpoints
and owned pods as their controllers keep them, and schedules pending pods
(testbed/scheduler.py). Pods are created through the API server's admission chain, as a
controller's creates are.

- DaemonSet ("DaemonSet", kubernetes.io/docs/concepts/workloads/controllers/daemonset/;
  `pkg/controller/daemon`): one pod per node whose labels its template's node selector and
  required node affinity take, named `<ds>-<5>`, labelled `controller-revision-hash` (a
  hash of the template), owned by the DaemonSet, its node affinity replaced by a
  `matchFields metadata.name` term for its node and the DaemonSet controller's tolerations
  added. A RollingUpdate (`maxUnavailable`, default 1) replaces pods of an older template
  node by node: the old pod is deleted, the new one created once it is gone, the next node
  only once the new pod is Ready; OnDelete replaces a pod only once someone deleted it.
- Deployment (`pkg/controller/deployment`): `replicas` pods labelled `pod-template-hash`;
  a RollingUpdate (`maxSurge` 25%, `maxUnavailable` 25%, rounded as the controller rounds
  them) adds new pods and removes old ones as the new ones become Ready.
- EndpointSlice (`pkg/controller/endpointslice`): per Service with a selector, one slice of
  the pods it selects that have an address, each endpoint `ready` when its pod is Ready and
  not terminating, ports resolved from the Service's target ports (a named one through the
  pod's container ports).
- Garbage collector: a pod whose controlling owner is gone is deleted.

Left out: ReplicaSets (a Deployment owns its pods directly; no revision history, no
rollback), ControllerRevisions (the hash is the template's), DaemonSet `maxSurge`,
`minReadySeconds`, progress deadlines, PodDisruptionBudget status, taints (the scheduler
ignores them), the controllers' own identities (they write as the admin).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
from typing import Any

from testbed.admission import Rejection
from testbed.apiserver import ApiServer, StatusError
from testbed.scheduler import Scheduler, selects

Obj = dict[str, Any]
REVISION = "controller-revision-hash"
TEMPLATE_HASH = "pod-template-hash"
SERVICE_NAME = "kubernetes.io/service-name"
# What the DaemonSet controller adds to its pods (pkg/controller/daemon/util)
DAEMON_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
    for key, effect in (("not-ready", "NoExecute"), ("unreachable", "NoExecute"),
                        ("disk-pressure", "NoSchedule"), ("memory-pressure", "NoSchedule"),
                        ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule"))
]  # fmt: skip


def template_hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def serving(pod: Obj) -> bool:
    """Ready and not terminating: available."""
    return ready(pod) and not pod["metadata"].get("deletionTimestamp")


def ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def owned_by(pod: Obj, owner: Obj) -> bool:
    return any(
        r.get("uid") == owner["metadata"]["uid"]
        for r in pod["metadata"].get("ownerReferences") or ()
    )


def _owner(owner: Obj) -> Obj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def daemon_runs_on(template: Obj, node: Obj) -> bool:
    """Whether the DaemonSet's pod belongs on the node: its nodeSelector and required node
    affinity take the node's labels."""
    spec = template["spec"]
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return selects(affinity, node)


def scaled(value: Any, total: int, up: bool) -> int:
    """An intOrString of a rolling update (`1`, `25%`) against `total` pods."""
    if isinstance(value, str) and value.endswith("%"):
        exact = int(value[:-1]) * total / 100
        return math.ceil(exact) if up else math.floor(exact)
    return int(value)


class Controllers:
    """The loop, as a context manager: it looks again at every change of the API server's
    objects, and every `period` seconds (a pending pod's scheduling is tried again)."""

    def __init__(self, api: ApiServer, period: float = 1.0) -> None:
        self.api, self.period = api, period
        self.scheduler = Scheduler(api)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="controllers", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> Controllers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        seen = 0
        while not self._stop.is_set():
            seen = self.api.changed(seen, self.period)
            for step in (
                self.daemonsets,
                self.deployments,
                self.collect,
                self.schedule,
                self.endpoints,
            ):
                try:
                    step()
                except (StatusError, Rejection) as exc:  # a conflict, a refusal: next round
                    self.errors.append(f"{step.__name__}: {exc}")

    # --- creating and deleting pods

    def _create_pod(
        self, owner: Obj, template: Obj, labels: dict[str, str], node: str = ""
    ) -> None:
        meta = owner["metadata"]
        pod_meta = dict(template.get("metadata") or {})
        pod_meta |= {
            "generateName": f"{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": {**(pod_meta.get("labels") or {}), **labels},
            "ownerReferences": [_owner(owner)],
        }
        spec = json.loads(json.dumps(template["spec"]))
        if node:
            affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
            term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": [term]
            }
            tolerations = spec.setdefault("tolerations", [])
            tolerations.extend(t for t in DAEMON_TOLERATIONS if t not in tolerations)
        self.api.create({"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec})

    def _delete_pod(self, pod: Obj) -> None:
        if not pod["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(StatusError):
                self.api.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _pods(self, owner: Obj) -> list[Obj]:
        return [
            p
            for p in self.api.objects("pods", owner["metadata"]["namespace"])
            if owned_by(p, owner)
        ]

    # --- the controllers

    def daemonsets(self) -> None:
        nodes = self.api.objects("nodes")
        for ds in self.api.objects("daemonsets"):
            template = ds["spec"]["template"]
            revision = template_hash(template)
            pods = self._pods(ds)
            on: dict[str, list[Obj]] = {}
            for pod in pods:
                node = self._node_of(pod)
                on.setdefault(node, []).append(pod)
            wanted = [n["metadata"]["name"] for n in nodes if daemon_runs_on(template, n)]
            strategy = ds["spec"].get("updateStrategy") or {"type": "RollingUpdate"}
            rolling = strategy.get("rollingUpdate") or {}
            budget = max(1, scaled(rolling.get("maxUnavailable", 1), len(wanted), up=True))
            unavailable = sum(1 for n in wanted if not any(serving(p) for p in on.get(n, ())))
            for name in wanted:
                if not on.get(name):  # none, not even one terminating: make it
                    self._create_pod(ds, template, {REVISION: revision}, node=name)
                    continue
                if strategy["type"] != "RollingUpdate":
                    continue
                old = [
                    p
                    for p in on[name]
                    if p["metadata"]["labels"].get(REVISION) != revision
                    and not p["metadata"].get("deletionTimestamp")
                ]
                if not old:
                    continue
                up = any(serving(p) for p in on[name])
                if up and unavailable >= budget:
                    continue  # the next node waits for this round's pod to be Ready
                for pod in old:
                    self._delete_pod(pod)
                unavailable += up
            for node, found in on.items():
                if node not in wanted:
                    for pod in found:
                        self._delete_pod(pod)
            self._daemonset_status(ds, wanted, on, revision)

    def _node_of(self, pod: Obj) -> str:
        if pod["spec"].get("nodeName"):
            return str(pod["spec"]["nodeName"])
        terms = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}
        ).get("nodeSelectorTerms") or [{}]
        fields = terms[0].get("matchFields") or [{}]
        return str((fields[0].get("values") or [""])[0])

    def _daemonset_status(
        self, ds: Obj, wanted: list[str], on: dict[str, list[Obj]], revision: str
    ) -> None:
        current = [p for n in wanted for p in on.get(n, ())]
        status = {
            "desiredNumberScheduled": len(wanted),
            "currentNumberScheduled": sum(1 for n in wanted if on.get(n)),
            "numberReady": sum(1 for p in current if ready(p)),
            "numberAvailable": sum(1 for p in current if ready(p)),
            "updatedNumberScheduled": sum(
                1 for p in current if p["metadata"]["labels"].get(REVISION) == revision
            ),
            "numberMisscheduled": sum(len(v) for k, v in on.items() if k not in wanted),
            "observedGeneration": ds["metadata"].get("generation", 1),
        }
        if ds.get("status") != status:
            self.api.update_status(
                "daemonsets", ds["metadata"]["name"], ds["metadata"]["namespace"], status
            )

    def deployments(self) -> None:
        for deployment in self.api.objects("deployments"):
            spec = deployment["spec"]
            template = spec["template"]
            revision = template_hash(template)
            replicas = int(spec.get("replicas", 1))
            pods = [p for p in self._pods(deployment) if not p["metadata"].get("deletionTimestamp")]
            new = [p for p in pods if p["metadata"]["labels"].get(TEMPLATE_HASH) == revision]
            old = [p for p in pods if p not in new]
            rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
            surge = scaled(rolling.get("maxSurge", "25%"), replicas, up=True)
            unavailable = scaled(rolling.get("maxUnavailable", "25%"), replicas, up=False)
            if (spec.get("strategy") or {}).get("type") == "Recreate":
                surge, unavailable = 0, replicas
            if len(new) < replicas and len(pods) < replicas + surge:
                for _ in range(min(replicas - len(new), replicas + surge - len(pods))):
                    self._create_pod(deployment, template, {TEMPLATE_HASH: revision})
            available = sum(1 for p in pods if ready(p))
            removable = max(0, available - (replicas - unavailable))
            for pod in old[:removable]:
                self._delete_pod(pod)
            for pod in new[replicas:]:
                self._delete_pod(pod)
            status = {
                "replicas": len(pods),
                "updatedReplicas": len(new),
                "readyReplicas": available,
                "availableReplicas": available,
                "observedGeneration": deployment["metadata"].get("generation", 1),
            }
            if deployment.get("status") != status:
                meta = deployment["metadata"]
                self.api.update_status("deployments", meta["name"], meta["namespace"], status)

    def collect(self) -> None:
        """The garbage collector: pods whose controller is gone go too."""
        owners = {
            o["metadata"]["uid"]
            for kind in ("daemonsets", "deployments")
            for o in self.api.objects(kind)
        }
        for pod in self.api.objects("pods"):
            refs = [r for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")]
            if (
                refs
                and refs[0]["kind"] in ("DaemonSet", "Deployment")
                and refs[0]["uid"] not in owners
            ):
                self._delete_pod(pod)

    def schedule(self) -> None:
        for pod in self.api.objects("pods"):
            meta = pod["metadata"]
            if not pod["spec"].get("nodeName") and not meta.get("deletionTimestamp"):
                self.scheduler.schedule(meta["namespace"], meta["name"])

    def endpoints(self) -> None:
        for service in self.api.objects("services"):
            selector = service["spec"].get("selector")
            if not selector:
                continue
            namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
            pods = [
                p
                for p in self.api.objects("pods", namespace)
                if selector.items() <= (p["metadata"].get("labels") or {}).items()
                and (p.get("status") or {}).get("podIP")
            ]
            ports = []
            for port in service["spec"].get("ports") or ():
                target = port.get("targetPort", port["port"])
                number = target if isinstance(target, int) else self._named_port(pods, target)
                if number is not None:
                    ports.append(
                        {
                            "name": port.get("name", ""),
                            "port": number,
                            "protocol": port.get("protocol", "TCP"),
                        }
                    )
            endpoints = [
                {
                    "addresses": [p["status"]["podIP"]],
                    "conditions": {
                        "ready": serving(p),
                        "serving": ready(p),
                        "terminating": bool(p["metadata"].get("deletionTimestamp")),
                    },
                    "nodeName": p["spec"].get("nodeName", ""),
                    "targetRef": {
                        "kind": "Pod",
                        "name": p["metadata"]["name"],
                        "namespace": namespace,
                        "uid": p["metadata"]["uid"],
                    },
                }
                for p in sorted(pods, key=lambda p: p["metadata"]["name"])
            ]
            wanted = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-testbed",
                    "namespace": namespace,
                    "labels": {
                        SERVICE_NAME: name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    },
                    "ownerReferences": [_owner(service)],
                },
                "addressType": "IPv4",
                "ports": ports,
                "endpoints": endpoints,
            }
            have = self.api.get("endpointslices", f"{name}-testbed", namespace)
            if have is None or (have.get("ports"), have.get("endpoints")) != (ports, endpoints):
                self.api.put(wanted)

    @staticmethod
    def _named_port(pods: list[Obj], name: str) -> int | None:
        for pod in pods:
            for container in pod["spec"]["containers"]:
                for port in container.get("ports") or ():
                    if port.get("name") == name:
                        return int(port["containerPort"])
        return None
