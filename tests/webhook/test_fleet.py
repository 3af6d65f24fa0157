"""The watch-backed node fleet, driven through the real `kubernetes` client against the
list/watch stand-in (testbed/apiserver.py), and the webhook serving from it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.agent import labels as plugin_labels
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from deviceplugin.plugin.resources import assign
from gpuwire import annotations as a
from gpuwire import nodegpus, sim
from testbed.apiserver import ApiServer
from testbed.webhook import serving
from tests.webhook.support import EXAMPLES, client, container, eventually, make_files, pod
from webhook import fleet
from webhook.placement import place
from webhook.review import request_for
from webhook.watch import NodeWatch

NODES: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "nodes.yaml").read_text())["items"]


def node(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(n for n in NODES if n["metadata"]["name"] == name))


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(history=2) as server:
        yield server


@pytest.fixture
def watched(api: ApiServer) -> Iterator[NodeWatch]:
    from kubernetes import client

    with api.client() as api_client:
        nodes = NodeWatch(client.CoreV1Api(api_client), timeout_seconds=5)
        nodes.start()
        yield nodes
        nodes.stop()


def names(nodes: NodeWatch) -> list[str]:
    return [n.name for n in nodes.current.nodes]


def test_the_first_list_makes_it_ready_and_holds_only_gpu_nodes(api: ApiServer) -> None:
    from kubernetes import client

    for name in ("gpu-t4-0", "cpu-0"):
        api.put(node(name))
    with api.client() as api_client:
        nodes = NodeWatch(client.CoreV1Api(api_client))
        assert not nodes.synced
        nodes.start()
        try:
            assert nodes.wait_synced(10)
            assert names(nodes) == ["gpu-t4-0"]
            assert nodes.current.nodes[0].gpu_count == 2
        finally:
            nodes.stop()


def test_nodes_added_changed_and_deleted_are_followed(api: ApiServer, watched: NodeWatch) -> None:
    assert watched.wait_synced(10)
    assert names(watched) == []
    api.put(node("gpu-h100-0"))
    api.put(node("gpu-t4-0"))
    eventually(lambda: names(watched) == ["gpu-h100-0", "gpu-t4-0"], "two nodes")
    relabelled = node("gpu-t4-0")
    relabelled["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-L4"
    api.put(relabelled)
    eventually(
        lambda: (
            [n.product for n in watched.current.nodes] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"]
        ),
        "relabel",
    )
    api.delete("nodes", "gpu-h100-0")
    eventually(lambda: names(watched) == ["gpu-t4-0"], "deletion")


def test_closed_watches_resume_and_miss_nothing(api: ApiServer, watched: NodeWatch) -> None:
    assert watched.wait_synced(10)
    for _ in range(3):
        api.close_watches()
        api.put(node("gpu-a100-40g-0"))
        api.delete("nodes", "gpu-a100-40g-0")
    api.put(node("gpu-a100-80g-0"))
    eventually(lambda: names(watched) == ["gpu-a100-80g-0"], "the last state")


def test_a_watch_that_falls_behind_the_history_ends_consistent(
    api: ApiServer, watched: NodeWatch
) -> None:
    """History 2: a burst of changes outruns it; on 410 Expired the watch lists again."""
    assert watched.wait_synced(10)
    for i in range(30):
        renamed = node("gpu-t4-0")
        renamed["metadata"]["name"] = f"gpu-t4-{i}"
        api.put(renamed)
    for i in range(0, 30, 2):
        api.delete("nodes", f"gpu-t4-{i}")
    expected = sorted(f"gpu-t4-{i}" for i in range(1, 30, 2))
    eventually(lambda: names(watched) == expected, "the state after the burst")


def test_the_list_comes_in_pages_of_metadata_and_the_watch_follows_its_version(
    api: ApiServer,
) -> None:
    from kubernetes import client

    for i in range(5):
        renamed = node("gpu-t4-0")
        renamed["metadata"]["name"] = f"gpu-t4-{i}"
        api.put(renamed | {"status": {"images": [{"names": ["big"], "sizeBytes": 1}]}})
    api.put(node("cpu-0"))
    with api.client() as api_client:
        nodes = NodeWatch(client.CoreV1Api(api_client), page=2)
        nodes.start()
        try:
            assert nodes.wait_synced(10)
            assert names(nodes) == [f"gpu-t4-{i}" for i in range(5)]
            eventually(lambda: any(r.query.get("watch") for r in api.requests), "the watch")
        finally:
            nodes.stop()
    lists = [r for r in api.requests if r.path == "/api/v1/nodes" and not r.query.get("watch")]
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    assert [bool(r.query.get("continue")) for r in lists] == [False, True, True]
    assert all("as=PartialObjectMetadataList;g=meta.k8s.io;v=v1" in r.accept for r in lists)
    watch = next(r for r in api.requests if r.query.get("watch"))
    assert "as=PartialObjectMetadata;g=meta.k8s.io;v=v1" in watch.accept
    assert watch.query["resourceVersion"] == api.resource_version  # the list's, nothing missed


def test_an_expired_continue_token_lists_again_from_the_start(api: ApiServer) -> None:
    """The history gone between two pages (etcd compacted): 410 on the second page; the
    list starts over and holds what changed meanwhile, never half of either list."""
    from kubernetes import client

    for name in ("gpu-a100-40g-0", "gpu-a100-80g-0", "gpu-h100-0"):
        api.put(node(name))
    with api.client() as api_client:
        core = client.CoreV1Api(api_client)
        compacted: list[str] = []

        class Compacting:
            def list_node(self, **query: Any) -> Any:
                if query.get("_continue") and not compacted:
                    api.delete("nodes", "gpu-h100-0")
                    api.put(node("gpu-t4-0"))
                    api.compact()
                    compacted.append(query["_continue"])
                return core.list_node(**query)

        nodes = NodeWatch(Compacting(), page=2)
        nodes.start()
        try:
            assert nodes.wait_synced(10)
            assert names(nodes) == ["gpu-a100-40g-0", "gpu-a100-80g-0", "gpu-t4-0"]
        finally:
            nodes.stop()
    pages = [r.query.get("continue", "") for r in api.requests if r.path == "/api/v1/nodes"]
    assert pages[:4] == ["", compacted[0], "", pages[3]]  # the 410, then a new list


def test_a_heartbeat_keeps_the_node_view_and_a_gpu_change_replaces_it(
    api: ApiServer, watched: NodeWatch
) -> None:
    api.put(node("gpu-t4-0"))
    eventually(lambda: names(watched) == ["gpu-t4-0"], "the node")
    seen = watched.current.nodes[0]
    beating = node("gpu-t4-0") | {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    api.put(beating)
    api.put(node("gpu-h100-0"))
    eventually(lambda: names(watched) == ["gpu-h100-0", "gpu-t4-0"], "the second node")
    assert watched.current.nodes[1] is seen
    sick = node("gpu-t4-0")
    annotations = sick["metadata"]["annotations"]
    gpus = nodegpus.decode(annotations[fleet.GPUS_ANNOTATION])
    annotations[fleet.GPUS_ANNOTATION] = nodegpus.encode(
        [replace(gpus[0], healthy=False), *gpus[1:]]
    )
    api.put(sick)
    eventually(lambda: not watched.current.nodes[1].gpus[0].healthy, "the sick GPU")


def test_api_errors_are_retried_until_the_list_succeeds(api: ApiServer) -> None:
    from kubernetes import client

    api.put(node("gpu-t4-0"))
    api.fail("GET", "/api/v1/nodes", 503, times=2)
    with api.client() as api_client:
        nodes = NodeWatch(client.CoreV1Api(api_client))
        nodes.start()
        try:
            assert nodes.wait_synced(15)
            assert names(nodes) == ["gpu-t4-0"]
        finally:
            nodes.stop()


def test_the_webhook_serves_from_the_watch(api: ApiServer, tmp_path: Path) -> None:
    files = make_files(tmp_path)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    a100 = pod({a.MODEL: "A100"}, [container(gpus=1)])
    with (
        serving(files.args("--kubeconfig", str(kubeconfig), nodes=None)) as served,
        client(served, files.tls.ca) as http,
    ):
        eventually(lambda: http.get("/readyz").status_code == 200, "readiness")

        def allowed() -> bool:
            reply = http.post("/mutate", json=request_for(a100, "ml-research")).json()
            return bool(reply["response"]["allowed"])

        assert not allowed()
        api.put(node("gpu-a100-80g-0"))
        eventually(allowed, "the A100 node to be admitted against")
        api.delete("nodes", "gpu-a100-80g-0")
        eventually(lambda: not allowed(), "the A100 node to be gone")


def test_not_ready_while_the_api_server_is_away(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    with ApiServer() as gone:
        kubeconfig = gone.write_kubeconfig(tmp_path / "kubeconfig")
    with (
        serving(files.args("--kubeconfig", str(kubeconfig), nodes=None)) as served,
        client(served, files.tls.ca) as http,
    ):
        ready = http.get("/readyz")
        assert ready.status_code == 503
        assert ready.text.splitlines() == [
            "node inventory not synced yet",
            "ResourceSlices not synced yet",
            "ResourceClaimTemplates not synced yet",
        ]
        assert http.get("/healthz").status_code == 200


def test_the_webhook_reads_what_the_device_plugin_writes() -> None:
    """The node labels and `gpuwire.io/gpus` annotation of deviceplugin/agent/labels.py are the
    fleet's input: a contract between two components, checked here."""
    found = sim.make_machine(gpus=8, products=("NVIDIA H100 80GB HBM3",))
    gpus = NodeGpus(
        found.driver_version,
        found.cuda_version,
        tuple(Gpu(g.device, g.compute_capability) for g in found.gpus),
    )
    sick = found.gpus[3].device.uuid
    resources = assign(gpus.devices, [], "nvidia.com/gpu")
    labelled = plugin_labels.labels(gpus, resources)
    annotation = plugin_labels.gpus_annotation(gpus, resources, unhealthy={sick})
    assert plugin_labels.GPUS_ANNOTATION == fleet.GPUS_ANNOTATION
    obj = {
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "labels": {**labelled, "kubernetes.io/hostname": "host-n1"},
            "annotations": {plugin_labels.GPUS_ANNOTATION: annotation},
        },
    }
    node_view = fleet.node_from_object(obj)
    assert node_view is not None
    assert (node_view.product, node_view.memory_mib, node_view.count) == (
        "NVIDIA-H100-80GB-HBM3",
        81559,
        8,
    )
    assert [g.uuid for g in node_view.gpus] == [g.device.uuid for g in found.gpus]
    assert [g.healthy for g in node_view.gpus] == [g.device.uuid != sick for g in found.gpus]
    placed = place(
        a.parse({a.UUID: sick, a.MODEL: "h100"}),
        fleet.Fleet((node_view,)),
    )
    assert placed.devices == (sick,)
    assert placed.warnings == (f"{sick} on node n1 is reported unhealthy",)
