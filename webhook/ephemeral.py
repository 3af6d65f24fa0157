"""Ephemeral containers (`kubectl debug`), which the `pods/ephemeralcontainers` subresource
adds to a running pod (an UPDATE, long after the pod's admission): none gets a GPU.

They take no resources (so no device-plugin allocation) and are no container the pod's
`gpuwire.io` annotations were granted for; a grant copied from a sibling names the sibling
(`gpuwire.grant`). So one that asks for GPUs in its env (a `*_VISIBLE_DEVICES` other than
`void`, a `GPUWIRE_GRANT`, either from `valueFrom`) is denied, saying how to debug a GPU
container instead, and every other gets each vendor's `*_VISIBLE_DEVICES=void` written
explicitly: a pod's explicit env wins over `envFrom` ("Values defined by an Env with a
duplicate key will take precedence", the `envFrom` field of core/v1 Container), so no
ConfigMap or Secret carries a GPU request into it.
"""

from __future__ import annotations

from typing import Any

from gpuwire import devices, grant
from gpuwire.vendor import VENDORS
from webhook.mutation import Denial, Outcome
from webhook.patch import Op, env_ops
from webhook.pod import Container, MalformedPod, Pod
from webhook.policy import Policy

VOID = "void"


def _asks(c: Container) -> str | None:
    """The env entry by which an ephemeral container asks for GPUs, if one does."""
    for name in (*(v.visible_env for v in VENDORS), grant.ENV):
        if not c.sets(name):
            continue
        value = c.value(name)
        if value is None:
            return f"{name} from valueFrom"
        if name == grant.ENV or devices.parse_request(value).kind is not devices.Kind.VOID:
            return f"{name}={value}"
    return None


def _names(raw_pod: Any) -> set[str]:
    """The ephemeral containers a pod had before the update (the API server changes none of
    them: a patch touching one would fail the update); none where there is no such pod."""
    try:
        return {c.name for c in Pod.read(raw_pod).ephemeral_containers}
    except MalformedPod:
        return set()


def mutate(raw_pod: Any, namespace: str, policy: Policy, old: Any = None) -> Outcome:
    """The patch (or denial) for a pod whose ephemeral containers are being updated (`old`:
    the pod before, whose ephemeral containers are left as they are)."""
    if policy.excluded(namespace):
        return Outcome(skipped=f"namespace {namespace} is excluded by the policy")
    try:
        pod = Pod.read(raw_pod)
    except MalformedPod as exc:
        return Outcome(denial=Denial(400, str(exc)))
    ops: list[Op] = []
    there = _names(old)
    for c in (c for c in pod.ephemeral_containers if c.name not in there):
        asked = _asks(c)
        if asked is not None:
            return Outcome(
                denial=Denial(
                    403,
                    f"ephemeral container {c.name!r} asks for GPUs ({asked}): gpuwire gives "
                    "ephemeral containers none (they take no resources, and the pod's GPU "
                    "grants name its own containers); debug a GPU container from inside it "
                    "(kubectl exec), or a copy of the pod (kubectl debug --copy-to)",
                )
            )
        desired: dict[str, str | None] = {v.visible_env: VOID for v in VENDORS}
        ops += env_ops(c, desired)[0]
    return Outcome(tuple(ops))
