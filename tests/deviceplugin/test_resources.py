"""Resources: one per model on mixed nodes, replica IDs for time-slicing, names checked."""

from __future__ import annotations

import pytest

from deviceplugin.plugin.resources import Resource, Rule, assign, resource_name_error
from gpuwire import sim

MIXED = sim.make_machine(
    gpus=4, products=("NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3", "NVIDIA L4")
).devices


def test_one_resource_by_default() -> None:
    [resource] = assign(MIXED, [], "nvidia.com/gpu")
    assert resource.name == "nvidia.com/gpu"
    assert [g.index for g in resource.gpus] == [0, 1, 2, 3]
    assert resource.ids() == [g.uuid for g in MIXED]


def test_first_matching_rule_names_the_resource_unmatched_keep_the_default() -> None:
    rules = [
        Rule("*l4*", "nvidia.com/l4", replicas=4),
        Rule("*A100*", "nvidia.com/a100"),
        Rule("NVIDIA A100*", "nvidia.com/never-reached"),
    ]
    resources = assign(MIXED, rules, "nvidia.com/gpu", replicas=2)
    assert [(r.name, [g.index for g in r.gpus], r.replicas) for r in resources] == [
        ("nvidia.com/a100", [0], 2),
        ("nvidia.com/l4", [1, 3], 4),
        ("nvidia.com/gpu", [2], 2),
    ]


def test_replica_ids_map_back_to_their_gpu() -> None:
    resource = Resource("nvidia.com/gpu", MIXED[:2], replicas=3)
    uuid = MIXED[1].uuid
    assert resource.ids()[3:] == [f"{uuid}::0", f"{uuid}::1", f"{uuid}::2"]
    assert resource.gpu_of(f"{uuid}::2") == MIXED[1]
    assert max(len(i) for i in resource.ids()) <= 63  # the kubelet's limit
    for bad in (f"{uuid}::3", f"{uuid}::x", uuid, f"{MIXED[3].uuid}::0", ""):
        assert resource.gpu_of(bad) is None, bad


def test_whole_gpus_have_no_replica_suffix() -> None:
    resource = Resource("nvidia.com/gpu", MIXED[:1])
    assert resource.gpu_of(MIXED[0].uuid) == MIXED[0]
    assert resource.gpu_of(f"{MIXED[0].uuid}::0") is None


def test_socket_names_are_distinct_file_names() -> None:
    names = {Resource(n, ()).socket_name for n in ("nvidia.com/gpu", "nvidia.com/a100")}
    assert names == {"gpuwire-nvidia.com_gpu.sock", "gpuwire-nvidia.com_a100.sock"}


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("gpu", "not an extended resource name"),
        ("nvidia.com/", "not an extended resource name"),
        ("Nvidia.com/gpu", "not an extended resource name"),
        ("kubernetes.io/gpu", "reserved"),
        ("nvidia.com/" + "g" * 60, "longer than 63"),
    ],
)
def test_bad_resource_names(name: str, problem: str) -> None:
    error = resource_name_error(name)
    assert error is not None
    assert problem in error
    assert repr(name) in error


def test_good_resource_names() -> None:
    for name in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "example.org/a100-80gb"):
        assert resource_name_error(name) is None
