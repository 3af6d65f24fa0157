"""The templates the DRA path's pods are made from, against the kube-apiserver stand-in: made
at admission by the served webhook (not on a dry run; a failure denies, saying why), one
object however many replicas race to make it, and removed by the Lease holder once no claim
or pod uses it — never one an admission is about to use."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from kubernetes import client

from testbed import dracluster
from testbed.apiserver import ApiServer
from testbed.webhook import WebhookProcess, serving
from tests.webhook.support import client as https_client
from tests.webhook.support import eventually, make_files
from webhook.claims import MANAGED_BY, TEMPLATE_LABEL
from webhook.lease import Leader, Lease
from webhook.review import decode_patch, request_for
from webhook.templates import UNUSED, Known, TemplateStore, sweep
from webhook.watch import SliceWatch, TemplateWatch

NAMESPACE = "team-a"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"
ASK = {"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "2"}
POLICY = "allocation: dra\nnamespaces:\n  - match: ['*']\n"


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    meta = {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": NAMESPACE, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "trainer", "image": "busybox"}]}}  # fmt: skip


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(schema="1.37") as server:
        dracluster.install(server, [dracluster.node("h100", 4, ("NVIDIA H100 80GB HBM3",))])
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield server


@pytest.fixture
def webhook(api: ApiServer, tmp_path: Path) -> Iterator[tuple[WebhookProcess, httpx.Client]]:
    files = make_files(tmp_path)
    files.policy.write_text(POLICY)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with serving(files.args("--kubeconfig", str(kubeconfig), nodes=None)) as served, \
            https_client(served, files.tls.ca) as http:  # fmt: skip
        eventually(functools.partial(ready, http), "the webhook to be ready")
        yield served, http


def ready(http: httpx.Client) -> bool:
    return http.get("/readyz").status_code == 200


def review(http: httpx.Client, raw: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    body = request_for(raw, NAMESPACE, uid=str(uuid.uuid4()))
    body["request"]["dryRun"] = dry_run
    reply = http.post("/mutate", json=body)
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def template_names(api: ApiServer) -> list[str]:
    return [t["metadata"]["name"] for t in api.objects("resourceclaimtemplates", NAMESPACE)]


def creates(api: ApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "POST" and r.path == TEMPLATES)


def test_admission_makes_the_template_the_patch_names_once(
    api: ApiServer, webhook: tuple[WebhookProcess, httpx.Client]
) -> None:
    _, http = webhook
    answer = review(http, pod(ASK))
    assert answer["response"]["allowed"]
    named = [op["value"] for op in decode_patch(answer) if op["path"] == "/spec/resourceClaims"]
    template = named[0][0]["resourceClaimTemplateName"]
    assert template_names(api) == [template]

    def without_a_create() -> bool:
        before = creates(api)
        assert review(http, pod(ASK))["response"]["allowed"]
        return creates(api) == before

    eventually(without_a_create, "the webhook's watch to show the template")
    for _ in range(3):  # the watch knows it: no API call per admission
        assert without_a_create()
    assert template_names(api) == [template]


def test_a_dry_run_makes_nothing(
    api: ApiServer, webhook: tuple[WebhookProcess, httpx.Client]
) -> None:
    _, http = webhook
    answer = review(http, pod(ASK), dry_run=True)
    assert answer["response"]["allowed"]
    assert decode_patch(answer)  # the same patch as for a real create
    assert template_names(api) == []
    assert creates(api) == 0


def test_a_template_that_cannot_be_made_denies_the_pod_saying_why(
    api: ApiServer, webhook: tuple[WebhookProcess, httpx.Client]
) -> None:
    _, http = webhook
    api.fail("POST", TEMPLATES, 500)
    answer = review(http, pod(ASK))["response"]
    assert not answer["allowed"]
    assert answer["status"]["code"] == 503
    assert answer["status"]["reason"] == "ServiceUnavailable"
    assert "could not be created: 500 injected fault (500)" in answer["status"]["message"]
    assert template_names(api) == []
    assert review(http, pod(ASK))["response"]["allowed"]  # the next try makes it
    assert len(template_names(api)) == 1


def test_an_api_server_out_of_reach_denies_saying_so_in_a_line() -> None:
    """Not urllib3's retelling of the pool and the URL: the server and what went wrong."""
    spec = {"spec": {"devices": {"requests": [{"name": "gpus"}]}}}
    template = {"metadata": {"namespace": NAMESPACE, "name": "gpuwire-1"}, "spec": spec}
    nowhere = client.Configuration()
    nowhere.host = "http://127.0.0.1:9"  # the discard port: nothing listens
    api = client.ResourceV1Api(client.ApiClient(nowhere))
    store = TemplateStore(api, SimpleNamespace(current=Known({})))
    denial = store.ensure([template], budget=5)
    assert denial is not None
    assert denial.message == (
        "ResourceClaimTemplate team-a/gpuwire-1 could not be created: "
        "cannot reach http://127.0.0.1:9: Connection refused; try again"
    )


