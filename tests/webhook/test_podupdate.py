"""Updates of a running pod cannot move the admission its grants bind (webhook.podupdate).
Before, the webhook saw no update: a pod author annotated a pod of theirs with another pod's
gpuwire.io/grant-pod, and kubelet's next start of a container there carried it."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from gpuwire import grant
from tests.webhook.support import container, pod
from webhook import review
from webhook.sources import Sources, fleet_file

MINE, THEIRS = "7c1e0b52-3d8a-4f6e-9b21-5a4c3e2d1f00", "0b7e5d1c-9a3f-4c2e-8d6b-1f0e2d3c4b5a"


def update(old: dict[str, Any], new: dict[str, Any], subresource: str = "") -> dict[str, Any]:
    """The webhook's answer to the API server's review of updating pod `old` to `new`."""
    body = review.request_for(new, "ml")
    body["request"] |= {"operation": "UPDATE", "oldObject": old, "subResource": subresource}
    status, answer, _ = review.answer(
        orjson.dumps(body), Sources.load(None, None, fleet_file(None)).decide
    )
    assert status == 200
    response: dict[str, Any] = answer["response"]
    return response


def annotated(admission: str | None) -> dict[str, Any]:
    p = pod(containers=[container(env={"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": "k1:00"})])
    if admission is not None:
        p.setdefault("metadata", {}).setdefault("annotations", {})[grant.POD_ANNOTATION] = admission
    return p


def test_an_update_moving_the_grant_admission_is_denied() -> None:
    for old, new in ((None, THEIRS), (MINE, THEIRS), (MINE, None)):
        for subresource in ("", "status"):
            answer = update(annotated(old), annotated(new), subresource)
            assert answer["allowed"] is False
            assert answer["status"]["code"] == 403
            assert answer["status"]["message"].startswith(
                f"{grant.POD_ANNOTATION} is the admission the pod's GPU grants bind"
            )


def test_other_updates_pass_untouched() -> None:
    old = annotated(MINE)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "a"}
    answer = update(old, new)
    assert answer["allowed"] is True
    assert "patch" not in answer
