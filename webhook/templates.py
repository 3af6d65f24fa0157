"""The ResourceClaimTemplates the DRA path's pods are made from: making them exist at
admission, and removing those no pod uses any more.

At admission (`ensure`, called by the server off its event loop, bounded by a budget below
the webhook's timeout): a template the watch already shows, with the same spec and not
marked unused, costs nothing; otherwise it is created (a 409 from a racing replica is
success once its spec is the same), or its unused mark is removed. A failure is a denial
that says what went wrong, never a 500, and the pod is not admitted: its claims would have
no template. A dry run creates nothing (`sideEffects: NoneOnDryRun`).

Removal (`sweep`, run by the replica holding the Lease, every minute): a template is in use
while a claim made from it exists (every claim carries its template's label) or a pod names
it. One found unused is marked (`gpuwire.io/unused-since`); one still unused a grace period
later is deleted, on the condition (`preconditions.resourceVersion`) that nothing touched it
since it was read. Against the admission that needs it at that moment: the webhook unmarks a
marked template before admitting a pod that uses it, which changes its resourceVersion, so a
delete racing it fails; if the delete wins, the unmark finds nothing and the webhook creates
the template again. The grace period must outlast the webhook's watch lag and the time from
admission to the pod's claim (minutes; 10 by default).
"""

from __future__ import annotations

import calendar
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

import kubeclient
from webhook.claims import MANAGED_BY, MANAGER, TEMPLATE_LABEL
from webhook.mutation import Denial

log = logging.getLogger(__name__)

UNUSED = "gpuwire.io/unused-since"
SELECTOR = f"{MANAGED_BY}={MANAGER}"
MERGE_PATCH = "application/merge-patch+json"

Obj = Mapping[str, Any]


def _within(ours: Any, stored: Any) -> bool:
    """Whether `stored` says everything `ours` does (the API server adds defaults)."""
    if isinstance(ours, Mapping):
        return isinstance(stored, Mapping) and all(
            _within(v, stored.get(k)) for k, v in ours.items()
        )
    if isinstance(ours, list):
        return (
            isinstance(stored, list)
            and len(ours) == len(stored)
            and all(_within(a, b) for a, b in zip(ours, stored, strict=True))
        )
    return bool(ours == stored)


@dataclass(frozen=True)
class Seen:
    """What the watch keeps of one of gpuwire's templates."""

    namespace: str
    name: str
    spec: Obj
    marked: bool  # marked unused


def seen(obj: Obj) -> Seen:
    meta = obj.get("metadata") or {}
    marked = UNUSED in (meta.get("annotations") or {})
    return Seen(str(meta.get("namespace")), str(meta.get("name")), obj.get("spec") or {}, marked)


@dataclass(frozen=True)
class Known:
    """The gpuwire templates the watch shows: (namespace, name) → (spec, marked unused)."""

    templates: Mapping[tuple[str, str], tuple[Obj, bool]] = field(default_factory=dict)


def _rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _seconds(text: str) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _why(exc: client.ApiException) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except ValueError:
        message = exc.reason
    return f"{exc.status} {message}"


