"""The DRA path: annotations become a ResourceClaimTemplate that the Kubernetes 1.34 and 1.37
schemas accept, whose CEL compiles, and that the scheduler stand-in (testbed/allocator.py)
allocates as the annotations mean, on hand-built clusters of nodes as gpuwire's DRA plugin
publishes them: mixed models, NVLink pairs and nodes without NVLink, whole and shared GPUs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml

from gpuwire import grant
from testbed import dracel, dracluster
from testbed.apiserver import ApiServer
from testbed.dracluster import ClusterNode
from testbed.scheduler import CANNOT_ALLOCATE, Decision, Scheduler
from tests.webhook.support import admit
from webhook.fleet import Fleet
from webhook.mutation import Outcome, mutate
from webhook.policy import Policy
from webhook.pools import Pools

Obj = dict[str, Any]
A100, A100_40, H100, T4 = (
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA H100 80GB HBM3",
    "Tesla T4",
)
NAMESPACE = "team-a"
RUNTIME_CLASS = Path(__file__).parents[2] / "deploy/base/runtimeclass.yaml"
DRA = Policy(allocation="dra")
CLUSTER = (
    dracluster.node("a100-40", 4, (A100_40,), nvlink="none"),
    dracluster.node("h100", 4, (H100,)),  # NVLink pairs 0-1, 2-3
    dracluster.node("t4", 2, (T4,), nvlink="none", shared=("*T4*",)),
)


@dataclass
class Cluster:
    api: ApiServer
    nodes: Sequence[ClusterNode]

    @property
    def pools(self) -> Pools:
        return Pools.of(self.api.objects("resourceslices"))

    def admit(self, annotations: dict[str, str], policy: Policy = DRA, **container: Any) -> Outcome:
        return mutate(pod(annotations, **container), NAMESPACE, policy, Fleet(), grant.KeyRing({}),
                      self.pools)  # fmt: skip

    def run(self, annotations: dict[str, str], policy: Policy = DRA, **container: Any) -> Placed:
        """Admit the pod, create its templates, store it and schedule it."""
        raw = pod(annotations, **container)
        outcome = mutate(raw, NAMESPACE, policy, Fleet(), grant.KeyRing({}), self.pools)
        assert outcome.allowed, outcome.denial
        for template in outcome.templates:
            self.api.put(template)
        admitted = jsonpatch.apply_patch(raw, list(outcome.patch))
        self.api.put(admitted)
        decision = Scheduler(self.api).schedule(NAMESPACE, admitted["metadata"]["name"])
        return Placed(self, admitted["metadata"]["name"], decision)


@dataclass
class Placed:
    cluster: Cluster
    pod: str
    decision: Decision

    def claim(self) -> Obj:
        stored = self.cluster.api.get("pods", self.pod, NAMESPACE)
        assert stored is not None
        (status,) = stored["status"]["resourceClaimStatuses"]
        claim = self.cluster.api.get("resourceclaims", status["resourceClaimName"], NAMESPACE)
        assert claim is not None
        return claim

    def gpus(self) -> list[tuple[str, str, Obj]]:
        """(node, device, its slice entry) of each allocated device."""
        results = self.claim()["status"]["allocation"]["devices"]["results"]
        slices = self.cluster.api.objects("resourceslices")
        entries = {
            (s["spec"]["nodeName"], d["name"]): d for s in slices for d in s["spec"]["devices"]
        }
        return [(r["pool"], r["device"], entries[(r["pool"], r["device"])]) for r in results]

    def attribute(self, name: str) -> list[Any]:
        return [next(iter(e["attributes"][name].values())) for _, _, e in self.gpus()]


def pod(annotations: dict[str, str], **container: Any) -> Obj:
    name = f"p-{uuid.uuid4().hex[:8]}"
    meta = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": str(uuid.uuid4()),
        "annotations": annotations,
    }
    containers = [{"name": "trainer", "image": "busybox", **container}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers}}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, CLUSTER)
        yield Cluster(api, CLUSTER)


def test_two_linked_a100_or_h100_of_at_least_40_gib_land_on_one_nvlink_island(
    cluster: Cluster,
) -> None:
    placed = cluster.run({"gpuwire.io/gpu-model": "A100,H100", "gpuwire.io/gpu-count": "2",
                          "gpuwire.io/gpu-min-memory": "40Gi"})  # fmt: skip
    assert placed.decision.node == "h100"  # the A100 40GB node has no NVLink: linked first
    assert [d for _, d, _ in placed.gpus()] == ["gpu-0", "gpu-1"]
    assert len(set(placed.attribute("nvlinkIsland"))) == 1
    assert (
        placed.claim()["status"]["allocation"]["devices"]["results"][0]["request"] == "gpus/linked"
    )


def test_preferred_nvlink_takes_any_gpus_where_no_island_is_free(cluster: Cluster) -> None:
    asks = {"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"}
    placed = cluster.run(asks)
    assert placed.decision.node == "a100-40"
    assert {r["request"] for r in placed.claim()["status"]["allocation"]["devices"]["results"]} == {
        "gpus/any"
    }
    assert len(set(placed.attribute("nvlinkIsland"))) == 2


def test_required_nvlink_is_denied_where_no_node_has_an_island_that_large(cluster: Cluster) -> None:
    policy = Policy(allocation="dra", nvlink="required")
    outcome = cluster.admit({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"}, policy)
    assert outcome.denial is not None
    assert outcome.denial.code == 400
    assert "on one NVLink island" in outcome.denial.message
    assert "the most on one island that fit the request: 1" in outcome.denial.message


def test_required_nvlink_stays_pending_when_the_islands_are_taken(cluster: Cluster) -> None:
    policy = Policy(allocation="dra", nvlink="required")
    asks = {"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "2"}
    assert cluster.run(asks, policy).decision.node == "h100"
    assert cluster.run(asks, policy).decision.node == "h100"
    third = cluster.run(asks, policy)
    assert not third.decision.scheduled
    assert third.decision.message == f"0/3 nodes are available: 3 {CANNOT_ALLOCATE}."


@pytest.mark.parametrize(
    ("annotations", "products"),
    [
        ({"gpuwire.io/gpu-model": "!T4,!A100"}, {H100}),
        ({"nvidia.com/use-gputype": "a100-pcie"}, {A100_40}),
        ({"nvidia.com/nouse-gputype": "A100,H100"}, set()),  # only shared T4s left: denied
        ({"gpuwire.io/gpu-model": "h100", "gpuwire.io/gpu-min-memory": "80G"}, {H100}),
    ],
)
def test_model_words_select_as_on_the_device_plugin_path(
    cluster: Cluster, annotations: dict[str, str], products: set[str]
) -> None:
    annotations |= {"gpuwire.io/gpu-count": "1"}
    if not products:
        assert not cluster.admit(annotations).allowed
        return
    assert set(cluster.run(annotations).attribute("productName")) == products


def test_80gi_is_more_than_an_h100_reports(cluster: Cluster) -> None:
    outcome = cluster.admit({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-min-memory": "80Gi"})
    assert outcome.denial is not None
    assert "81920 MiB" in outcome.denial.message
    assert "NVIDIA H100 80GB HBM3 81559 MiB" in outcome.denial.message


def test_named_gpus_are_exactly_those_and_excluded_ones_only_those(cluster: Cluster) -> None:
    h100 = CLUSTER[1].machine.devices
    excluded = cluster.run({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "3",
                            "gpuwire.io/gpu-uuid": f"!{h100[0].uuid}"})  # fmt: skip
    assert sorted(excluded.attribute("uuid")) == sorted(d.uuid for d in h100[1:])  # its node's
    named = cluster.run({"nvidia.com/use-gpuuuid": f"{h100[0].uuid.upper()}"})  # the one left
    assert named.attribute("uuid") == [h100[0].uuid]


def test_hami_s_named_gpus_beside_an_excluded_one_of_their_node_are_claimed(
    cluster: Cluster,
) -> None:
    """`use-gpuuuid: A,B` with `nouse-gpuuuid: C`, all on one node: a claim of A and B, as
    HAMi gives (the device-plugin path, which cannot name GPUs, keeps off C's node)."""
    a, b, c, _ = CLUSTER[1].machine.devices
    asks = {"nvidia.com/use-gpuuuid": f"{a.uuid},{b.uuid}", "nvidia.com/nouse-gpuuuid": c.uuid}
    assert sorted(cluster.run(asks).attribute("uuid")) == sorted([a.uuid, b.uuid])


def test_named_gpus_on_two_nodes_are_denied(cluster: Cluster) -> None:
    one, other = CLUSTER[0].machine.devices[0], CLUSTER[1].machine.devices[0]
    outcome = cluster.admit({"gpuwire.io/gpu-uuid": f"{one.uuid},{other.uuid}"})
    assert outcome.denial is not None
    assert "different nodes" in outcome.denial.message


def test_all_takes_every_whole_gpu_of_its_node(cluster: Cluster) -> None:
    placed = cluster.run({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "all"})
    assert [d for _, d, _ in placed.gpus()] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


XID_79 = {"key": "gpu.gpuwire.io/xid", "value": "79", "effect": "NoExecute"}


def taint(cluster: Cluster, node: str, device: str, taint: Obj) -> None:
    """What the DRA plugin publishes for an unhealthy GPU, on one device of a node's slice."""
    for s in cluster.api.objects("resourceslices"):
        entries = [d for d in s["spec"]["devices"] if s["spec"]["nodeName"] == node]
        for entry in entries:
            if entry["name"] == device:
                entry["taints"] = [taint]
                cluster.api.put(s)


def test_all_is_every_gpu_of_its_node_the_unhealthy_included(cluster: Cluster) -> None:
    """Upstream's allocator fails an `All` request on a node where one of the devices it
    gathered is tainted, so `all` tolerates gpuwire's health taints: the pod gets every GPU
    of its node, as on the plugin-less path, where a count gets only healthy ones."""
    taint(cluster, "h100", "gpu-1", XID_79)
    placed = cluster.run({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "all"})
    assert placed.decision.node == "h100"
    assert [d for _, d, _ in placed.gpus()] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    results = placed.claim()["status"]["allocation"]["devices"]["results"]
    keys = [[t["key"] for t in r["tolerations"]] for r in results]
    assert keys == [["gpu.gpuwire.io/xid", "gpu.gpuwire.io/gpu-lost"]] * 4
    four = cluster.run({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "4"})
    assert not four.decision.scheduled  # three healthy H100s are not four


def test_a_named_gpu_that_is_tainted_is_admitted_with_a_warning_and_waits(
    cluster: Cluster,
) -> None:
    """Admitted, not denied: a taint lifts once the GPU has been quiet for the DRA plugin's
    recovery period, and the pod is then placed; the warning says why it waits."""
    named = CLUSTER[1].machine.devices[1]
    taint(cluster, "h100", "gpu-1", XID_79)
    outcome = cluster.admit({"gpuwire.io/gpu-uuid": named.uuid})
    assert outcome.allowed
    assert [w for w in outcome.warnings if "tainted" in w] == [
        f"{named.uuid} is tainted, gpu.gpuwire.io/xid=79 (NoExecute): the pod stays Pending "
        "until the GPU is healthy again (the DRA plugin lifts a taint after its quiet period)"
    ]
    assert not cluster.run({"gpuwire.io/gpu-uuid": named.uuid}).decision.scheduled


def test_a_gpu_resource_becomes_a_claim_of_that_many(cluster: Cluster) -> None:
    placed = cluster.run({}, resources={"limits": {"nvidia.com/gpu": "3"}})
    assert len(placed.gpus()) == 3
    stored = cluster.api.get("pods", placed.pod, NAMESPACE)
    assert stored is not None
    assert "nvidia.com/gpu" not in stored["spec"]["containers"][0]["resources"].get("limits", {})


def test_shares_of_a_gpu_fit_by_memory_and_the_one_that_does_not_stays_pending(
    cluster: Cluster,
) -> None:
    t4 = {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "1",
          "gpuwire.io/gpu-memory-limit": "6Gi", "gpuwire.io/gpu-cores-limit": "30"}  # fmt: skip
    placed = [cluster.run(t4) for _ in range(4)]  # two T4s of 15 GiB: two shares of 6 GiB each
    assert [p.decision.node for p in placed] == ["t4"] * 4
    devices = [p.gpus()[0][1] for p in placed]
    assert sorted(devices) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    results = [p.claim()["status"]["allocation"]["devices"]["results"][0] for p in placed]
    assert all(r["consumedCapacity"] == {"memory": "6Gi", "cores": "30"} for r in results)
    assert len({r["shareID"] for r in results}) == 4
    fifth = cluster.run(t4)
    assert not fifth.decision.scheduled
    assert fifth.decision.message == f"0/3 nodes are available: 3 {CANNOT_ALLOCATE}."


def test_a_share_of_a_gpu_is_rounded_up_to_whole_gib_as_its_request_policy_rounds(
    cluster: Cluster,
) -> None:
    outcome = cluster.admit({"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "1",
                             "gpuwire.io/gpu-memory-limit": "10%"})  # fmt: skip
    (template,) = outcome.templates
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "shared.gpu.gpuwire.io"
    assert exactly["capacity"] == {"requests": {"memory": "2Gi"}}  # 10 % of 15360 MiB: 1536 MiB


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        (
            {"gpuwire.io/gpu-model": "V100"},
            "models present: NVIDIA A100-PCIE-40GB, NVIDIA H100 80GB HBM3, Tesla T4",
        ),
        ({"gpuwire.io/gpu-count": "5"}, "the most any node has that fit the request: 4"),
        ({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-memory-limit": "4Gi"}, "none is shared"),
        (
            {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-memory-limit": "20Gi"},
            "more than any shared GPU has",
        ),
        ({"gpuwire.io/gpu-model": "T4"}, "are all shared"),
        ({"gpuwire.io/gpu-count": "none"}, "no ResourceClaim gives"),
        (
            {"gpuwire.io/gpu-memory-limit": "4Gi", "gpuwire.io/limit-profile": "mps,pytorch"},
            "one of hami",
        ),
        (
            {"gpuwire.io/gpu-uuid": "GPU-00000000-0000-0000-0000-000000000000"},
            "which no ResourceSlice holds",
        ),
    ],
)
def test_requests_no_pool_can_ever_satisfy_are_denied_saying_why(
    cluster: Cluster, annotations: dict[str, str], why: str
) -> None:
    outcome = cluster.admit(annotations)
    assert outcome.denial is not None
    assert outcome.denial.code == 400
    assert why in outcome.denial.message
    assert outcome.patch == ()
    assert outcome.templates == ()


def test_a_share_larger_than_every_shared_gpu_is_denied_saying_what_is_accepted(
    cluster: Cluster,
) -> None:
    """Before: no "accepted:" and no way out, unlike the device plugin's way's denial."""
    asked = {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "1"}
    outcome = cluster.admit({**asked, "gpuwire.io/gpu-memory-limit": "20Gi"})
    assert outcome.denial is not None
    assert outcome.denial.message == (
        "gpuwire.io/gpu-memory-limit: '20Gi' (= 20Gi in whole GiB) is more than any shared GPU "
        "has; largest: Tesla T4 15360 MiB; accepted: at most 15Gi (a share is whole GiB), or a "
        "share of the GPU (e.g. 50%)"
    )
    for accepted in ("15Gi", "50%"):
        assert cluster.admit({**asked, "gpuwire.io/gpu-memory-limit": accepted}).denial is None


def test_auto_takes_dra_where_the_slices_have_it_and_the_device_plugin_elsewhere(
    cluster: Cluster,
) -> None:
    auto = Policy(allocation="auto")
    dra = cluster.admit({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "1"}, auto)
    assert dra.templates
    plugin = cluster.admit({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "8"}, auto)
    assert not plugin.templates  # no DRA node has 8: the device plugin's way (the fleet's denial)
    assert plugin.denial is not None
    assert "matches no GPU node" in plugin.denial.message


def test_the_device_plugin_policy_writes_no_claim(cluster: Cluster) -> None:
    outcome = cluster.admit({"gpuwire.io/gpu-count": "2"}, Policy())
    assert not outcome.templates
    assert not any("resourceClaims" in op["path"] or "claims" in op["path"] for op in outcome.patch)


def test_a_dra_pod_gets_the_policys_runtime_class_and_lands_where_it_lets_it(
    cluster: Cluster,
) -> None:
    """gpuwire's runtime checks a claim's token only where it runs: without the class, a pod
    would run under the node's default handler, its claim's devices taken on trust."""
    for runtime_class in yaml.safe_load_all(RUNTIME_CLASS.read_text()):  # nodeSelector: GPU nodes
        cluster.api.put(runtime_class)
    policy = Policy(allocation="dra", runtime_class="gpuwire")
    placed = cluster.run({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "1"}, policy)
    stored = cluster.api.get("pods", placed.pod, NAMESPACE)
    assert stored is not None
    assert stored["spec"]["runtimeClassName"] == "gpuwire"
    assert placed.decision.node == "h100"
    own = cluster.admit({"gpuwire.io/gpu-count": "1"}, policy)
    assert own.templates
    named = jsonpatch.apply_patch(pod({"gpuwire.io/gpu-count": "1"}), list(own.patch))
    named["spec"]["runtimeClassName"] = "kata"
    outcome = mutate(named, NAMESPACE, policy, Fleet(), grant.KeyRing({}), cluster.pools)
    assert not [op for op in outcome.patch if op["path"] == "/spec/runtimeClassName"]


def test_a_pod_bringing_its_own_claim_gets_no_runtime_class(cluster: Cluster) -> None:
    """The webhook does not read a pod's own ResourceClaim(Template) to learn its class
    (docs/dra.md): such a pod names the RuntimeClass itself."""
    raw = pod({}, resources={"claims": [{"name": "gpu"}]})
    raw["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    policy = Policy(allocation="dra", runtime_class="gpuwire")
    outcome = mutate(raw, NAMESPACE, policy, Fleet(), grant.KeyRing({}), cluster.pools)
    assert outcome.allowed
    assert not [op for op in outcome.patch if op["path"] == "/spec/runtimeClassName"]


TEMPLATES = [
    {"gpuwire.io/gpu-model": "A100,H100,!PCIE", "gpuwire.io/gpu-count": "2",
     "gpuwire.io/gpu-min-memory": "40Gi"},
    {"gpuwire.io/gpu-count": "all", "gpuwire.io/driver-capabilities": "compute,utility,video"},
    {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "2",
     "gpuwire.io/gpu-memory-limit": "25%", "gpuwire.io/gpu-cores-limit": "50",
     "gpuwire.io/limit-profile": "hami"},
    {"gpuwire.io/gpu-uuid": "!" + CLUSTER[1].machine.devices[0].uuid, "gpuwire.io/gpu-count": "3"},
]  # fmt: skip


@pytest.mark.parametrize("version", ["1.34", "1.37"])
@pytest.mark.parametrize("annotations", TEMPLATES)
def test_templates_validate_against_the_schemas_and_their_cel_compiles(
    cluster: Cluster, version: str, annotations: dict[str, str]
) -> None:
    (template,) = cluster.admit(annotations).templates
    kubernetes_validate.validate(template, version, strict=True)
    requests = template["spec"]["spec"]["devices"]["requests"]
    for request in requests:
        for exactly in (
            [request.get("exactly")] if "exactly" in request else request["firstAvailable"]
        ):
            for selector in exactly.get("selectors", []):
                program = dracel.compile_selector(selector["cel"]["expression"])
                for s in cluster.api.objects("resourceslices"):
                    for d in s["spec"]["devices"]:  # a bool on every device: no runtime error
                        variable = dracel.device(d, s["spec"]["driver"])
                        assert isinstance(
                            dracel.matches(selector["cel"]["expression"], variable), bool
                        )
                assert program is not None


def test_a_template_is_named_by_its_request_and_shared_by_pods_asking_alike(
    cluster: Cluster,
) -> None:
    asks = {"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"}
    first, second = cluster.admit(asks), cluster.admit(dict(reversed(list(asks.items()))))
    assert first.templates == second.templates
    other = cluster.admit(asks | {"gpuwire.io/gpu-count": "1"})
    assert other.templates[0]["metadata"]["name"] != first.templates[0]["metadata"]["name"]
    assert first.templates[0]["metadata"]["name"].startswith("gpuwire-")


# --- the patch: what the pod gets, and a second pass changes nothing


def test_each_gpu_container_gets_its_own_claim_from_one_shared_template(cluster: Cluster) -> None:
    raw = pod({"gpuwire.io/gpu-model": "H100", "gpuwire.io/gpu-count": "1"})
    raw["spec"]["containers"].append({"name": "helper", "image": "busybox"})
    admitted, outcome = admit(raw, NAMESPACE, DRA, pools=cluster.pools)
    (template,) = outcome.templates  # one request, one template
    entries = admitted["spec"]["resourceClaims"]
    assert entries == [
        {"name": "gpuwire-trainer", "resourceClaimTemplateName": template["metadata"]["name"]},
        {"name": "gpuwire-helper", "resourceClaimTemplateName": template["metadata"]["name"]},
    ]
    for c in admitted["spec"]["containers"]:
        assert c["resources"]["claims"] == [{"name": f"gpuwire-{c['name']}"}]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in c["env"]


def test_the_pods_own_claims_and_env_are_left_as_they_are_but_for_gpu_env(cluster: Cluster) -> None:
    raw = pod(
        {"gpuwire.io/containers": "trainer"},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "X", "value": "1"}],
        resources={"claims": [{"name": "mine"}], "limits": {"nvidia.com/gpu": "2", "cpu": "1"}},
    )
    raw["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "their-nic"}]
    admitted, outcome = admit(raw, NAMESPACE, DRA, pools=cluster.pools)
    assert admitted["spec"]["resourceClaims"][0] == {
        "name": "mine",
        "resourceClaimName": "their-nic",
    }
    assert [e["name"] for e in admitted["spec"]["resourceClaims"]] == ["mine", "gpuwire-trainer"]
    c = admitted["spec"]["containers"][0]
    assert c["resources"] == {"claims": [{"name": "mine"}, {"name": "gpuwire-trainer"}],
                              "limits": {"cpu": "1"}}  # fmt: skip
    assert c["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "X", "value": "1"},
    ]
    assert "hand-written" not in " ".join(outcome.warnings)
    assert any("NVIDIA_VISIBLE_DEVICES=all replaced by void" in w for w in outcome.warnings)
    requests = outcome.templates[0]["spec"]["spec"]["devices"]["requests"][0]
    assert requests["firstAvailable"][0]["count"] == 2  # the resource's count


def test_a_pod_entry_of_gpuwires_name_is_not_taken_over(cluster: Cluster) -> None:
    raw = pod({"gpuwire.io/gpu-count": "1"})
    raw["spec"]["resourceClaims"] = [{"name": "gpuwire-trainer", "resourceClaimName": "mine"}]
    outcome = mutate(raw, NAMESPACE, DRA, Fleet(), grant.KeyRing({}), cluster.pools)
    assert outcome.denial is not None
    assert "already has an entry 'gpuwire-trainer'" in outcome.denial.message


def test_an_init_container_named_by_the_annotation_gets_its_claim(cluster: Cluster) -> None:
    raw = pod({"gpuwire.io/containers": "warmup", "gpuwire.io/gpu-count": "1"})
    raw["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox"}]
    admitted, _ = admit(raw, NAMESPACE, DRA, pools=cluster.pools)
    assert admitted["spec"]["initContainers"][0]["resources"]["claims"] == [
        {"name": "gpuwire-warmup"}
    ]
    assert "claims" not in admitted["spec"]["containers"][0].get("resources", {})


@pytest.mark.parametrize("annotations", TEMPLATES)
def test_a_second_pass_over_an_admitted_pod_changes_nothing(
    cluster: Cluster, annotations: dict[str, str]
) -> None:
    raw = pod(annotations)
    raw["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    admit(raw, NAMESPACE, DRA, pools=cluster.pools)  # asserts the second pass is a no-op


def test_a_resource_claimed_container_keeps_its_count_on_a_second_pass(cluster: Cluster) -> None:
    """The second pass no longer sees `nvidia.com/gpu: 3` (the first removed it): the claim
    it gave stays, and no other container gets one."""
    raw = pod({"gpuwire.io/gpu-model": "H100"}, resources={"limits": {"nvidia.com/gpu": "3"}})
    raw["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    admitted, _ = admit(raw, NAMESPACE, DRA, pools=cluster.pools)
    assert [e["name"] for e in admitted["spec"]["resourceClaims"]] == ["gpuwire-trainer"]
    again = mutate(admitted, NAMESPACE, DRA, Fleet(), grant.KeyRing({}), cluster.pools)
    assert again.templates == ()  # nothing to create: the claim is the first pass's


# --- limits held where their profile is enforced (the shared GPU's <profile>Limits attribute)

ENFORCING = (
    dracluster.node("unheld", 2, (T4,), nvlink="none", shared=("*T4*",), enforced=()),
    dracluster.node("held", 2, (T4,), nvlink="none", shared=("*T4*",)),  # HAMi-core there
)


@pytest.fixture
def enforcing() -> Iterator[Cluster]:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, ENFORCING)
        yield Cluster(api, ENFORCING)


SHARE = {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-count": "1",
         "gpuwire.io/gpu-memory-limit": "4Gi"}  # fmt: skip


def test_an_enforced_profile_takes_a_share_only_where_it_holds_one(enforcing: Cluster) -> None:
    placed = [enforcing.run(SHARE) for _ in range(3)]  # hami, the policy's default profile
    assert [p.decision.node for p in placed] == ["held"] * 3
    assert all(p.attribute("hamiLimits") == [True] for p in placed)


def test_an_enforced_profile_no_shared_gpu_holds_is_denied(enforcing: Cluster) -> None:
    outcome = enforcing.admit({**SHARE, "gpuwire.io/limit-profile": "mps"})
    assert outcome.denial is not None
    assert "needs limit profile 'mps' to hold the share" in outcome.denial.message
    assert "held there: hami" in outcome.denial.message


def test_an_advisory_profile_for_a_share_is_denied_naming_what_the_class_enforces(
    enforcing: Cluster,
) -> None:
    """The shared class enforces hami (its config): a claim naming an advisory profile would
    fail its prepare. Before: admitted with a warning, its claim made to fail (or, under a
    class enforcing none, its share held by nothing)."""
    outcome = enforcing.admit({**SHARE, "gpuwire.io/limit-profile": "pytorch"})
    assert outcome.denial is not None
    assert outcome.denial.message == (
        "gpuwire.io/limit-profile: 'pytorch' holds the share with limit profile 'pytorch', "
        "which is advisory (held by nothing); a share of a shared GPU is held by the profile "
        "its DeviceClass shared.gpu.gpuwire.io enforces, 'hami', and the DRA plugin fails a "
        "claim that names another; accepted: gpuwire.io/limit-profile: hami"
    )
    by_policy = enforcing.admit(SHARE, Policy(allocation="dra", limit_profiles=("jax",)))
    assert by_policy.denial is not None
    assert by_policy.denial.message.startswith(
        "gpuwire.io/gpu-memory-limit: '4Gi' holds the share with limit profile 'jax', which "
        "is advisory"
    )


# --- MIG devices (published by the DRA plugin for GPUs in MIG mode)

MIG_CLUSTER = (
    dracluster.node("mig", 2, (A100,), mig={0: ("balanced",), 1: ("3g.40gb", "3g.40gb")}),
    dracluster.node("h100", 2, (H100,)),
)


@pytest.fixture
def mig_cluster() -> Iterator[Cluster]:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, MIG_CLUSTER)
        yield Cluster(api, MIG_CLUSTER)


def test_a_mig_profile_is_that_many_mig_devices_of_it(mig_cluster: Cluster) -> None:
    placed = mig_cluster.run({"gpuwire.io/mig-profile": "1g.10gb", "gpuwire.io/gpu-count": "2"})
    assert placed.decision.node == "mig"
    assert placed.attribute("profile") == ["1g.10gb", "1g.10gb"]
    assert set(placed.attribute("type")) == {"mig"}


def test_a_mig_resource_becomes_a_claim_of_its_profile(mig_cluster: Cluster) -> None:
    placed = mig_cluster.run({}, resources={"limits": {"nvidia.com/mig-3g.40gb": "2"}})
    assert placed.attribute("profile") == ["3g.40gb", "3g.40gb"]
    stored = mig_cluster.api.get("pods", placed.pod, NAMESPACE)
    assert stored is not None
    assert "limits" not in stored["spec"]["containers"][0]["resources"]


def test_a_named_mig_device_is_exactly_that_one(mig_cluster: Cluster) -> None:
    mig = [
        d for d in Pools.of(mig_cluster.api.objects("resourceslices")).devices if d.kind == "mig"
    ]
    placed = mig_cluster.run({"gpuwire.io/gpu-uuid": mig[2].uuid})
    assert placed.attribute("uuid") == [mig[2].uuid]


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        ({"gpuwire.io/mig-profile": "7g.80gb"},
         "offered by no MIG device in the cluster's ResourceSlices; MIG profiles present: "
         "1g.10gb, 2g.20gb, 3g.40gb"),
        ({"gpuwire.io/mig-profile": "1g.10gb", "gpuwire.io/gpu-model": "H100"},
         "no MIG device in the cluster's ResourceSlices fits the request"),
        ({"gpuwire.io/mig-profile": "1g.10gb", "gpuwire.io/gpu-memory-limit": "2Gi"},
         "a MIG device is allocated whole"),
        ({"gpuwire.io/mig-profile": "3g.40gb", "gpuwire.io/gpu-count": "4"},
         "the most any node has that fit the request: 3"),
        ({"gpuwire.io/mig-profile": "1g.10gb", "gpuwire.io/gpu-count": "33"},
         "gpuwire.io/gpu-count: '33' asks for 33 MIG devices in one claim; a claim holds at "
         "most 32 (the Kubernetes limit on a claim's devices)"),
    ],
)  # fmt: skip
def test_mig_requests_no_pool_can_satisfy_are_denied(
    mig_cluster: Cluster, annotations: dict[str, str], why: str
) -> None:
    outcome = mig_cluster.admit(annotations)
    assert outcome.denial is not None
    assert why in outcome.denial.message


