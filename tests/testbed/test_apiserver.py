"""The kube-apiserver stand-in, driven through the real `kubernetes` client as components do."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, config, watch
from kubernetes.client import ApiException

from testbed.apiserver import ApiServer

Obj = dict[str, Any]


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


@pytest.fixture
def core(api: ApiServer) -> Iterator[Any]:
    with api.client() as api_client:
        yield core_v1(api_client)


def core_v1(api_client: Any) -> Any:
    """The client's typed API, untyped here: tests pass plain dicts, as callers may."""
    return client.CoreV1Api(api_client)


def new_watch() -> Any:
    return watch.Watch()  # type: ignore[no-untyped-call]


def pod(name: str, labels: dict[str, str] | None = None, node: str = "") -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "busybox"}]}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec | {"nodeName": node}}


def failure(call: Callable[[], object]) -> Obj:
    """The metav1.Status a failing call got back, with the HTTP status checked against it."""
    with pytest.raises(ApiException) as caught:
        call()
    status: Obj = json.loads(caught.value.body or "")
    assert (status["kind"], status["status"], status["code"]) == (
        "Status",
        "Failure",
        caught.value.status,
    )
    return status


def events(func: Callable[..., Any], count: int, **kwargs: Any) -> list[tuple[str, str, int]]:
    """The first `count` watch events as (type, name, resourceVersion); a stream that ends early
    (timeoutSeconds) returns fewer."""
    seen: list[tuple[str, str, int]] = []
    stream = new_watch()
    for event in stream.stream(func, timeout_seconds=10, **kwargs):
        meta = event["object"].metadata
        seen.append((event["type"], meta.name, int(meta.resource_version)))
        if len(seen) == count:
            stream.stop()
    return seen


def test_discovery_documents_satisfy_the_client(api: ApiServer, core: Any) -> None:
    api_client = core.api_client
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    groups = {g.name for g in client.ApisApi(api_client).get_api_versions().groups}
    assert {"admissionregistration.k8s.io", "coordination.k8s.io"} <= groups
    resources = {r.name: r for r in core.get_api_resources().resources}
    assert resources["pods"].namespaced
    assert not resources["nodes"].namespaced
    assert {"pods/status", "nodes/status"} <= set(resources)
    admission = client.AdmissionregistrationV1Api(api_client).get_api_resources()
    assert "mutatingwebhookconfigurations" in {r.name for r in admission.resources}
    assert client.VersionApi(api_client).get_code().major == "1"
    unknown = httpx.get(f"{api.url}/api/v1/gpus")
    assert unknown.status_code == 404
    assert unknown.json()["message"] == "the server could not find the requested resource"


def test_create_sets_server_fields_and_get_list_return_the_object(core: Any) -> None:
    created = core.create_namespaced_pod("default", pod("") | {"metadata": {"generateName": "w-"}})
    meta = created.metadata
    assert meta.name.startswith("w-")
    assert len(meta.name) == 7
    assert meta.uid
    assert meta.creation_timestamp
    assert meta.generation == 1
    assert created.status.phase == "Pending"
    assert core.read_namespaced_pod(meta.name, "default") == created
    listed = core.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == [meta.name]
    assert int(listed.metadata.resource_version) >= int(meta.resource_version)


def test_failed_creates_answer_in_the_apiservers_words_and_change_nothing(
    api: ApiServer, core: Any
) -> None:
    core.create_namespaced_pod("default", pod("a"))
    version = api.resource_version
    exists = failure(lambda: core.create_namespaced_pod("default", pod("a")))
    assert (exists["reason"], exists["message"]) == ("AlreadyExists", 'pods "a" already exists')
    assert exists["details"] == {"name": "a", "kind": "pods"}
    missing = failure(lambda: core.create_namespaced_pod("gpu-team", pod("a")))
    assert (missing["code"], missing["message"]) == (404, 'namespaces "gpu-team" not found')
    bad_name = failure(lambda: core.create_namespaced_pod("default", pod("Trainer_1")))
    assert bad_name["reason"] == "Invalid"
    assert bad_name["message"].startswith(
        'Pod "Trainer_1" is invalid: metadata.name: Invalid value'
    )
    assert bad_name["details"]["causes"][0]["field"] == "metadata.name"
    label = {"nvidia.com/gpu.product": "NVIDIA A100-SXM4-40GB"}  # a space: not a label value
    bad_label = failure(lambda: core.create_namespaced_pod("default", pod("b", label)))
    assert (bad_label["code"], bad_label["details"]["causes"][0]["field"]) == (
        422,
        "metadata.labels",
    )
    assert "nvidia.com/gpu.product=NVIDIA A100-SXM4-40GB" in bad_label["message"]
    other_ns = pod("c") | {"metadata": {"name": "c", "namespace": "kube-system"}}
    wrong_ns = failure(lambda: core.create_namespaced_pod("default", other_ns))
    assert wrong_ns["reason"] == "BadRequest"
    assert "namespace" in wrong_ns["message"]
    assert api.resource_version == version
    assert [p["metadata"]["name"] for p in api.objects("pods")] == ["a"]