class TemplateStore:
    """Creates templates through `api` (ResourceV1Api), knowing those that exist from `known`
    (a watch of gpuwire's templates, or anything with `current`)."""

    def __init__(self, api: client.ResourceV1Api, known: Any) -> None:
        self.api: Any = api  # the client's methods are untyped
        self.known = known

    def made(self, templates: Sequence[Obj]) -> bool:
        """Whether every one of `templates` exists as it is and unmarked, as the watch shows
        them: then there is nothing to make, and no reason to leave the event loop."""
        for template in templates:
            meta = template["metadata"]
            seen = self.known.current.templates.get((meta["namespace"], meta["name"]))
            if seen is None or seen[1] or not _within(template["spec"], seen[0]):
                return False
        return True

    def ensure(self, templates: Sequence[Obj], budget: float) -> Denial | None:
        """Make every template exist within `budget` seconds; the denial when one cannot."""
        deadline = time.monotonic() + budget
        for template in templates:
            meta = template["metadata"]
            namespace, name = meta["namespace"], meta["name"]
            seen = self.known.current.templates.get((namespace, name))
            what = f"ResourceClaimTemplate {namespace}/{name}"
            if seen is not None and not _within(template["spec"], seen[0]):
                return _conflict(what)
            if seen is not None and not seen[1]:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return Denial(503, f"{what} not created within {budget:g}s; try again")
            try:
                self._make(template, seen is not None and seen[1], left)
            except client.ApiException as exc:
                return Denial(503, f"{what} could not be created: {_why(exc)}")
            except _Conflict:
                return _conflict(what)
            except Exception as exc:  # a timeout, a reset connection
                why = kubeclient.explain(exc, kubeclient.host(self.api)) or str(exc)
                return Denial(503, f"{what} could not be created: {why}; try again")
        return None

    def _make(self, template: Obj, marked: bool, timeout: float) -> None:
        meta = template["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if marked and _mark(self.api, namespace, name, None, _request_timeout=timeout):
            return
        try:
            self.api.create_namespaced_resource_claim_template(
                namespace, template, _request_timeout=timeout
            )
            log.info("created ResourceClaimTemplate %s/%s", namespace, name)
            return
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        stored = json.loads(
            self.api.read_namespaced_resource_claim_template(
                name, namespace, _preload_content=False, _request_timeout=timeout
            ).data
        )
        if not _within(template["spec"], stored.get("spec")):
            raise _Conflict
        if UNUSED in (stored["metadata"].get("annotations") or {}):
            _mark(self.api, namespace, name, None, _request_timeout=timeout)


class _Conflict(Exception):
    """A template of gpuwire's name whose spec is not the one the name stands for."""


def _conflict(what: str) -> Denial:
    return Denial(
        409,
        f"{what} exists with another spec than the request it is named for (gpuwire names "
        "its templates by their spec); delete it and create the pod again",
    )


@dataclass
class Swept:
    marked: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def _items(response: Any) -> list[dict[str, Any]]:
    return list(json.loads(response.data).get("items") or [])


def _names(pod: Obj) -> set[str]:
    return {
        str(e.get("resourceClaimTemplateName"))
        for e in (pod.get("spec") or {}).get("resourceClaims") or ()
        if e.get("resourceClaimTemplateName")
    }


def _mark(api: Any, namespace: str, name: str, since: str | None, **options: Any) -> bool:
    """Set (or with None remove) the unused mark; False where the template is gone."""
    patch = {"metadata": {"annotations": {UNUSED: since}}}
    try:
        api.patch_namespaced_resource_claim_template(
            name, namespace, patch, _content_type=MERGE_PATCH, **options
        )
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return True


def sweep(
    resource: client.ResourceV1Api, core: client.CoreV1Api, now: float, grace: float
) -> Swept:
    """One pass of the removal of unused templates (the Lease holder's); `now` is wall time."""
    rapi: Any = resource  # the client's methods are untyped
    capi: Any = core
    done = Swept()
    listed = rapi.list_resource_claim_template_for_all_namespaces
    templates = _items(listed(label_selector=SELECTOR, _preload_content=False))
    made = rapi.list_resource_claim_for_all_namespaces
    claims = _items(made(label_selector=TEMPLATE_LABEL, _preload_content=False))
    used = {(c["metadata"]["namespace"], c["metadata"]["labels"][TEMPLATE_LABEL]) for c in claims}
    pods: dict[str, set[str]] = {}  # namespace → the templates its pods name
    for t in templates:
        meta = t["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = f"{namespace}/{name}"
        since = (meta.get("annotations") or {}).get(UNUSED)
        if (namespace, name) in used:
            if since is not None and _mark(rapi, namespace, name, None):
                done.unmarked.append(key)
            continue
        if since is None:
            if _mark(rapi, namespace, name, _rfc3339(now)):
                done.marked.append(key)
            continue
        if now - (_seconds(since) or now) < grace:
            continue
        if namespace not in pods:
            found = _items(capi.list_namespaced_pod(namespace, _preload_content=False))
            pods[namespace] = {n for p in found for n in _names(p)}
        if name in pods[namespace]:
            if _mark(rapi, namespace, name, None):
                done.unmarked.append(key)
            continue
        options = {"preconditions": {"resourceVersion": meta["resourceVersion"]}}
        try:
            rapi.delete_namespaced_resource_claim_template(name, namespace, body=options)
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # gone, or touched since it was read
                raise
            continue
        log.info("deleted ResourceClaimTemplate %s, unused since %s", key, since)
        done.deleted.append(key)
    return done