MANY = (
    *CLUSTER,
    *(dracluster.node(f"h100-{i}", 4, (H100,)) for i in range(5)),
    *(dracluster.node(f"t4-{i}", 2, (T4,), nvlink="none", shared=("*T4*",)) for i in range(5)),
)


def test_devices_alike_share_one_make_and_a_translation_passes_over_one_node_of_each() -> None:
    pools = Pools.of(dracluster.all_slices(MANY))
    first, second = pools.nodes["h100-0"], pools.nodes["h100-1"]
    assert [d.make for d in first] == [d.make for d in second]
    assert all(a.make is b.make and a.uuid != b.uuid for a, b in zip(first, second, strict=True))
    assert sorted({d.node for d in pools.alike}) == ["a100-40", "h100", "t4"]


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpuwire.io/gpu-model": "A100,H100", "gpuwire.io/gpu-min-memory": "40Gi",
         "gpuwire.io/gpu-count": "2"},
        {"gpuwire.io/gpu-model": "T4", "gpuwire.io/gpu-memory-limit": "4Gi"},
        {"gpuwire.io/gpu-count": "all"},
    ],
)  # fmt: skip
def test_many_nodes_alike_give_the_template_one_of_each_gives(annotations: dict[str, str]) -> None:
    def admitted(nodes: Sequence[ClusterNode]) -> Outcome:
        pools = Pools.of(dracluster.all_slices(nodes))
        return mutate(pod(annotations), NAMESPACE, DRA, Fleet(), grant.KeyRing({}), pools)

    few, many = admitted(CLUSTER), admitted(MANY)
    assert few.allowed
    assert many.allowed
    assert few.templates == many.templates
    assert few.warnings == many.warnings