def test_replace_is_optimistic_and_a_no_op_changes_nothing(api: ApiServer, core: Any) -> None:
    body = {"metadata": {"name": "gpuwire-ca"}, "data": {"ca.crt": "b2xk"}}
    first = core.create_namespaced_secret("default", body)
    second = core.replace_namespaced_secret(
        "gpuwire-ca", "default", first.to_dict() | {"data": {"ca.crt": "bmV3"}}
    )
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert second.metadata.uid == first.metadata.uid
    stale = first.to_dict() | {"data": {"ca.crt": "c3RhbGU="}}
    conflict = failure(lambda: core.replace_namespaced_secret("gpuwire-ca", "default", stale))
    assert conflict["reason"] == "Conflict"
    assert conflict["message"] == (
        'Operation cannot be fulfilled on secrets "gpuwire-ca": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    version = api.resource_version
    again = core.replace_namespaced_secret("gpuwire-ca", "default", second)
    assert again.metadata.resource_version == second.metadata.resource_version
    assert api.resource_version == version
    unconditional = second.to_dict()
    unconditional["metadata"]["resource_version"] = None
    unconditional["data"] = {"ca.crt": "eA=="}
    assert core.replace_namespaced_secret("gpuwire-ca", "default", unconditional).data == {
        "ca.crt": "eA=="
    }


def test_concurrent_replaces_exactly_one_wins_per_version(api: ApiServer) -> None:
    leader = {"name": "leader", "namespace": "default"}
    api.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": leader})
    writers, rounds = 6, 5
    barrier = threading.Barrier(writers)
    outcomes: list[tuple[int, str, int]] = []

    def write(who: int) -> None:
        with api.client() as api_client:
            core = core_v1(api_client)
            for round_ in range(rounds):
                current = core.read_namespaced_config_map("leader", "default")
                barrier.wait()  # everyone holds the same version before anyone writes
                current.data = {"holder": f"{who}@{round_}"}  # never a no-op write
                try:
                    core.replace_namespaced_config_map("leader", "default", current)
                    outcomes.append((round_, "won", who))
                except ApiException as e:
                    outcomes.append((round_, json.loads(e.body or "")["reason"], who))
                barrier.wait()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for round_ in range(rounds):
        results = sorted(result for r, result, _ in outcomes if r == round_)
        assert results == ["Conflict"] * (writers - 1) + ["won"]
    last_winner = next(who for r, result, who in outcomes if (r, result) == (rounds - 1, "won"))
    stored = api.get("configmaps", "leader", "default")
    assert stored is not None
    assert stored["data"] == {"holder": f"{last_winner}@{rounds - 1}"}


def test_patch_types(api: ApiServer, core: Any) -> None:
    core.create_node({"metadata": {"name": "gpu-1", "labels": {"stale": "x"}}})
    merged = core.patch_node(
        "gpu-1",
        {"metadata": {"labels": {"stale": None, "nvidia.com/gpu.count": "4"}}},
        _content_type="application/merge-patch+json",
    )
    assert merged.metadata.labels == {"nvidia.com/gpu.count": "4"}
    ready = {"type": "Ready", "status": "True"}
    core.patch_node_status(
        "gpu-1", {"status": {"conditions": [ready, {"type": "Gpu", "status": "True"}]}}
    )
    strategic = core.patch_node_status(
        "gpu-1", {"status": {"conditions": [{"type": "Gpu", "status": "False"}]}}
    )  # the client's default for an object body: strategic merge, conditions merge by type
    assert [(c.type, c.status) for c in strategic.status.conditions] == [
        ("Ready", "True"),
        ("Gpu", "False"),
    ]
    annotation = [{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}]
    assert core.patch_node("gpu-1", annotation).metadata.annotations == {"a": "1"}
    version = api.resource_version
    failing = [{"op": "test", "path": "/metadata/name", "value": "gpu-2"}]
    assert failure(lambda: core.patch_node("gpu-1", failing))["code"] == 422
    apply = failure(
        lambda: core.patch_node("gpu-1", {}, _content_type="application/apply-patch+yaml")
    )
    assert apply["reason"] == "UnsupportedMediaType"
    assert "server-side apply" in apply["message"]
    stale = {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}}
    assert failure(lambda: core.patch_node("gpu-1", stale))["reason"] == "Conflict"
    assert api.resource_version == version


