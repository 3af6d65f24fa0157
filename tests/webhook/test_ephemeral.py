"""Ephemeral containers, which `kubectl debug` adds to a running pod through the
`pods/ephemeralcontainers` subresource (an UPDATE): none gets a GPU, and none can be handed
one through envFrom (webhook/ephemeral.py). Before, the webhook was never asked."""

from __future__ import annotations

from typing import Any

import jsonpatch
import orjson

from tests.webhook.support import OPEN, container, pod
from webhook import ephemeral, review
from webhook.sources import Sources, fleet_file


def debugged(**debug: Any) -> dict[str, Any]:
    """A running pod (admitted, a GPU container) with an ephemeral container being added."""
    p = pod(containers=[container(env={"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": "k1:00"})])
    p["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", **debug}]
    return p


def test_an_ephemeral_container_asking_for_gpus_is_denied() -> None:
    """A grant copied from the pod's GPU container, or a request of its own."""
    for env in (
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        [{"name": "GPUWIRE_GRANT", "value": "k1:00"}],
        [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
    ):
        outcome = ephemeral.mutate(debugged(env=env), "ml", OPEN)
        assert outcome.denial is not None
        assert outcome.denial.code == 403
        assert outcome.denial.message.startswith("ephemeral container 'debug' asks for GPUs (")
        assert "kubectl debug --copy-to" in outcome.denial.message


def test_envfrom_cannot_hand_an_ephemeral_container_a_gpu() -> None:
    """Its explicit env wins over envFrom (core/v1 Container.envFrom), so a ConfigMap's
    NVIDIA_VISIBLE_DEVICES=all and GPUWIRE_GRANT are void in it."""
    raw = debugged(envFrom=[{"configMapRef": {"name": "copied-grant"}}])
    outcome = ephemeral.mutate(raw, "ml", OPEN)
    assert outcome.denial is None
    mutated = jsonpatch.apply_patch(raw, list(outcome.patch))
    (added,) = mutated["spec"]["ephemeralContainers"]
    assert added["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "AMD_VISIBLE_DEVICES", "value": "void"},
    ]
    assert ephemeral.mutate(mutated, "ml", OPEN).patch == ()  # a second run: nothing
    assert mutated["spec"]["containers"] == raw["spec"]["containers"]  # the pod's own: untouched


def test_the_webhook_answers_the_ephemeral_containers_subresource() -> None:
    sources = Sources.load(None, None, fleet_file(None))  # the built-in policy
    body = review.request_for(debugged(env=[{"name": "GPUWIRE_GRANT", "value": "k1:00"}]), "ml")
    body["request"] |= {"operation": "UPDATE", "subResource": "ephemeralcontainers"}
    status, answer, label = review.answer(orjson.dumps(body), sources.decide)
    assert (status, label, answer["response"]["allowed"]) == (200, "denied", False)
    status_, other, _ = review.answer(
        orjson.dumps(body | {"request": body["request"] | {"subResource": "status"}}),
        sources.decide,
    )
    assert (status_, other["response"]["allowed"]) == (200, True)  # not handled: untouched


def test_ephemeral_containers_added_before_are_left_as_they_are() -> None:
    """The API server changes no ephemeral container once added: a patch touching one (one
    added before gpuwire was installed) would fail every later `kubectl debug` of the pod."""
    before = debugged(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    after = debugged(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    after["spec"]["ephemeralContainers"].append({"name": "debug-2", "image": "busybox"})
    outcome = ephemeral.mutate(after, "ml", OPEN, before)
    assert outcome.denial is None
    mutated = jsonpatch.apply_patch(after, list(outcome.patch))
    old, added = mutated["spec"]["ephemeralContainers"]
    assert old == before["spec"]["ephemeralContainers"][0]
    assert [e["value"] for e in added["env"]] == ["void", "void"]