def test_a_denial_counts_every_gpu_not_one_node_of_each() -> None:
    pools = Pools.of(dracluster.all_slices(MANY))
    outcome = mutate(pod({"gpuwire.io/gpu-model": "T4"}), NAMESPACE, DRA, Fleet(),
                     grant.KeyRing({}), pools)  # fmt: skip
    assert outcome.denial is not None
    assert "are all shared" in outcome.denial.message
    assert f"and {6 * 2 - 3} more" in outcome.denial.message  # 6 T4 nodes of 2: 3 shown


# --- AMD requests: AMD's class, AMD's DRA driver's attribute names, one vendor per claim

AMD_CLUSTER = (
    dracluster.node("h100", 4, (H100,)),
    dracluster.amd_node("mi300x", 4, hive_size=2),  # XGMI hives 0-1, 2-3
    dracluster.amd_node("mi300x-cpx", 2, compute="CPX", memory="NPS4"),  # 16 partitions
    dracluster.amd_node("mi210", 2, "MI210", hive_size=0),
)
AMD_CLASS = "amd.gpu.gpuwire.io"


@pytest.fixture
def amd_cluster() -> Iterator[Cluster]:
    with ApiServer(schema="1.37") as api:
        dracluster.install(api, AMD_CLUSTER)
        yield Cluster(api, AMD_CLUSTER)


