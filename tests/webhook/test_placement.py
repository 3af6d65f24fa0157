"""Resolving model, memory and device requests against the fleet of GPU nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpuwire import annotations as a
from gpuwire.annotations import parse
from tests.webhook.support import EXAMPLES, H100, NODES
from webhook import fleet
from webhook.fleet import GPUS_ANNOTATION, Fleet, node_from_object
from webhook.placement import Unplaceable, place


def products(placement_values: dict[str, str]) -> list[str]:
    placement = place(parse(placement_values), NODES)
    (expression,) = [e for e in placement.expressions if e["operator"] == "In"]
    values: list[str] = expression["values"]
    return values


def test_a_model_is_a_case_insensitive_substring_of_the_product() -> None:
    assert products({a.MODEL: "a100"}) == ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB"]
    assert products({a.MODEL: "A100 SXM4 80GB"}) == ["NVIDIA-A100-SXM4-80GB"]
    assert products({a.MODEL: "t4,h100"}) == ["NVIDIA-H100-80GB-HBM3", "Tesla-T4"]


def test_exclusions_apply_to_includes() -> None:
    assert products({a.MODEL: "A100,!40GB"}) == ["NVIDIA-A100-SXM4-80GB"]
    assert products({a.HAMI_USE_TYPE: "NVIDIA", a.HAMI_NOUSE_TYPE: "a100"}) == [
        "NVIDIA-H100-80GB-HBM3",
        "NVIDIA-L4",
    ]


def test_an_unknown_model_is_denied_listing_the_models_that_exist() -> None:
    with pytest.raises(Unplaceable) as caught:
        place(parse({a.MODEL: "B200,!T4"}), NODES)
    assert str(caught.value) == (
        "gpuwire.io/gpu-model: 'B200,!T4' matches no GPU node; models present: "
        "NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-L4"
    )


def test_an_empty_inventory_says_so() -> None:
    with pytest.raises(Unplaceable, match="matches no GPU node; models present: none"):
        place(parse({a.MODEL: "A100"}), Fleet())


def test_policy_allow_admits_an_unknown_model_without_the_constraint() -> None:
    placement = place(parse({a.MODEL: "B200"}), NODES, allow_unknown=True)
    assert placement.expressions == ()
    assert placement.warnings == (
        "gpuwire.io/gpu-model=B200 matches no known node; admitted without it",
    )


def test_min_memory_filters_the_chosen_models() -> None:
    placement = place(parse({a.MODEL: "A100", a.MIN_MEMORY: "80Gi"}), NODES)
    assert [n.name for n in placement.nodes] == ["gpu-a100-80g-0"]
    with pytest.raises(Unplaceable) as caught:
        place(parse({a.MODEL: "H100", a.MIN_MEMORY: "80Gi"}), NODES)
    assert "(= 81920 MiB) fits no GPU node of that model" in str(caught.value)
    assert "GPUs present: NVIDIA-H100-80GB-HBM3 81559 MiB" in str(caught.value)


def test_decimal_gigabytes_include_cards_sold_as_80_gb() -> None:
    placement = place(parse({a.MIN_MEMORY: "80G"}), NODES)
    assert [n.name for n in placement.nodes] == ["gpu-a100-80g-0", "gpu-h100-0", "gpu-mixed-0"]


def test_explicit_gpus_conflicting_with_the_model_are_denied() -> None:
    with pytest.raises(Unplaceable, match="which the pod's other GPU annotations rule out"):
        place(parse({a.MODEL: "A100", a.UUID: H100[0]}), NODES)


def test_an_unhealthy_gpu_is_granted_with_a_warning() -> None:
    t4 = next(n for n in NODES.nodes if n.name == "gpu-t4-0")
    sick = t4.gpus[1]
    placement = place(parse({a.UUID: sick.uuid}), NODES)
    assert placement.devices == (sick.uuid,)
    assert placement.warnings == (f"{sick.uuid} on node gpu-t4-0 is reported unhealthy",)


def test_share_limits_and_all_resolve_against_the_candidates() -> None:
    placement = place(parse({a.MODEL: "A100"}), NODES)
    assert placement.gpu_memory_mib() == 40960
    assert placement.gpu_count() == 8
    assert place(parse({}), Fleet()).gpu_memory_mib() is None


def node(
    name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
    }


def test_nodes_without_gpus_are_left_out_and_the_hostname_label_is_used() -> None:
    found = Fleet.of(
        [
            node("cpu", {"kubernetes.io/hostname": "cpu"}),
            node("n1", {"nvidia.com/gpu.product": "Tesla-T4", "kubernetes.io/hostname": "host-1"}),
        ]
    )
    assert [(n.name, n.hostname, n.product) for n in found.nodes] == [("n1", "host-1", "Tesla-T4")]


def test_a_malformed_gpus_annotation_is_ignored_not_fatal() -> None:
    labels = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "lots"}
    got = node_from_object(node("n1", labels, {GPUS_ANNOTATION: "{not json"}))
    assert got is not None
    assert got.gpus == ()
    assert got.memory_mib is None
    only_annotation = node("n2", {}, {GPUS_ANNOTATION: json.dumps([{"index": 0}])})
    assert node_from_object(only_annotation) is None


def test_the_nodes_file_must_be_a_node_list(tmp_path: Any) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("kind: Pod\n")
    with pytest.raises(fleet.FleetFileError, match="expected a v1 List of Node objects"):
        fleet.load(path)
    path.write_text("kind: List\nitems: [{kind: Pod}]\n")
    with pytest.raises(fleet.FleetFileError, match="every item must be a Node; found \\['Pod'\\]"):
        fleet.load(path)
    with pytest.raises(fleet.FleetFileError, match="No such file"):
        fleet.load(tmp_path / "missing.yaml")
    path.write_text('{"kind": "List", "items": [')
    with pytest.raises(fleet.FleetFileError, match=r"nodes\.yaml: unexpected end of data"):
        fleet.load(path)


def test_a_nodes_file_in_json_is_the_same_fleet_as_in_yaml(tmp_path: Any) -> None:
    """`kubectl get nodes -o json` and `-o yaml` of one cluster: one fleet."""
    listing = yaml.safe_load((EXAMPLES / "nodes.yaml").read_text())
    as_json = tmp_path / "nodes.json"
    as_json.write_text("\n  " + json.dumps(listing, indent=2))
    assert fleet.load(as_json) == fleet.load(EXAMPLES / "nodes.yaml")
    assert len(fleet.load(as_json).nodes) == 5