def test_a_squatted_template_name_is_a_conflict_not_a_grant(
    api: ApiServer, webhook: tuple[WebhookProcess, httpx.Client]
) -> None:
    """Someone made a template of gpuwire's name with another spec (asking for every GPU):
    the webhook does not point pods at it."""
    _, http = webhook
    answer = review(http, pod(ASK), dry_run=True)
    name = decode_patch(answer)[-1]["value"][0]["resourceClaimTemplateName"]
    greedy = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.gpuwire.io", "allocationMode": "All"}}]}}  # fmt: skip
    api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": name, "namespace": NAMESPACE},
             "spec": {"spec": greedy}})  # fmt: skip
    denied = review(http, pod(ASK))["response"]
    assert not denied["allowed"]
    assert denied["status"]["code"] == 409
    assert "exists with another spec" in denied["status"]["message"]


def test_two_replicas_racing_make_one_template(api: ApiServer, tmp_path: Path) -> None:
    files = make_files(tmp_path)
    files.policy.write_text(POLICY)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    args = files.args("--kubeconfig", str(kubeconfig), nodes=None)
    with serving(args) as one, serving(args) as two, https_client(one, files.tls.ca) as a, \
            https_client(two, files.tls.ca) as b:  # fmt: skip
        for http in (a, b):
            eventually(functools.partial(ready, http), "both replicas to be ready")
        raws = [pod(ASK) for _ in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: review((a, b)[i % 2], raws[i]), range(8)))
    assert all(r["response"]["allowed"] for r in answers)
    assert len(template_names(api)) == 1
    assert creates(api) >= 2  # both replicas tried; the loser found the winner's, the same


# --- the sweep and the Lease, in-process


@pytest.fixture
def apis(api: ApiServer) -> Iterator[tuple[Any, Any, Any]]:
    with api.client() as c:
        yield client.ResourceV1Api(c), client.CoreV1Api(c), client.CoordinationV1Api(c)


def made(api: ApiServer, name: str = "gpuwire-0123456789abcdef") -> dict[str, Any]:
    exactly = {"deviceClassName": "gpu.gpuwire.io", "allocationMode": "ExactCount", "count": 1}
    labels = {MANAGED_BY: "gpuwire", TEMPLATE_LABEL: name}
    spec = {"metadata": {"labels": labels},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}  # fmt: skip
    meta = {"name": name, "namespace": NAMESPACE, "labels": {MANAGED_BY: "gpuwire"}}
    return api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": meta, "spec": spec})  # fmt: skip


def annotations_of(api: ApiServer, name: str) -> dict[str, str] | None:
    found = api.get("resourceclaimtemplates", name, NAMESPACE)
    return None if found is None else dict(found["metadata"].get("annotations") or {})


def test_an_unused_template_is_marked_then_removed_a_grace_period_later(
    api: ApiServer, apis: tuple[Any, Any, Any]
) -> None:
    resource, core, _ = apis
    t = made(api)
    name = t["metadata"]["name"]
    now = time.time()
    assert sweep(resource, core, now, grace=600).marked == [f"{NAMESPACE}/{name}"]
    assert UNUSED in (annotations_of(api, name) or {})
    assert sweep(resource, core, now + 599, grace=600).deleted == []  # not yet
    assert sweep(resource, core, now + 601, grace=600).deleted == [f"{NAMESPACE}/{name}"]
    assert api.get("resourceclaimtemplates", name, NAMESPACE) is None