def exactly(template: dict[str, Any]) -> dict[str, Any]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    found: dict[str, Any] = request.get("exactly") or request["firstAvailable"][0]
    return found


def test_a_model_request_becomes_a_claim_of_amds_class_on_an_amd_node(amd_cluster: Cluster) -> None:
    placed = amd_cluster.run({"gpuwire.io/gpu-model": "MI300X"})
    assert placed.decision.node in ("mi300x", "mi300x-cpx")
    (template,) = amd_cluster.admit({"gpuwire.io/gpu-model": "MI300X"}).templates
    assert exactly(template)["deviceClassName"] == AMD_CLASS
    assert "config" not in template["spec"]["spec"]["devices"]  # no capabilities, no profile
    assert placed.attribute("productName") == ["AMD Instinct MI300X"]


def test_two_gpus_land_on_one_xgmi_hive(amd_cluster: Cluster) -> None:
    placed = amd_cluster.run({"gpuwire.io/gpu-model": "MI300X", "gpuwire.io/gpu-count": "2",
                          "gpuwire.io/gpu-min-memory": "100Gi"})  # fmt: skip
    assert placed.decision.node == "mi300x"  # the partitions have 24 GiB each
    assert placed.attribute("type") == ["amdgpu", "amdgpu"]
    assert len(set(placed.attribute("xgmiIsland"))) == 1
    constraints = placed.claim()["spec"]["devices"]["constraints"]
    assert constraints == [
        {"requests": ["gpus/linked"], "matchAttribute": "gpu.gpuwire.io/xgmiIsland"}
    ]


