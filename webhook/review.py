"""AdmissionReview in and out (kubernetes/api `admission/v1/types.go`; kubernetes.io "Dynamic
Admission Control"), without a socket.

The server hands the request body to `answer` and sends back what it returns; `gpuwire
mutate` wraps a pod in a review and goes through the same function. v1 and v1beta1 have the
same shape; the answer carries the version it was asked in. A body that is not an
AdmissionReview gets HTTP 400 with a Status saying why (the API server then applies the
webhook's failure policy); a pod the webhook refuses gets HTTP 200 with `allowed: false`.

JSON goes through orjson: with the standard library's `json`, decoding a review (~4.5 KB)
and encoding the patch and the answer cost ~90 µs per admission in the running server, half
of what the webhook adds to the HTTP framework's cost; with orjson ~40 µs (docs/annotations.md,
"Performance").
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.mutation import Outcome

VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
WARNING_LENGTH = 120  # longer warnings may be truncated by clients
# metav1.StatusReason of a denial's code (apimachinery `pkg/apis/meta/v1/types.go`)
REASONS = {403: "Forbidden", 409: "Conflict", 503: "ServiceUnavailable"}
EPHEMERAL = "ephemeralcontainers"  # the pods subresource `kubectl debug` updates
# what the webhook decides on: pods being created, ephemeral containers being added, and
# updates of a pod (its status too) that would move its grant admission (webhook.podupdate)
HANDLED = (("CREATE", ""), ("UPDATE", EPHEMERAL), ("UPDATE", ""), ("UPDATE", "status"))


class BadReview(ValueError):
    """A body that is not an AdmissionReview request."""


@dataclass(frozen=True, slots=True)
class Review:
    api_version: str
    uid: str
    namespace: str
    operation: str
    kind: str
    pod: Any  # request.object, checked by the mutation
    dry_run: bool
    subresource: str = ""  # EPHEMERAL: ephemeral containers being added to a running pod
    old_pod: Any = None  # request.oldObject, on an UPDATE


def encode(document: object) -> bytes:
    """`document` as JSON (compact UTF-8): the patch, and the answer that carries it."""
    return orjson.dumps(document)


def parse(body: bytes) -> Review:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # also: not UTF-8, nested past 1024 levels
        raise BadReview(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):  # decoded JSON: objects are dicts
        raise BadReview("body is not a JSON object")
    version = doc.get("apiVersion")
    if doc.get("kind") != "AdmissionReview" or version not in VERSIONS:
        raise BadReview(
            f"expected kind AdmissionReview, apiVersion {' or '.join(VERSIONS)}; "
            f"got kind {doc.get('kind')!r}, apiVersion {version!r}"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    kind = request.get("kind")
    namespace = request.get("namespace") or ""
    operation = request.get("operation")
    subresource = request.get("subResource") or ""
    if not (isinstance(namespace, str) and isinstance(operation, str)) or not isinstance(
        subresource, str
    ):
        raise BadReview("request.namespace, operation and subResource must be strings")
    return Review(
        api_version=str(version),
        uid=uid,
        namespace=namespace,
        operation=operation,
        kind=str(kind.get("kind", "")) if isinstance(kind, dict) else "",
        pod=request.get("object"),
        dry_run=request.get("dryRun") is True,
        subresource=subresource,
        old_pod=request.get("oldObject"),
    )


def _warnings(outcome: Outcome) -> list[str]:
    return [
        w if len(w) <= WARNING_LENGTH else w[: WARNING_LENGTH - 1] + "…" for w in outcome.warnings
    ]


def response(review: Review, outcome: Outcome) -> dict[str, Any]:
    answer: dict[str, Any] = {"uid": review.uid, "allowed": outcome.allowed}
    if outcome.denial:
        reason = REASONS.get(outcome.denial.code, "BadRequest")
        answer["status"] = {
            "status": "Failure",
            "code": outcome.denial.code,
            "reason": reason,
            "message": outcome.denial.message,
        }
    elif outcome.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(encode(outcome.patch)).decode()
    if outcome.warnings:
        answer["warnings"] = _warnings(outcome)
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": answer}


def pod_name(review: Review) -> str:
    """The pod as a person finds it: its name, else (a controller's pod, named only after
    admission) its generateName and owner, `web-7d9f-* (of ReplicaSet web-7d9f)`."""
    meta = review.pod.get("metadata") if isinstance(review.pod, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    if meta.get("name"):
        return str(meta["name"])
    named = f"{meta['generateName']}*" if meta.get("generateName") else "(no name)"
    owners = meta.get("ownerReferences")
    owner = owners[0] if isinstance(owners, list) and owners and isinstance(owners[0], dict) else {}
    if owner.get("kind") and owner.get("name"):
        return f"{named} (of {owner['kind']} {owner['name']})"
    return named


def decision(review: Review, outcome: Outcome) -> tuple[int, str, dict[str, Any]]:
    """(log level, line, fields) of one admission: the pod, the uid, and what was granted or
    why it was denied; the warnings come as lines of their own."""
    name = pod_name(review)
    pod = f"{review.namespace}/{name}"
    fields: dict[str, Any] = {
        "namespace": review.namespace,
        "pod": name,
        "uid": review.uid,
        "outcome": label(outcome),
    }
    if outcome.denial is not None:
        fields["code"] = outcome.denial.code
        said = f"denied {pod} (uid {review.uid}): {outcome.denial.code}: {outcome.denial.message}"
        return logging.INFO, said, fields
    if outcome.skipped is not None:
        return logging.DEBUG, f"skipped {pod} (uid {review.uid}): {outcome.skipped}", fields
    granted = "; ".join(outcome.granted) or "no GPU asked for"
    fields["granted"] = list(outcome.granted)
    return logging.INFO, f"admitted {pod} (uid {review.uid}): {granted}", fields


def label(outcome: Outcome) -> str:
    """The metrics label of an answer."""
    if outcome.skipped:
        return "skipped"
    if outcome.denial:
        return "denied"
    return "mutated" if outcome.patch else "unchanged"


def status(code: int, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "message": message,
    }


def outcome_of(review: Review, decide: Callable[[Review], Outcome]) -> Outcome:
    """The webhook's decision on a review: pods being created, ephemeral containers being
    added to one, and updates that would move a pod's grant admission are its business; the
    rest passes untouched."""
    if review.kind != "Pod" or (review.operation, review.subresource) not in HANDLED:
        what = f"{review.kind or 'object'}" + (
            f"/{review.subresource}" if review.subresource else ""
        )
        return Outcome(skipped=f"{review.operation} {what} is not handled")
    return decide(review)


def answer(body: bytes, decide: Callable[[Review], Outcome]) -> tuple[int, dict[str, Any], str]:
    """(HTTP status, JSON body, outcome label) for a request body."""
    try:
        review = parse(body)
    except BadReview as exc:
        return 400, status(400, str(exc)), "invalid"
    outcome = outcome_of(review, decide)
    return 200, response(review, outcome), label(outcome)


def request_for(pod: Any, namespace: str, uid: str = "gpuwire-mutate") -> dict[str, Any]:
    """The AdmissionReview the API server would send for creating `pod` in `namespace`."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        },
    }


def decode_patch(reply: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch of an AdmissionReview reply ([] when there is none)."""
    patch = reply["response"].get("patch")
    return orjson.loads(base64.b64decode(patch)) if patch else []