def test_status_subresource_owns_status_and_the_resource_owns_spec(core: Any) -> None:
    core.create_node({"metadata": {"name": "gpu-1"}, "spec": {"podCIDR": "10.0.0.0/24"}})
    four = {"status": {"capacity": {"nvidia.com/gpu": "4"}}}
    spec = {"spec": {"podCIDR": "10.9.9.0/24"}, "metadata": {"labels": {"gpu": "true"}}}
    status = core.patch_node_status("gpu-1", four | spec)
    assert status.status.capacity == {"nvidia.com/gpu": "4"}
    assert status.spec.pod_cidr == "10.0.0.0/24"
    assert status.metadata.labels == {"gpu": "true"}
    assert status.metadata.generation == 1
    eight = {"status": {"capacity": {"nvidia.com/gpu": "8"}}}
    node = core.patch_node("gpu-1", eight | {"spec": {"unschedulable": True}})
    assert node.status.capacity == {"nvidia.com/gpu": "4"}
    assert node.spec.unschedulable
    assert node.metadata.generation == 2


def test_delete(api: ApiServer, core: Any) -> None:
    secret = core.create_namespaced_secret("default", {"metadata": {"name": "s"}})
    gone = core.delete_namespaced_secret("s", "default")
    assert (gone["status"], gone["details"]["uid"]) == ("Success", secret.metadata.uid)
    missing = failure(lambda: core.delete_namespaced_secret("s", "default"))
    assert (missing["reason"], missing["message"]) == ("NotFound", 'secrets "s" not found')
    created = core.create_namespaced_pod("default", pod("p"))
    wrong = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-it"))
    precondition = failure(lambda: core.delete_namespaced_pod("p", "default", body=wrong))
    assert precondition["reason"] == "Conflict"
    assert "Precondition failed" in precondition["message"]
    deleted = core.delete_namespaced_pod("p", "default")  # pods answer with the object
    assert deleted.metadata.uid == created.metadata.uid
    core.create_namespace({"metadata": {"name": "team"}})
    core.create_namespaced_config_map("team", {"metadata": {"name": "c"}})
    core.delete_namespace("team")
    assert api.objects("configmaps", "team") == []
    assert api.get("namespaces", "team") is None


def test_a_namespace_with_running_pods_terminates_until_the_kubelet_finishes_them() -> None:
    """As the namespace controller and NamespaceLifecycle admission do: its other contents
    go at once, its pods gracefully; it stays Terminating, refusing new content, until the
    kubelet's final delete of its last pod (an uninstall waiting for "pods gone" waits for
    their containers, not for a record that vanished first)."""
    with ApiServer(graceful_delete=True) as api, api.client() as api_client:
        core = core_v1(api_client)
        core.create_namespace({"metadata": {"name": "team"}})
        core.create_namespaced_config_map("team", {"metadata": {"name": "c"}})
        core.create_namespaced_pod("team", pod("p", node="gpu-node-0"))
        core.delete_namespace("team")
        assert api.objects("configmaps", "team") == []
        marked = api.get("pods", "p", "team")
        assert marked is not None
        assert marked["metadata"]["deletionTimestamp"]
        space = api.get("namespaces", "team")
        assert space is not None
        assert space["status"]["phase"] == "Terminating"
        refused = failure(lambda: core.create_namespaced_pod("team", pod("q")))
        assert (refused["code"], refused["reason"]) == (403, "Forbidden")
        assert "being terminated" in refused["message"]
        final = client.V1DeleteOptions(grace_period_seconds=0)  # the kubelet's
        core.delete_namespaced_pod("p", "team", body=final)
        assert api.get("namespaces", "team") is None