def test_a_partition_profile_selects_partitions_of_that_profile(amd_cluster: Cluster) -> None:
    asks = {"gpuwire.io/partition-profile": "CPX_NPS4", "gpuwire.io/gpu-count": "3"}
    placed = amd_cluster.run(asks)
    assert placed.decision.node == "mi300x-cpx"
    assert placed.attribute("type") == ["amdgpu-partition"] * 3
    assert placed.attribute("partitionProfile") == ["cpx_nps4"] * 3
    (template,) = amd_cluster.admit(asks).templates
    assert exactly(template)["selectors"] == [{"cel": {"expression": (
        '"partitionProfile" in device.attributes["gpu.gpuwire.io"] && '
        'device.attributes["gpu.gpuwire.io"].partitionProfile == "cpx_nps4"')}}]  # fmt: skip


def test_memory_leaves_only_the_devices_that_have_it(amd_cluster: Cluster) -> None:
    placed = amd_cluster.run({"gpuwire.io/gpu-model": "MI210", "gpuwire.io/gpu-min-memory": "60Gi"})
    assert placed.decision.node == "mi210"
    denied = amd_cluster.admit(
        {"gpuwire.io/gpu-model": "MI210", "gpuwire.io/gpu-min-memory": "100Gi"}
    )
    assert denied.denial is not None
    assert "fits no GPU of that model" in denied.denial.message


