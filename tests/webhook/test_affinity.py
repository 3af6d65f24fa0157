"""Model and memory requests become required node affinity, merged with the pod's own: every
existing (ORed) term gets the new (ANDed) expressions; nothing is widened or dropped."""

from __future__ import annotations

from typing import Any

from gpuwire import annotations as a
from tests.webhook.support import admit, container, pod, required_terms

PRODUCT_IN_A100 = {
    "key": "nvidia.com/gpu.product",
    "operator": "In",
    "values": ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB"],
}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
RACK = {"key": "rack", "operator": "In", "values": ["r1"]}


def a100_pod(**spec: Any) -> dict[str, Any]:
    return pod({a.MODEL: "a100"}, [container(gpus=1)], **spec)


def test_a_pod_without_affinity_gets_one_term() -> None:
    mutated, _ = admit(a100_pod())
    assert required_terms(mutated) == [{"matchExpressions": [PRODUCT_IN_A100]}]


def test_other_kinds_of_affinity_are_kept() -> None:
    pod_affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "x"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    mutated, _ = admit(a100_pod(affinity=pod_affinity))
    assert mutated["spec"]["affinity"]["podAntiAffinity"] == pod_affinity["podAntiAffinity"]
    assert required_terms(mutated) == [{"matchExpressions": [PRODUCT_IN_A100]}]


def test_preferred_node_affinity_is_kept() -> None:
    preferred = [{"weight": 1, "preference": {"matchExpressions": [ZONE]}}]
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    mutated, _ = admit(a100_pod(affinity=affinity))
    node = mutated["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert required_terms(mutated) == [{"matchExpressions": [PRODUCT_IN_A100]}]


def test_every_ored_term_gets_the_new_expressions() -> None:
    terms = [
        {"matchExpressions": [ZONE]},
        {"matchExpressions": [RACK]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    mutated, _ = admit(a100_pod(affinity=affinity))
    assert required_terms(mutated) == [
        {"matchExpressions": [ZONE, PRODUCT_IN_A100]},
        {"matchExpressions": [RACK, PRODUCT_IN_A100]},
        {**terms[2], "matchExpressions": [PRODUCT_IN_A100]},
    ]


def test_expressions_already_present_are_not_repeated() -> None:
    terms = [{"matchExpressions": [PRODUCT_IN_A100, ZONE]}, {"matchExpressions": [RACK]}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    mutated, outcome = admit(a100_pod(affinity=affinity))
    assert required_terms(mutated) == [
        {"matchExpressions": [PRODUCT_IN_A100, ZONE]},
        {"matchExpressions": [RACK, PRODUCT_IN_A100]},
    ]
    assert [op for op in outcome.patch if "affinity" in op["path"]] == [
        {
            "op": "add",
            "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
            "/nodeSelectorTerms/1/matchExpressions/-",
            "value": PRODUCT_IN_A100,
        }
    ]


def test_model_memory_and_device_exclusions_are_anded() -> None:
    annotations = {
        a.MODEL: "!T4",
        a.MIN_MEMORY: "80G",
        a.UUID: "!GPU-7a67fe06-1ab7-55f1-9521-4db95082943a",  # an H100
    }
    mutated, _ = admit(pod(annotations, [container(gpus=1)]))
    assert required_terms(mutated) == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "Exists"},
                {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["Tesla-T4"]},
                {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["76293"]},
                {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-h100-0"]},
            ]
        }
    ]


def test_node_selector_is_left_alone() -> None:
    mutated, _ = admit(a100_pod(nodeSelector={"pool": "gpu"}))
    assert mutated["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert required_terms(mutated) == [{"matchExpressions": [PRODUCT_IN_A100]}]