def test_watch_resumes_from_a_version_and_sees_every_change_in_order(core: Any) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    core.create_namespaced_config_map("default", {"metadata": {"name": "not-a-pod"}})
    middle = core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("b", "default")
    core.create_namespaced_pod("kube-system", pod("elsewhere"))
    seen = events(core.list_namespaced_pod, 4, namespace="default", resource_version=start)
    assert [(kind, name) for kind, name, _ in seen] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [version for _, _, version in seen]
    assert versions == sorted(set(versions))
    assert versions[0] > int(start)
    later = middle.metadata.resource_version
    resumed = events(core.list_pod_for_all_namespaces, 2, resource_version=later)
    assert [(kind, name) for kind, name, _ in resumed] == [("DELETED", "b"), ("ADDED", "elsewhere")]


def test_watch_without_a_version_starts_with_the_current_state(core: Any) -> None:
    core.create_node({"metadata": {"name": "gpu-1"}})
    seen: list[tuple[str, str]] = []
    stream = new_watch()
    for event in stream.stream(core.list_node, timeout_seconds=10):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:  # the state is in; what changes next follows on the same stream
            core.create_node({"metadata": {"name": "gpu-2"}})
        else:
            stream.stop()
    assert seen == [("ADDED", "gpu-1"), ("ADDED", "gpu-2")]


def test_watch_from_a_compacted_version_gets_410_expired() -> None:
    with ApiServer(history=3) as small, small.client() as api_client:
        nodes = core_v1(api_client)
        start = nodes.list_node().metadata.resource_version
        for i in range(4):
            nodes.create_node({"metadata": {"name": f"gpu-{i}"}})
        with pytest.raises(ApiException) as caught:
            events(nodes.list_node, 1, resource_version=start)
        assert caught.value.status == 410
        raw = nodes.list_node(watch=True, resource_version=start, _preload_content=False)
        error = json.loads(raw.data.decode().splitlines()[0])
        assert error["type"] == "ERROR"
        assert (error["object"]["reason"], error["object"]["code"]) == ("Expired", 410)
        assert error["object"]["message"] == f"too old resource version: {start} ({int(start) + 1})"
        recent = nodes.list_node().metadata.resource_version
        small.compact()
        nodes.create_node({"metadata": {"name": "gpu-9"}})
        with pytest.raises(ApiException, match="Expired"):
            events(nodes.list_node, 1, resource_version=start)
        assert events(nodes.list_node, 1, resource_version=recent)[0][:2] == ("ADDED", "gpu-9")


PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


def pages(nodes: Any, limit: int, between: Callable[[], object] = lambda: None) -> list[Obj]:
    """Every page of the node list, `between` run after each but the last."""
    found: list[Obj] = []
    token = None
    while True:
        raw = nodes.list_node(limit=limit, _continue=token, _preload_content=False)
        found.append(json.loads(raw.data))
        token = found[-1]["metadata"].get("continue")
        if not token:
            return found
        between()


def test_a_list_in_chunks_is_the_snapshot_of_its_first_page(api: ApiServer, core: Any) -> None:
    for i in range(7):
        core.create_node({"metadata": {"name": f"gpu-{i}"}})
    changes = iter(range(100))

    def meanwhile() -> None:
        i = next(changes)
        core.create_node({"metadata": {"name": f"gpu-{i}a"}})  # sorts inside the listed range
        core.delete_node(f"gpu-{6 - i}")
        core.patch_node("gpu-0", {"metadata": {"labels": {"seen": str(i)}}})

    listed = pages(core, 3, meanwhile)
    names = [n["metadata"]["name"] for page in listed for n in page["items"]]
    assert names == [f"gpu-{i}" for i in range(7)]
    assert [len(page["items"]) for page in listed] == [3, 3, 1]
    assert {page["metadata"]["resourceVersion"] for page in listed} == {
        listed[0]["metadata"]["resourceVersion"]
    }
    assert [page["metadata"].get("remainingItemCount") for page in listed] == [4, 1, None]
    assert "labels" not in listed[0]["items"][0]["metadata"]  # gpu-0 as it was then
    assert len(core.list_node().items) == 7 + 2 - 2