def test_the_claim_container_gets_void_for_both_vendors_and_no_grant(amd_cluster: Cluster) -> None:
    outcome = amd_cluster.admit({"gpuwire.io/gpu-model": "MI300X"})
    assert outcome.allowed
    env = [op["value"] for op in outcome.patch if op["path"].endswith("/env")]
    assert env == [[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                    {"name": "AMD_VISIBLE_DEVICES", "value": "void"}]]  # fmt: skip


@pytest.mark.parametrize(
    ("annotations", "said"),
    [
        (
            {"gpuwire.io/gpu-model": "MI300X", "gpuwire.io/driver-capabilities": "compute,video"},
            "gpuwire.io/driver-capabilities: 'compute,video' is NVIDIA's (the driver capabilities",
        ),
        (
            {"gpuwire.io/gpu-model": "MI300X", "gpuwire.io/gpu-memory-limit": "10Gi"},
            "gpuwire.io/gpu-memory-limit: '10Gi' is NVIDIA's (a share of a GPU",
        ),
        (
            {"gpuwire.io/partition-profile": "qpx_nps1"},
            "partition profiles present: cpx_nps4, spx_nps1",
        ),
        (
            {"gpuwire.io/partition-profile": "cpx_nps4", "gpuwire.io/gpu-cores-limit": "30"},
            "gpuwire.io/gpu-cores-limit: '30' is NVIDIA's, and gpuwire.io/partition-profile",
        ),
    ],
)
def test_nvidia_options_on_an_amd_request_and_absent_profiles_are_denied(
    amd_cluster: Cluster, annotations: dict[str, str], said: str
) -> None:
    outcome = amd_cluster.admit(annotations)
    assert outcome.denial is not None
    assert outcome.denial.code == 400
    assert said in outcome.denial.message


