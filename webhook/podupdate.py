"""Updates of a running pod: the admission its grants bind never changes.

The webhook writes `gpuwire.io/grant-pod` at CREATE (gpuwire.grant). Pod annotations are
otherwise mutable, and kubelet creates each container it (re)starts with the pod's
annotations of that moment (the CreateContainer request carries a sandbox config made from
the current pod; containerd passes this one annotation into the spec). So a pod author could
annotate a pod of theirs with another pod's admission, which anyone who may read that pod
sees, and restart a container holding that pod's copied grant. An update that sets, changes
or removes the annotation is denied; every other update passes untouched.
"""

from __future__ import annotations

from typing import Any

from gpuwire import grant
from webhook.mutation import Denial, Outcome


def admission_of(raw_pod: Any) -> str:
    """A pod's POD_ANNOTATION as the review carries it ("" where it has none)."""
    meta = raw_pod.get("metadata") if isinstance(raw_pod, dict) else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(grant.POD_ANNOTATION) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else ""


def decide(old: Any, new: Any) -> Outcome:
    """Denied where the update moves the pod's grant admission; else nothing to do."""
    was, now = admission_of(old), admission_of(new)
    if was == now:
        return Outcome(skipped="the update keeps the pod's grant admission")
    return Outcome(
        denial=Denial(
            403,
            f"{grant.POD_ANNOTATION} is the admission the pod's GPU grants bind, written by "
            f"gpuwire's webhook when the pod was created ({was!r}); an update cannot set, "
            f"change or remove it (asked: {now!r}); recreate the pod instead",
        )
    )