def test_a_continue_token_the_history_no_longer_reaches_is_410_expired() -> None:
    with ApiServer(history=3) as small, small.client() as api_client:
        nodes = core_v1(api_client)
        for i in range(4):
            nodes.create_node({"metadata": {"name": f"gpu-{i}"}})
        first = json.loads(nodes.list_node(limit=2, _preload_content=False).data)
        token = first["metadata"]["continue"]
        nodes.create_node({"metadata": {"name": "gpu-9"}})  # one change: still consistent
        second = json.loads(nodes.list_node(limit=2, _continue=token, _preload_content=False).data)
        assert [n["metadata"]["name"] for n in second["items"]] == ["gpu-2", "gpu-3"]
        small.compact()
        expired = failure(lambda: nodes.list_node(limit=2, _continue=token))
        assert (expired["code"], expired["reason"]) == (410, "Expired")
        assert expired["message"].startswith("The provided continue parameter is too old")
        invalid = failure(lambda: nodes.list_node(limit=2, _continue="not-a-token"))
        assert (invalid["code"], invalid["message"]) == (
            400,
            "continue key is not valid: 'not-a-token'",
        )


def test_metadata_only_lists_watches_and_gets(api: ApiServer, core: Any) -> None:
    node = {"metadata": {"name": "gpu-1", "labels": {"a": "b"}}, "status": {"capacity": {"x": "1"}}}
    start = core.list_node().metadata.resource_version
    core.create_node(node)
    listed = json.loads(
        core.list_node(_preload_content=False, _headers={"Accept": PARTIAL_LIST}).data
    )
    assert (listed["kind"], listed["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    (item,) = listed["items"]
    assert set(item) == {"kind", "apiVersion", "metadata"}
    assert (item["kind"], item["metadata"]["labels"]) == ("PartialObjectMetadata", {"a": "b"})
    got = json.loads(
        core.read_node("gpu-1", _preload_content=False, _headers={"Accept": PARTIAL}).data
    )
    assert set(got) == {"kind", "apiVersion", "metadata"}
    raw = core.list_node(
        watch=True, resource_version=start, timeout_seconds=1, _preload_content=False,
        _headers={"Accept": PARTIAL},
    )  # fmt: skip
    event = json.loads(raw.data.decode().splitlines()[0])
    assert (event["type"], event["object"]["kind"]) == ("ADDED", "PartialObjectMetadata")
    assert "status" not in event["object"]
    full = json.loads(core.list_node(_preload_content=False).data)
    assert full["kind"] == "NodeList"
    assert full["items"][0]["status"] == {"capacity": {"x": "1"}}
    refused = failure(lambda: core.list_node(_headers={"Accept": PARTIAL.split(",")[0]}))
    assert (refused["code"], refused["reason"]) == (406, "NotAcceptable")


def test_watch_with_a_selector_sees_objects_enter_and_leave_it(core: Any) -> None:
    start = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("p", {"pool": "a100"}))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"pool": "h100"}}})
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"pool": "a100"}}})
    seen = events(
        core.list_namespaced_pod,
        3,
        namespace="default",
        label_selector="pool=a100",
        resource_version=start,
    )
    assert [(kind, name) for kind, name, _ in seen] == [
        ("ADDED", "p"),
        ("DELETED", "p"),
        ("ADDED", "p"),
    ]


def test_bookmarks_carry_the_current_version() -> None:
    with ApiServer(bookmark_interval=0.05) as api, api.client() as api_client:
        core = core_v1(api_client)
        stream = new_watch()
        for event in stream.stream(core.list_node, allow_watch_bookmarks=True, timeout_seconds=10):
            assert event["type"] == "BOOKMARK"
            assert event["raw_object"]["metadata"]["resourceVersion"] == api.resource_version
            stream.stop()
        assert stream.resource_version == api.resource_version


def test_closed_watches_are_resumed_by_the_client_from_the_last_version(
    api: ApiServer, core: Any
) -> None:
    start = core.list_node().metadata.resource_version
    stream = new_watch()
    seen: list[str] = []

    def watch_nodes() -> None:  # no timeout: the client reconnects when the server ends it
        for event in stream.stream(core.list_node, resource_version=start):
            seen.append(event["object"].metadata.name)
            if event["object"].metadata.name == "gpu-1":
                api.close_watches()
                core.create_node({"metadata": {"name": "gpu-2"}})
            else:
                stream.stop()

    core.create_node({"metadata": {"name": "gpu-1"}})
    watch_nodes()
    assert seen == ["gpu-1", "gpu-2"]
    resumed = [r.query.get("resourceVersion") for r in api.requests if r.query.get("watch")]
    first = api.get("nodes", "gpu-1")
    assert first is not None
    assert resumed == [start, first["metadata"]["resourceVersion"]]


