"""One annotation grammar for NVIDIA and AMD nodes: the example cluster's NVIDIA nodes beside
AMD nodes labelled as gpuwire's node agent labels them (AMD's labeller's keys, gpuwire's own,
`gpuwire.io/gpus`) and one labelled by AMD's node labeller alone."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from deviceplugin.agent import amdlabels
from gpuwire import amd, amdsim, grant, kfd, nodegpus
from gpuwire import annotations as a
from gpuwire.roots import Roots
from gpuwire.vendor import AMD, NVIDIA
from kubeclient import listfile
from tests.webhook.support import (
    ADMISSION,
    EXAMPLES,
    KEYS,
    admit,
    container,
    deny,
    env,
    pod,
    required_terms,
)
from webhook.fleet import Fleet
from webhook.placement import Demand, place


def amd_node(name: str, machine: amdsim.AmdMachine) -> dict[str, Any]:
    """A Node as gpuwire's node agent labels an AMD node: discovery of that simulated node."""
    with tempfile.TemporaryDirectory() as root:
        amdsim.write_node(root, machine)
        found = kfd.discover(Roots(root))
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**amdlabels.labels(found), "kubernetes.io/hostname": name},
            "annotations": {nodegpus.ANNOTATION: amdlabels.gpus_annotation(found, {})},
        },
        "status": {"allocatable": {amd.RESOURCE: str(len(found.gpus))}},
    }


def labeller_only(name: str) -> dict[str, Any]:
    """A node AMD's own device plugin and labeller run on: their labels, no gpuwire agent."""
    labels = {
        "amd.com/gpu.product-name": "AMD_Instinct_MI210",
        "amd.com/gpu.vram": "64G",
        "amd.com/gpu.device-id": "740f",
        "amd.com/gpu.family": "AI",
        "kubernetes.io/hostname": name,
    }
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


NVIDIA_NODES = listfile.items(EXAMPLES / "nodes.yaml", "Node", ValueError)
MI300X = amd_node("amd-mi300x-0", amdsim.make_machine(8, "MI300X", seed="mi300x-0"))
MI300X_1 = amd_node("amd-mi300x-1", amdsim.make_machine(8, "MI300X", seed="mi300x-1"))
MI210 = amd_node("amd-mi210-0", amdsim.make_machine(4, "MI210", hive_size=2, seed="mi210"))
CLUSTER = Fleet.of([*NVIDIA_NODES, MI300X, MI300X_1, MI210, labeller_only("amd-labeller-0")])
AMD_ONLY = Fleet.of([MI300X, MI300X_1, MI210])


def amd_env(p: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in env(p).items() if k.startswith(("AMD_", "NVIDIA_", "GPUWIRE_"))}


def grants(value: str, name: str, devices: str, caps: str | None = None) -> set[str]:
    """The vendors whose grants `value` holds for container `name` in namespace ml."""
    return {
        v.name
        for v in (NVIDIA, AMD)
        if KEYS.verify(value, grant.Subject.of("ml", name, devices, caps, v, pod=ADMISSION))
    }


def test_the_fleet_reads_amd_nodes_by_their_labellers_keys() -> None:
    nodes = {n.name: n for n in CLUSTER.nodes}
    mi300x, labelled = nodes["amd-mi300x-0"], nodes["amd-labeller-0"]
    assert (mi300x.vendor, labelled.vendor, nodes["gpu-h100-0"].vendor) == (AMD, AMD, NVIDIA)
    assert [(g.product, g.memory_mib, g.resource, g.gpus) for g in mi300x.groups] == [
        ("AMD_Instinct_MI300X", 196608, "amd.com/gpu", 8)
    ]
    assert mi300x.product == "AMD_Instinct_MI300X"  # AMD's labeller's product-name
    # labels alone: AMD's labeller's product and vram (GiB), no count: one GPU assumed
    assert [(g.product, g.memory_mib, g.resource) for g in labelled.groups] == [
        ("AMD_Instinct_MI210", 65536, "amd.com/gpu")
    ]
    assert "amd.com/gpu" in CLUSTER.resources


