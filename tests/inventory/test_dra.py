"""The inventory of a DRA cluster: holders from the claims the scheduler allocated (before the
kubelet starts anything) and from pod-resources' DRA devices as the node agent reports them,
the memory a shared GPU's shares hold, pods that wait for a claim with the scheduler's
reason, and conflicts across DRA, device-plugin and plugin-less holders."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.agent import holding
from deviceplugin.dra.devices import Sharing, devices
from gpuwire import holders, records
from gpuwire.records import PLUGIN_LESS
from inventory import cli as inventory
from testbed import dracluster
from testbed.apiserver import ApiServer
from testbed.podresources import PodResourcesKubelet
from tests.webhook.test_claims import NAMESPACE, Cluster, Placed

T4 = "Tesla T4"
NODE = dracluster.node("dra-node", 4, ("NVIDIA A100-SXM4-80GB", T4), nvlink="none",
                       shared=("*T4*",))  # fmt: skip
SHARE = {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "1",
         "gpuwire.io/gpu-memory-limit": "6Gi"}  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, [NODE])
        yield Cluster(api, [NODE])


def report(cluster: Cluster, **kwargs: Any) -> dict[str, Any]:
    api = cluster.api
    claims, slices = api.objects("resourceclaims"), api.objects("resourceslices")
    text = inventory.report(api.objects("nodes"), api.objects("pods"), claims=claims,
                            slices=slices, output="json", **kwargs)  # fmt: skip
    found: dict[str, Any] = json.loads(text)
    return found


def gpu(found: dict[str, Any], index: int) -> dict[str, Any]:
    (node,) = found["nodes"]
    gpus: dict[int, dict[str, Any]] = {g["index"]: g for g in node["gpus"]}
    return gpus[index]


def holders_of(found: dict[str, Any], index: int) -> list[tuple[str, str, str]]:
    return [(h["pod"], h["container"], h["path"]) for h in gpu(found, index)["holders"]]


def test_claims_hold_their_gpus_once_allocated_and_shares_add_up(cluster: Cluster) -> None:
    whole = cluster.run({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"})
    shares: list[Placed] = [cluster.run(SHARE) for _ in range(3)]  # T4s: GPUs 1 and 3
    pending = cluster.run(SHARE | {"gpuwire.io/gpu-memory-limit": "14Gi"})  # no room
    found = report(cluster)
    assert holders_of(found, 0) == holders_of(found, 2) == [(whole.pod, "trainer", "dra")]
    claim = whole.claim()["metadata"]
    (held,) = gpu(found, 0)["holders"]
    assert held["claims"] == [f"{claim['namespace']}/{claim['name']}"]  # the claim it holds it by
    on_t4 = {p.gpus()[0][1]: p.pod for p in shares}
    assert sorted(h[0] for h in holders_of(found, 1) + holders_of(found, 3)) == sorted(
        p.pod for p in shares
    )
    assert gpu(found, 1)["sharedMemory"] == {"usedMiB": 12288, "totalMiB": 15360}  # two shares
    assert gpu(found, 3)["sharedMemory"] == {"usedMiB": 6144, "totalMiB": 15360}
    assert "sharedMemory" not in gpu(found, 0)
    assert found["allocated"] == 4
    assert found["conflicts"] == []
    (waiting,) = [p for p in found["pending"] if not p["node"]]  # bound ones wait to start
    assert waiting["pod"] == pending.pod
    assert "cannot allocate all claims" in waiting["message"]
    assert "gpu-model=T4" in waiting["request"]
    text = inventory.report(cluster.api.objects("nodes"), cluster.api.objects("pods"),
                            claims=cluster.api.objects("resourceclaims"),
                            slices=cluster.api.objects("resourceslices"))  # fmt: skip
    assert "12/15 GiB" in text
    assert "6/15 GiB" in text
    assert len(on_t4) == 2


def test_a_pod_of_a_gpu_resource_waiting_for_its_claim_is_a_pending_gpu_pod(
    cluster: Cluster,
) -> None:
    cluster.run({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"})  # both A100s
    placed = cluster.run({}, resources={"limits": {"nvidia.com/gpu": "1"}})
    (waiting,) = [p for p in report(cluster)["pending"] if not p["node"]]
    assert waiting["pod"] == placed.pod
    assert waiting["request"].startswith("claim from gpuwire-")


def test_the_node_agent_lists_dra_holders_from_pod_resources(
    cluster: Cluster, tmp_path: Path, socket_dir: Path
) -> None:
    """The kubelet's pod-resources API lists the claim's devices for the container; the
    agent names them (DRA device → GPU) in the holders annotation, shares as shared."""
    whole = cluster.run({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"})
    share = cluster.run(SHARE)
    stored = {p.pod: cluster.api.get("pods", p.pod, NAMESPACE) for p in (whole, share)}
    socket = socket_dir / "kubelet.sock"
    gpus = NODE.gpus()
    with PodResourcesKubelet(socket) as kubelet:
        for placed in (whole, share):
            pod = stored[placed.pod]
            assert pod is not None
            kubelet.add_pod(NAMESPACE, placed.pod, pod["metadata"]["uid"], ["trainer"])
            kubelet.claim(pod["metadata"]["uid"], "trainer", placed.claim(), {})
        settings = holding.Settings(
            records_dir=str(tmp_path / "records"), pod_resources=str(socket)
        )
        names = {d.name: d.uuid for d in devices(gpus, Sharing())}
        held = holding.observe(settings, gpus.devices, 1.0, dra_names=names)
    t4 = share.gpus()[0][2]["attributes"]["uuid"]["string"]
    assert held.shared == (t4,)
    assert [(h.pod, h.path, len(h.gpus)) for h in held.holders] == sorted(
        [(whole.pod, "dra", 2), (share.pod, "dra", 1)]
    )
    assert holders.conflicts(held) == []
    assert holders.decode(holders.encode(held)) == held


def test_a_plugin_less_container_on_a_dra_gpu_is_a_conflict_even_on_a_shared_one(
    cluster: Cluster,
) -> None:
    share = cluster.run(SHARE)
    t4 = share.gpus()[0][2]["attributes"]["uuid"]["string"]
    squatter = holders.Holder("other", "squatter", "main", PLUGIN_LESS, (t4,))
    node = cluster.api.get("nodes", NODE.name)
    assert node is not None
    node["metadata"]["annotations"][holders.ANNOTATION] = holders.encode(
        holders.NodeHolders((squatter,), (), False)
    )
    cluster.api.put(node)
    found = report(cluster)
    (conflict,) = found["conflicts"]
    assert conflict["kind"] == holders.SHARED_GPU
    assert sorted(conflict["holders"]) == sorted([f"{NAMESPACE}/{share.pod}", "other/squatter"])
    assert records.PLUGIN_LESS in {h["path"] for h in gpu(found, share_index(share))["holders"]}


def share_index(placed: Placed) -> int:
    return int(placed.gpus()[0][1].removeprefix("gpu-"))


MIG_NODE = dracluster.node("dra-mig", 1, ("NVIDIA A100-SXM4-80GB",), mig={0: ("balanced",)})


def test_a_claim_on_a_mig_device_holds_it_under_its_gpu() -> None:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, [MIG_NODE])
        placed = Cluster(api, [MIG_NODE]).run({"gpuwire.io/mig-profile": "2g.20gb"})
        (uuid,) = placed.attribute("uuid")
        text = inventory.report(api.objects("nodes"), api.objects("pods"),
                                claims=api.objects("resourceclaims"),
                                slices=api.objects("resourceslices"), output="json")  # fmt: skip
    (node,) = json.loads(text)["nodes"]
    (gpu0,) = node["gpus"]
    assert gpu0["holders"] == []  # the GPU itself: nobody
    held = {m["uuid"]: [(h["pod"], h["path"]) for h in m["holders"]] for m in gpu0["mig"]}
    assert held.pop(uuid) == [(placed.pod, "dra")]
    assert len(held) == 3  # the other MIG devices: nobody
    assert all(h == [] for h in held.values())


def test_a_gpu_taken_whole_beside_a_claim_on_its_mig_device_is_a_conflict() -> None:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, [MIG_NODE])
        placed = Cluster(api, [MIG_NODE]).run({"gpuwire.io/mig-profile": "2g.20gb"})
        parent = MIG_NODE.gpus().devices[0].uuid
        squatter = holders.Holder("other", "squatter", "main", PLUGIN_LESS, (parent,))
        node = api.get("nodes", MIG_NODE.name)
        assert node is not None
        node["metadata"]["annotations"][holders.ANNOTATION] = holders.encode(
            holders.NodeHolders((squatter,), (), False)
        )
        api.put(node)
        text = inventory.report(api.objects("nodes"), api.objects("pods"),
                                claims=api.objects("resourceclaims"),
                                slices=api.objects("resourceslices"), output="json")  # fmt: skip
    (conflict,) = json.loads(text)["conflicts"]
    assert conflict["kind"] == holders.GPU_AND_MIG
    assert conflict["message"] == (
        f"GPU 0 held whole by other/squatter while MIG 2g.20gb of GPU 0 is held by "
        f"team-a/{placed.pod}"
    )
