"""Every GPU of every node: mixed nodes, the resource that lists the model asked for, limits
routed to the nodes that enforce them. Against the example cluster, whose gpu-mixed-0 holds
an H100 (nvidia.com/gpu) and an L4 (nvidia.com/l4), through the pure mutation."""

from __future__ import annotations

from gpuwire import annotations as a
from tests.webhook.support import (
    NODES,
    admit,
    container,
    deny,
    env,
    labelled_node,
    pod,
    required_terms,
)
from webhook.fleet import Fleet
from webhook.placement import Demand, place
from webhook.policy import Policy

PLUGIN = Demand(plugin=1)


def test_the_fleet_holds_every_gpu_of_a_mixed_node() -> None:
    mixed = next(n for n in NODES.nodes if n.name == "gpu-mixed-0")
    assert [(g.product, g.resource, g.gpus) for g in mixed.groups] == [
        ("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 1),
        ("NVIDIA-L4", "nvidia.com/l4", 1),
    ]
    assert mixed.product == "NVIDIA-H100-80GB-HBM3"  # GFD's label: one model
    assert "NVIDIA-L4" in NODES.products
    assert NODES.resources == ("nvidia.com/gpu", "nvidia.com/l4")


def test_a_model_on_a_mixed_node_is_asked_for_by_its_own_resource() -> None:
    p = pod({a.MODEL: "L4"}, [container(gpus=1)])
    p["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": 1, "cpu": "1"}
    mutated, outcome = admit(p)
    resources = mutated["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {"nvidia.com/l4": 1},
        "requests": {"nvidia.com/l4": 1, "cpu": "1"},
    }
    assert "affinity" not in mutated["spec"]  # only gpu-mixed-0 lists nvidia.com/l4, only L4s
    assert outcome.warnings[0] == (
        "container 'app': nvidia.com/gpu: 1 asks for nvidia.com/l4: 1, the resource holding only "
        "the GPUs asked for"
    )


def test_more_gpus_of_a_model_than_any_node_lists_are_denied() -> None:
    denial = deny(pod({a.MODEL: "L4"}, [container(gpus=2)]))
    assert denial.message.startswith(
        "no GPU node satisfies gpuwire.io/gpu-model: 'L4' for a container the device plugin "
        "serves: no node lists 2 such device(s) under a resource that holds no other GPUs"
    )
    assert "accepted: as many such GPUs as one node lists under a resource of their own" in (
        denial.message
    )


def test_a_per_model_resource_written_by_hand_is_a_gpu_container() -> None:
    c = {**container(), "resources": {"limits": {"nvidia.com/l4": 1}}}
    mutated, _ = admit(pod({a.MEMORY_LIMIT: "4Gi"}, [c]))
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"
    assert env(mutated)["GPUWIRE_GRANT"].startswith("k1:")


def test_nvidia_com_gpu_stays_where_it_lists_only_the_model() -> None:
    placement = place(a.parse({a.MODEL: "H100"}), NODES, demand=PLUGIN)
    assert placement.resource is None
    assert [n.name for n in placement.nodes] == ["gpu-h100-0", "gpu-mixed-0"]
    assert placement.expressions == (
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
    )


def test_all_gpus_of_a_node_must_all_fit() -> None:
    denial = deny(pod({a.MODEL: "L4", a.COUNT: "all"}))
    assert denial.message == (
        "no GPU node satisfies gpuwire.io/gpu-model: 'L4' for a container that takes every GPU "
        "of its node (gpuwire.io/gpu-count: all): every node with such GPUs has other GPUs too; "
        "accepted: a number of GPUs, or named GPUs (gpuwire.io/gpu-uuid); models present: "
        "NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-L4, Tesla-T4"
    )
    mutated, _ = admit(pod({a.MODEL: "H100", a.COUNT: "all"}))
    (term,) = required_terms(mutated)
    assert term["matchExpressions"][-1] == {
        "key": "kubernetes.io/hostname",
        "operator": "NotIn",
        "values": ["gpu-mixed-0"],  # its label says H100, but it has an L4 too
    }


def test_a_share_is_of_the_gpu_the_pod_gets_not_of_the_node_label() -> None:
    mutated, _ = admit(pod({a.MODEL: "L4", a.MEMORY_LIMIT: "50%"}, [container(gpus=1)]))
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "11517m"  # half of 23034 MiB


# --- limits go where something enforces them


def test_limits_go_only_to_nodes_enforcing_their_profile() -> None:
    mutated, _ = admit(pod({a.MEMORY_LIMIT: "10Gi"}, [container(gpus=1)]))
    (term,) = required_terms(mutated)
    assert term["matchExpressions"] == [
        {"key": "gpuwire.io/limits.hami", "operator": "In", "values": ["true"]}
    ]


def test_a_profile_no_node_enforces_is_denied_naming_those_that_are() -> None:
    policy = Policy(limit_profiles=("hami",))
    nodes_without_hami = Fleet(tuple(n for n in NODES.nodes if "hami" not in n.enforces))
    denial = deny(
        pod({a.CORES_LIMIT: "30"}, [container(gpus=1)]), policy=policy, nodes=nodes_without_hami
    )
    assert denial.code == 400
    assert denial.message == (
        "gpuwire.io/gpu-cores-limit: '30' needs profile 'hami' (the policy's default "
        "limitProfile: hami), which no GPU node of this cluster enforces; profiles enforced in "
        "this cluster: mps (1 node); advisory (allowed, not enforced): jax, pytorch, tensorflow"
    )


def test_advisory_profiles_need_no_enforcing_node_and_say_so() -> None:
    p = pod({a.MODEL: "T4", a.MEMORY_LIMIT: "50%", a.LIMIT_PROFILE: "pytorch"}, [container(gpus=1)])
    mutated, outcome = admit(p)
    assert env(mutated)["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.5"
    assert "profile 'pytorch' is advisory: the framework reads it, nothing enforces it" in (
        outcome.warnings
    )
    (term,) = required_terms(mutated)
    assert all(e["key"] != "gpuwire.io/limits.pytorch" for e in term["matchExpressions"])


def test_limits_are_sized_from_the_gpus_the_resource_asked_for_lists() -> None:
    """A share sized from the nodes that list the pod's resource: the L4 listed as
    nvidia.com/l4 is not one an nvidia.com/gpu container can get; where no node lists the
    resource, the pod is denied (it would stay Pending)."""
    h100 = labelled_node("node-h100", ["NVIDIA H100 80GB HBM3"])
    l4 = labelled_node("node-l4", ["NVIDIA L4"], own=["L4"])
    p = pod({a.MEMORY_LIMIT: "8Gi", a.LIMIT_PROFILE: "pytorch"}, [container(gpus=1)])
    mutated, outcome = admit(p, nodes=Fleet.of([h100, l4]))
    fraction = env(mutated)["PYTORCH_CUDA_ALLOC_CONF"]
    assert fraction == "per_process_memory_fraction:0.1"  # 8 GiB of 80
    assert not any("smallest" in w for w in outcome.warnings)
    denial = deny(p, nodes=Fleet.of([l4]))
    assert denial.message == (
        "no GPU node lists 1 nvidia.com/gpu for the pod's containers; resources they list: "
        "nvidia.com/l4; accepted: one of those resources, or gpuwire.io/gpu-model naming a "
        "model one of them lists alone"
    )