def test_leaving_the_context_ends_open_watches() -> None:
    failures: list[Exception] = []
    with ApiServer() as server, server.client() as api_client:
        core = core_v1(api_client)
        start = core.list_node().metadata.resource_version

        def watch_nodes() -> None:  # no timeout: it would watch, and reconnect, for ever
            try:
                for _ in new_watch().stream(core.list_node, resource_version=start):
                    pass
            except Exception as e:  # the reconnect finds nothing listening
                failures.append(e)

        thread = threading.Thread(target=watch_nodes, daemon=True)
        thread.start()
        while not any(r.query.get("watch") for r in server.requests):
            time.sleep(0.01)
    thread.join(60)
    assert not thread.is_alive()
    assert "Connection refused" in str(failures)


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("app in (web, db)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app=web,tier", ["a"]),
        ("app in (web,db),!tier", ["b"]),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors(api: ApiServer, core: Any, selector: str, names: list[str]) -> None:
    labels = {
        "a": {"app": "web", "tier": "front"},
        "b": {"app": "web"},
        "c": {"app": "db", "tier": "back"},
    }
    for name in "abcd":
        core.create_namespaced_pod("default", pod(name, labels.get(name)))
    found = core.list_namespaced_pod("default", label_selector=selector).items
    assert [p.metadata.name for p in found] == names


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("spec.nodeName=gpu-1", ["a", "c"]),
        ("spec.nodeName!=gpu-1", ["b"]),
        ("status.phase=Running", ["c"]),
        ("metadata.name=b", ["b"]),
        ("metadata.namespace=default,spec.nodeName==gpu-1", ["a", "c"]),
    ],
)
def test_field_selectors(api: ApiServer, core: Any, selector: str, names: list[str]) -> None:
    core.create_namespaced_pod("default", pod("a", node="gpu-1"))
    core.create_namespaced_pod("default", pod("b", node="gpu-2"))
    running = pod("c", node="gpu-1") | {"status": {"phase": "Running"}}
    api.put(
        running
        | {"apiVersion": "v1", "kind": "Pod"}
        | {"metadata": {"name": "c", "namespace": "default"}}
    )
    found = core.list_pod_for_all_namespaces(field_selector=selector).items
    assert [p.metadata.name for p in found] == names


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("labelSelector=app%20in%20web", "unable to parse requirement"),
        ("labelSelector=a%20b", "unable to parse requirement"),
        ("fieldSelector=spec.gpu%3D1", "field label not supported: spec.gpu"),
        ("fieldSelector=spec.nodeName", "invalid field selector"),
        ("watch=true&resourceVersion=abc", "resourceVersion: Invalid value: 'abc'"),
    ],
)
def test_bad_list_parameters_are_400(api: ApiServer, query: str, message: str) -> None:
    answer = httpx.get(f"{api.url}/api/v1/pods?{query}")
    assert answer.status_code == 400
    assert answer.json()["reason"] == "BadRequest"
    assert message in answer.json()["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "code"),
    [
        ("POST", "/api/v1/namespaces/default/pods", b"{not json", {}, 400),
        ("POST", "/api/v1/namespaces/default/pods", b"[1]", {}, 400),
        ("POST", "/api/v1/pods", b'{"metadata": {"name": "a"}}', {}, 405),
        ("POST", "/api/v1/namespaces/default/configmaps", b'{"kind": "Secret"}', {}, 400),
        (
            "PATCH",
            "/api/v1/nodes/none",
            b"{}",
            {"Content-Type": "application/merge-patch+json"},
            404,
        ),
        ("PATCH", "/api/v1/namespaces/default", b"{}", {"Content-Type": "text/plain"}, 415),
        (
            "PATCH",
            "/api/v1/namespaces/default",
            b"{}",
            {"Content-Type": "application/json-patch+json"},
            400,
        ),
        ("PUT", "/api/v1/namespaces/default", b'{"metadata": {"name": "other"}}', {}, 400),
        ("GET", "/api/v1/namespaces/default/secrets/s/status", b"", {}, 404),
        ("GET", "/", b"", {}, 404),
        ("GET", "/apis/batch/v1/jobs", b"", {}, 404),
        ("POST", "/api/v1/namespaces?dryRun=All", b'{"metadata": {"name": "a"}}', {}, 400),
    ],
)
def test_malformed_requests_are_4xx_and_change_nothing(
    api: ApiServer, method: str, path: str, body: bytes, headers: dict[str, str], code: int
) -> None:
    version = api.resource_version
    answer = httpx.request(method, f"{api.url}{path}", content=body, headers=headers)
    assert (answer.status_code, answer.json()["kind"]) == (code, "Status")
    assert api.resource_version == version