def test_a_model_of_one_vendor_is_selected_by_that_vendors_label() -> None:
    placed = place(a.parse({a.MODEL: "MI300X"}), CLUSTER, demand=Demand(plugin=1))
    assert [n.name for n in placed.nodes] == ["amd-mi300x-0", "amd-mi300x-1"]
    assert placed.expressions == (
        {"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X"]},
    )
    assert placed.resource == "amd.com/gpu"  # nvidia.com/gpu lists none of them


def test_models_of_two_vendors_are_an_or_named_by_hostname() -> None:
    """No one label names an H100 and an MI300X: the candidates are named instead."""
    mutated, _ = admit(pod({a.MODEL: "H100,MI300X", a.COUNT: "all"}), nodes=CLUSTER)
    (term,) = required_terms(mutated)
    assert term["matchExpressions"] == [
        {
            "key": "kubernetes.io/hostname",
            "operator": "In",
            "values": ["amd-mi300x-0", "amd-mi300x-1", "gpu-h100-0"],  # the mixed one has an L4
        }
    ]
    seen = amd_env(mutated)
    assert (seen["NVIDIA_VISIBLE_DEVICES"], seen["AMD_VISIBLE_DEVICES"]) == ("all", "all")
    caps = seen["NVIDIA_DRIVER_CAPABILITIES"]
    assert len(seen["GPUWIRE_GRANT"].split(",")) == 2  # one grant per vendor
    assert grants(seen["GPUWIRE_GRANT"], "app", "all", caps) == {"nvidia", "amd"}


@pytest.mark.parametrize(
    ("model", "resource", "selected", "left_out"),
    [
        (  # two MI300X nodes hold 2 of them, one H100 node 2 H100s (the mixed one has one)
            "H100,MI300X",
            "amd.com/gpu",
            {"key": "amd.com/gpu.product-name", "operator": "In",
             "values": ["AMD_Instinct_MI300X"]},
            "left out: NVIDIA-H100-80GB-HBM3 on gpu-h100-0 (nvidia.com/gpu)",
        ),
        (  # two A100 nodes, one MI210 node with 2 or more (the labeller's one has one)
            "A100,MI210",
            "nvidia.com/gpu",
            {"key": "nvidia.com/gpu.product", "operator": "In",
             "values": ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB"]},
            "left out: AMD_Instinct_MI210 on amd-mi210-0 (amd.com/gpu)",
        ),
        (  # three nodes each: the tie goes to the resource asked
            "!T4",
            "nvidia.com/gpu",
            {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["Tesla-T4"]},
            "(as many as any, ties going to the resource asked); left out: AMD_Instinct_MI210, "
            "AMD_Instinct_MI300X on amd-mi210-0, amd-mi300x-0, amd-mi300x-1 (amd.com/gpu)",
        ),
    ],
)  # fmt: skip
def test_an_or_across_vendors_with_a_count_takes_the_resource_of_more_candidates(
    model: str, resource: str, selected: dict[str, Any], left_out: str
) -> None:
    """A container asks for one resource (its resources are an AND): an OR of two vendors'
    models with a count goes to the resource listing them on more nodes, said in a warning
    naming the models and nodes it leaves."""
    mutated, outcome = admit(pod({a.MODEL: model, a.COUNT: "2"}), nodes=CLUSTER)
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {resource: "2"}}
    (term,) = required_terms(mutated)
    assert selected in term["matchExpressions"]  # the model, by the label of the one vendor
    (warned,) = [w for w in outcome.warnings if "left out" in w]
    assert f"a container asks for one resource: {resource}" in warned
    assert left_out in warned
    seen = amd_env(mutated)  # the grant and env of that resource's vendor alone
    caps = seen.get("NVIDIA_DRIVER_CAPABILITIES")
    vendor = "amd" if resource == "amd.com/gpu" else "nvidia"
    assert grants(seen["GPUWIRE_GRANT"], "app", grant.PLUGIN_DEVICES, caps) == {vendor}


def test_a_pod_for_amd_nodes_gets_amds_env_and_nothing_of_nvidias() -> None:
    mutated, _ = admit(pod({a.MODEL: "MI300X", a.COUNT: "all"}), nodes=CLUSTER)
    seen = amd_env(mutated)
    assert set(seen) == {"AMD_VISIBLE_DEVICES", "GPUWIRE_GRANT"}
    assert seen["AMD_VISIBLE_DEVICES"] == "all"
    assert grants(seen["GPUWIRE_GRANT"], "app", "all") == {"amd"}