def test_a_request_both_vendors_fit_takes_the_one_more_fit_with_a_warning(
    amd_cluster: Cluster,
) -> None:
    outcome = amd_cluster.admit({"gpuwire.io/gpu-count": "1"})
    (template,) = outcome.templates
    assert exactly(template)["deviceClassName"] == AMD_CLASS  # 22 AMD devices, 4 NVIDIA
    assert any("takes one vendor's: AMD's" in w for w in outcome.warnings)
    nvidia = amd_cluster.admit(
        {"gpuwire.io/gpu-count": "1", "gpuwire.io/driver-capabilities": "all"}
    )
    assert exactly(nvidia.templates[0])["deviceClassName"] == "gpu.gpuwire.io"


def test_a_partition_profile_on_the_device_plugins_way_is_denied(amd_cluster: Cluster) -> None:
    raw = pod({"gpuwire.io/partition-profile": "cpx_nps4"})
    outcome = mutate(raw, NAMESPACE, Policy(), Fleet(), grant.KeyRing({}), amd_cluster.pools)
    assert outcome.denial is not None
    assert "amd.com/cpx_nps4: N" in outcome.denial.message


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        ((dracluster.amd_node("cpx-8", 8, compute="CPX", memory="NPS4"),),  # 64 partitions
         "gpuwire.io/gpu-count: 'all' asks for every partition of a node that fits the request, "
         "and node cpx-8 has 64; a claim holds at most 32 (the Kubernetes limit on a claim's "
         "devices), and the scheduler's allocator fails the pod's scheduling at a node with "
         "more ('exceeds the claim limit')"),
        ((dracluster.amd_node("cpx-8", 8, compute="CPX", memory="NPS4"),
          dracluster.amd_node("cpx-2", 2, compute="CPX", memory="NPS4")),  # 64 and 16
         "whichever other node would fit (cpx-2: 16)"),
    ],
)  # fmt: skip
def test_all_on_a_node_with_more_devices_than_a_claim_holds_is_denied(
    nodes: tuple[ClusterNode, ...], said: str
) -> None:
    """`all` is every device of a node that fits: more than 32 on any node is a claim the
    allocator refuses (testbed/allocator.py rule 9) and the scheduler's attempt fails there,
    whatever the other nodes have."""
    asks = {"gpuwire.io/partition-profile": "cpx_nps4", "gpuwire.io/gpu-count": "all"}
    pools = Pools.of(dracluster.all_slices(nodes))
    outcome = mutate(pod(asks), NAMESPACE, DRA, Fleet(), grant.KeyRing({}), pools)
    assert outcome.denial is not None
    assert outcome.denial.code == 400
    assert said in outcome.denial.message


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_amd_templates_validate_and_their_selectors_err_on_no_device(
    amd_cluster: Cluster, version: str
) -> None:
    """Every selector is a bool on every device of the cluster, NVIDIA's and AMD's (a CEL
    error fails the pod's scheduling): the scheduler stand-in evaluates them all."""
    for asks in ({"gpuwire.io/partition-profile": "cpx_nps4", "gpuwire.io/gpu-count": "all"},
                 {"gpuwire.io/gpu-model": "MI300X,!MI210", "gpuwire.io/gpu-count": "2",
                  "gpuwire.io/gpu-min-memory": "16Gi"}):  # fmt: skip
        (template,) = amd_cluster.admit(asks).templates
        kubernetes_validate.validate(template, version, strict=True)
        assert amd_cluster.run(asks).decision.node is not None