def test_a_template_a_claim_or_a_pod_uses_stays(api: ApiServer, apis: tuple[Any, Any, Any]) -> None:
    resource, core, _ = apis
    name = made(api)["metadata"]["name"]
    now = time.time()
    sweep(resource, core, now, grace=1)
    api.put({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "p-gpuwire-trainer-x7k2q", "namespace": NAMESPACE,
                          "labels": {TEMPLATE_LABEL: name}},
             "spec": {"devices": {"requests": []}}})  # fmt: skip
    assert sweep(resource, core, now + 10, grace=1).unmarked == [f"{NAMESPACE}/{name}"]
    api.delete("resourceclaims", "p-gpuwire-trainer-x7k2q", NAMESPACE)
    sweep(resource, core, now + 20, grace=1)  # marked again
    waiting = {"containers": [{"name": "c", "image": "x"}],
               "resourceClaims": [{"name": "g", "resourceClaimTemplateName": name}]}  # fmt: skip
    meta = {"name": "waiting", "namespace": NAMESPACE}
    api.put({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": waiting})
    done = sweep(resource, core, now + 30, grace=1)  # a pod whose claim is not made yet
    assert done.deleted == []
    assert done.unmarked == [f"{NAMESPACE}/{name}"]
    assert api.get("resourceclaimtemplates", name, NAMESPACE) is not None


def test_an_admission_unmarking_a_template_wins_over_its_deletion(
    api: ApiServer, apis: tuple[Any, Any, Any]
) -> None:
    """The Lease holder read a marked template; before it deletes it, an admission unmarks
    it: the delete carries the resourceVersion it read and fails; the template stays."""
    resource, core, _ = apis
    template = made(api)
    name = template["metadata"]["name"]
    now = time.time()
    sweep(resource, core, now, grace=1)
    known = TemplateWatch(resource)
    known.start()
    try:
        assert known.wait_synced(10)
        eventually(lambda: known.current.templates[(NAMESPACE, name)][1], "the mark to be seen")
        listed = resource.list_resource_claim_template_for_all_namespaces
        original = listed

        def read_then_unmarked(*args: Any, **kwargs: Any) -> Any:
            response = original(*args, **kwargs)
            store = TemplateStore(resource, known)  # the admission, between read and delete
            ours = json.loads(response.data)["items"][0]
            ours = {**ours, "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate"}
            assert store.ensure([ours], budget=5) is None
            return response

        resource.list_resource_claim_template_for_all_namespaces = read_then_unmarked
        done = sweep(resource, core, now + 10, grace=1)
    finally:
        known.stop()
    assert done.deleted == []
    assert api.get("resourceclaimtemplates", name, NAMESPACE) is not None
    assert UNUSED not in (annotations_of(api, name) or {})


def test_one_replica_leads_and_another_takes_over_when_it_leaves(
    api: ApiServer, apis: tuple[Any, Any, Any]
) -> None:
    _, _, coordination = apis
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuwire-system"}})
    work: dict[str, int] = {"a": 0, "b": 0}

    def replica(name: str) -> Leader:
        lease = Lease(coordination, "gpuwire-system", "gpuwire-webhook", name, duration=2.0,
                      renew_deadline=1.5)  # fmt: skip
        return Leader(lease, lambda: work.__setitem__(name, work[name] + 1), period=0.05,
                      retry=0.05)  # fmt: skip

    a, b = replica("a"), replica("b")
    a.start()
    eventually(lambda: work["a"] > 0, "a to lead")
    b.start()
    time.sleep(0.5)
    assert work["b"] == 0  # a renews: b stays a follower
    holder = api.get("leases", "gpuwire-webhook", "gpuwire-system")
    assert holder is not None
    assert holder["spec"]["holderIdentity"] == "a"
    a.stop()  # gives the Lease up
    eventually(lambda: work["b"] > 0, "b to take over", timeout=5)
    before = work["a"]
    time.sleep(0.3)
    assert work["a"] == before
    lease = api.get("leases", "gpuwire-webhook", "gpuwire-system")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    b.stop()


def test_a_leader_that_dies_without_leaving_is_replaced_after_the_lease_duration(
    api: ApiServer, apis: tuple[Any, Any, Any]
) -> None:
    _, _, coordination = apis
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuwire-system"}})
    dead = Lease(coordination, "gpuwire-system", "gpuwire-webhook", "dead", duration=1.0)
    assert dead.try_acquire_or_renew()
    alive = Lease(coordination, "gpuwire-system", "gpuwire-webhook", "alive", duration=1.0)
    assert not alive.try_acquire_or_renew()  # held, and fresh as this candidate sees it
    time.sleep(1.1)
    assert alive.try_acquire_or_renew()
    assert not dead.try_acquire_or_renew()  # the old holder finds it taken


def test_slices_and_templates_an_api_server_does_not_serve_count_as_none(api: ApiServer) -> None:
    """Before Kubernetes 1.34 there is no `resource.k8s.io/v1`: 404. The watches are synced
    and empty (the webhook is ready; the DRA path finds no pools), and list again later."""
    for path in ("/apis/resource.k8s.io/v1/resourceslices",
                 "/apis/resource.k8s.io/v1/resourceclaimtemplates"):  # fmt: skip
        api.fail("GET", path, 404, times=1)
    resource = client.ResourceV1Api(api.client())
    slices, known = SliceWatch(resource), TemplateWatch(resource)
    for watched in (slices, known):
        watched.start()
    try:
        assert slices.wait_synced(10)
        assert known.wait_synced(10)
        assert slices.current.nodes == {}
        assert known.current.templates == {}
    finally:
        slices.stop()
        known.stop()


def test_only_a_template_the_watch_shows_as_it_is_and_unmarked_counts_as_made() -> None:
    spec = {"spec": {"devices": {"requests": [{"name": "gpus"}]}}}
    template = {"metadata": {"namespace": NAMESPACE, "name": "gpuwire-1"}, "spec": spec}
    other = {"metadata": {"namespace": NAMESPACE, "name": "gpuwire-2"}, "spec": spec}

    def store(stored: dict[str, Any], marked: bool) -> TemplateStore:
        known = Known({(NAMESPACE, "gpuwire-1"): (stored, marked)})
        return TemplateStore(client.ResourceV1Api(), SimpleNamespace(current=known))

    assert store(spec, marked=False).made([template])
    assert not store(spec, marked=False).made([template, other])  # one not there
    assert not store(spec, marked=True).made([template])  # to be unmarked
    assert not store({"spec": {}}, marked=False).made([template])  # a squatter's: a conflict