def test_a_count_goes_to_amds_resource_where_only_amd_nodes_have_the_model() -> None:
    mutated, outcome = admit(pod({a.MODEL: "MI300X"}, [container(gpus=2)]), nodes=CLUSTER)
    resources = mutated["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"amd.com/gpu": 2}}
    seen = amd_env(mutated)
    assert "AMD_VISIBLE_DEVICES" not in seen  # the device plugin names the devices
    assert grants(seen["GPUWIRE_GRANT"], "app", grant.PLUGIN_DEVICES) == {"amd"}
    assert outcome.warnings[0].endswith("asks for amd.com/gpu: 2, the resource holding only "
                                        "the GPUs asked for")  # fmt: skip


def test_a_count_on_an_amd_only_cluster_asks_for_amds_resource() -> None:
    mutated, _ = admit(pod({a.COUNT: "2"}), nodes=AMD_ONLY)
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {"amd.com/gpu": "2"}}


def test_a_named_amd_gpu_pins_its_node() -> None:
    uuid = next(g.uuid for n in CLUSTER.nodes if n.name == "amd-mi210-0" for g in n.gpus)
    mutated, _ = admit(pod({a.UUID: uuid}), nodes=CLUSTER)
    (term,) = required_terms(mutated)
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["amd-mi210-0"]} in (
        term["matchExpressions"]
    )
    assert amd_env(mutated)["AMD_VISIBLE_DEVICES"] == uuid


def test_memory_selects_amd_gpus_too() -> None:
    placed = place(a.parse({a.MIN_MEMORY: "100Gi"}), CLUSTER, demand=Demand(whole=True))
    assert [n.name for n in placed.nodes] == ["amd-mi300x-0", "amd-mi300x-1"]


@pytest.mark.parametrize("count", ["all", "2"])
def test_a_memory_floor_on_amd_nodes_keeps_the_model_in_the_affinity(count: str) -> None:
    """AMD's `amd.com/gpu.vram` (`192G`) is no number: the floor is the values present that
    reach it, beside the model's label, so an AMD node of another model that joins later
    is no candidate (no hostname list that only names today's nodes)."""
    asked = {a.MODEL: "MI300X", a.MIN_MEMORY: "100Gi", a.COUNT: count}
    mutated, _ = admit(pod(asked), nodes=CLUSTER)
    (term,) = required_terms(mutated)
    assert term["matchExpressions"] == [
        {"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X"]},
        {"key": "amd.com/gpu.vram", "operator": "In", "values": ["192G"]},
    ]


SHARED = "NVIDIA's way to share a GPU under a limit, and the pod can only run on AMD nodes"


@pytest.mark.parametrize(
    ("annotations", "said"),
    [
        (
            {a.MODEL: "MI300X", a.CAPABILITIES: "compute,utility,video"},
            "gpuwire.io/driver-capabilities: 'compute,utility,video' is NVIDIA's (the driver "
            "capabilities NVIDIA's runtime mounts), and the pod can only run on AMD nodes",
        ),
        (
            {a.MODEL: "MI300X", a.MIG_PROFILE: "1g.10gb"},
            "gpuwire.io/mig-profile: '1g.10gb' is offered by no GPU node of that model",
        ),
        (
            {a.MODEL: "MI300X", a.MEMORY_LIMIT: "8Gi"},
            f"gpuwire.io/gpu-memory-limit: '8Gi' needs profile hami (the policy's default "
            f"limitProfile: hami), {SHARED} (amd-mi300x-0, amd-mi300x-1)",
        ),
        (
            {a.MODEL: "MI300X", a.CORES_LIMIT: "50"},
            f"gpuwire.io/gpu-cores-limit: '50' needs profile hami (the policy's default "
            f"limitProfile: hami), {SHARED}",
        ),
        (  # a profile without limits has no effect, and on AMD nodes no meaning either
            {a.MODEL: "MI300X", a.LIMIT_PROFILE: "mps"},
            "gpuwire.io/limit-profile: 'mps' is NVIDIA's (mps: a GPU shared under a limit), "
            "and the pod can only run on AMD nodes (amd-mi300x-0, amd-mi300x-1)",
        ),
    ],
)
def test_nvidia_only_annotations_for_amd_nodes_are_denied(
    annotations: dict[str, str], said: str
) -> None:
    denial = deny(pod(annotations), nodes=CLUSTER)
    assert denial.code == 400
    assert said in denial.message


