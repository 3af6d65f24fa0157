"""What the control plane does with a pod before a node sees it: admission, storage, scheduling.

The kube-apiserver stand-in stores objects but runs no admission chain and there is no
scheduler, so these steps are done here the way those components do them: the AdmissionReview
goes to the webhook over TLS, checked against its CA (the caBundle), and the JSONPatch that
comes back is applied; the pod is stored with the API server's uid; the testbed's scheduler
stand-in (testbed/scheduler.py: the filters a GPU pod meets — node selector, the
RuntimeClass's scheduling selector, required node affinity, extended resources — and DRA's
claims, made from their templates and allocated) binds it to a node or says why not.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonpatch

from gpuwire.annotations import KNOWN
from scripts.demo.cluster import Cluster
from testbed.scheduler import Scheduler
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


def review(
    cluster: Cluster, pod: Obj, dry_run: bool = False, http: httpx.Client | None = None
) -> Admission:
    """Send `pod` to the webhook as the API server does on create (AdmissionReview v1;
    `dry_run`: as for `kubectl create --dry-run=server`, which makes nothing)."""
    namespace = pod["metadata"].get("namespace", "default")
    body = request_for(pod, namespace, uid=pod["metadata"]["name"])
    body["request"]["dryRun"] = dry_run
    with contextlib.ExitStack() as stack:
        client = http or stack.enter_context(cluster.webhook())
        reply = client.post("/mutate", json=body)
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


def create(cluster: Cluster, admission: Admission) -> tuple[Obj, str]:
    """Store the admitted pod and schedule it (testbed/scheduler.py: the resourceclaim
    controller makes its claims, the scheduler's filters and DRA allocator pick its node);
    the stored pod and, when no node takes it, the scheduler's reason it stays Pending."""
    pod = cluster.api.put(admission.admitted())
    meta = pod["metadata"]
    decision = Scheduler(cluster.api).schedule(meta["namespace"], meta["name"])
    stored = cluster.api.get("pods", meta["name"], meta["namespace"])
    assert stored is not None
    return stored, decision.message