def test_injected_faults_and_the_request_log(api: ApiServer, core: Any) -> None:
    api.fail("GET", "/api/v1/nodes", 503, times=2)
    api.fail("*", "/api/v1/namespaces/*/secrets/*", 500)
    api.fail("WATCH", "/api/v1/nodes", 500)
    for _ in range(2):
        assert failure(core.list_node)["reason"] == "ServiceUnavailable"
    assert core.list_node().items == []
    assert failure(lambda: core.read_namespaced_secret("s", "default"))["code"] == 500
    assert failure(lambda: core.read_namespaced_secret("s", "default"))["code"] == 404
    with pytest.raises(ApiException, match="500"):
        events(core.list_node, 1)
    core.create_node({"metadata": {"name": "gpu-1"}})
    core.patch_node("gpu-1", {"metadata": {"labels": {"a": "b"}}})
    core.patch_node("gpu-1", [{"op": "remove", "path": "/metadata/labels/a"}])
    log = [(r.method, r.path, r.content_type) for r in api.requests]
    assert log == [("GET", "/api/v1/nodes", "")] * 3 + [
        ("GET", "/api/v1/namespaces/default/secrets/s", ""),
        ("GET", "/api/v1/namespaces/default/secrets/s", ""),
        ("GET", "/api/v1/nodes", ""),  # the failed watch
        ("POST", "/api/v1/nodes", ""),  # the client sends JSON without saying so
        ("PATCH", "/api/v1/nodes/gpu-1", "application/strategic-merge-patch+json"),
        ("PATCH", "/api/v1/nodes/gpu-1", "application/json-patch+json"),
    ]


def test_hooks_seed_and_inspect_without_http(api: ApiServer, core: Any) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}
    stored = api.put(node | {"status": {"capacity": {"nvidia.com/gpu": "8"}}})
    assert core.read_node("gpu-1").status.capacity == {"nvidia.com/gpu": "8"}
    api.put(node | {"status": {"capacity": {"nvidia.com/gpu": "7"}}})
    seen = events(core.list_node, 1, resource_version=stored["metadata"]["resourceVersion"])
    assert seen[0][:2] == ("MODIFIED", "gpu-1")
    assert [n["metadata"]["name"] for n in api.objects("nodes")] == ["gpu-1"]
    api.delete("nodes", "gpu-1")
    assert api.get("nodes", "gpu-1") is None
    assert api.requests[-1].query.get("watch") == "true"
    with pytest.raises(ValueError, match="accepted"):
        api.put({"apiVersion": "v1", "kind": "Gpu", "metadata": {"name": "x"}})
    with pytest.raises(ValueError, match="unknown resource 'gpus'"):
        api.objects("gpus")


def test_kubeconfig_and_other_groups(api: ApiServer, tmp_path: Path) -> None:
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(api.write_kubeconfig(tmp_path / "kc"))
    )
    with api_client:
        admission: Any = client.AdmissionregistrationV1Api(api_client)
        webhook = {
            "name": "pods.gpuwire.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "gpuwire", "namespace": "gpuwire-system"}},
        }
        admission.create_mutating_webhook_configuration(
            {"metadata": {"name": "gpuwire"}, "webhooks": [webhook]}
        )
        ca = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}]
        patched = admission.patch_mutating_webhook_configuration("gpuwire", ca)
        assert patched.webhooks[0].client_config.ca_bundle == "Q0E="
        leases: Any = client.CoordinationV1Api(api_client)
        lease = leases.create_namespaced_lease("kube-node-lease", {"metadata": {"name": "gpu-1"}})
        lease.spec = {"holderIdentity": "gpu-1"}
        leases.replace_namespaced_lease("gpu-1", "kube-node-lease", lease)
        stale = failure(lambda: leases.replace_namespaced_lease("gpu-1", "kube-node-lease", lease))
        assert stale["message"].startswith(
            'Operation cannot be fulfilled on leases.coordination.k8s.io "gpu-1"'
        )