@pytest.mark.parametrize(
    ("annotations", "nodes"), [({a.MODEL: "MI300X"}, CLUSTER), ({}, AMD_ONLY)], ids=["model", "amd"]
)
@pytest.mark.parametrize(
    ("hami", "said"),
    [
        ("nvidia.com/gpumem", "gpuwire.io/gpu-memory-limit: \"4000Mi (HAMi's nvidia.com/gpumem"),
        ("nvidia.com/gpucores", "gpuwire.io/gpu-cores-limit: \"30% (HAMi's nvidia.com/gpucores"),
    ],
)
def test_hamis_limits_for_a_pod_only_amd_nodes_can_run_are_denied(
    annotations: dict[str, str], nodes: Fleet, hami: str, said: str
) -> None:
    """HAMi's resources are limits HAMi-core enforces, a CUDA library: on a pod that can
    only land on AMD nodes (by its model, or on a cluster of AMD nodes alone) they are
    denied as NVIDIA's, not as a profile no node happens to enforce."""
    app = container()
    app["resources"] = {"limits": {"nvidia.com/gpu": 1, hami: 4000 if "mem" in hami else 30}}
    denial = deny(pod(annotations, [app]), nodes=nodes)
    assert said in denial.message
    assert SHARED in denial.message


def test_a_profile_alone_on_an_amd_only_cluster_is_denied() -> None:
    denial = deny(pod({a.LIMIT_PROFILE: "hami", a.COUNT: "all"}), nodes=AMD_ONLY)
    assert denial.message.startswith("gpuwire.io/limit-profile: 'hami' is NVIDIA's")


def test_an_exclusion_on_an_amd_only_cluster_selects_by_amds_label() -> None:
    """`!MI210` where every node is AMD's: the other AMD models, by AMD's product label."""
    mutated, _ = admit(pod({a.MODEL: "!MI210", a.COUNT: "2"}), nodes=AMD_ONLY)
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {"amd.com/gpu": "2"}}
    (term,) = required_terms(mutated)
    assert term["matchExpressions"] == [
        {"key": "amd.com/gpu.product-name", "operator": "Exists"},
        {"key": "amd.com/gpu.product-name", "operator": "NotIn", "values": ["AMD_Instinct_MI210"]},
    ]
    assert grants(amd_env(mutated)["GPUWIRE_GRANT"], "app", grant.PLUGIN_DEVICES) == {"amd"}


def test_other_containers_get_void_for_each_vendor_of_the_cluster() -> None:
    sidecar = container("sidecar", env={"AMD_VISIBLE_DEVICES": "all"})
    p = pod({a.MODEL: "MI300X", a.COUNT: "all", a.CONTAINERS: "app"}, [container("app"), sidecar])
    mutated, _ = admit(p, nodes=CLUSTER)
    assert env(mutated, "sidecar") == {
        "AMD_VISIBLE_DEVICES": "void",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }


def test_the_vendors_voided_are_the_snapshots_own() -> None:
    """The cluster's vendors are taken once per node snapshot: a pod admitted before AMD
    nodes joined voids NVIDIA's env alone, the same pod after (a new snapshot) AMD's too."""
    p = pod({a.COUNT: "all", a.CONTAINERS: "app"}, [container("app"), container("sidecar")])
    nvidia_only = Fleet.of(NVIDIA_NODES)
    assert nvidia_only.node_vendors == (NVIDIA,)
    before, _ = admit(p, nodes=nvidia_only)
    assert env(before, "sidecar") == {"NVIDIA_VISIBLE_DEVICES": "void"}
    joined = Fleet.of([*NVIDIA_NODES, MI210])
    assert joined.node_vendors == (NVIDIA, AMD)
    after, _ = admit(p, nodes=joined)
    assert env(after, "sidecar") == {
        "AMD_VISIBLE_DEVICES": "void",
        "NVIDIA_VISIBLE_DEVICES": "void",
    }
