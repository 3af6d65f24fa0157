"""`gpuwire.io/mig-profile` (counted by `gpuwire.io/gpu-count`): the device plugin's
mixed-strategy resource for clusters with a plugin, MIG devices the webhook names for
plugin-less ones, node affinity on the MIG labels, and denials that list the profiles that
exist. The fleet is what the node agent writes (deviceplugin/agent/labels.py) for simulated nodes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from deviceplugin.agent.labeler import wanted
from deviceplugin.agent.labels import GPUS_ANNOTATION, gpus_annotation
from deviceplugin.config import Config
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import annotations as keys
from gpuwire import grant, holders, sim
from gpuwire.devices import MigDevice
from tests.webhook.support import ADMISSION, KEYS, OPEN, admit, container, deny, env, pod
from webhook import fleet

PLUGIN_LESS = replace(OPEN, device_plugin=False)


def node_object(
    tmp_path: Any, name: str, product: str, layout: dict[int, tuple[str, ...]], gpus: int = 2
) -> tuple[dict[str, Any], tuple[MigDevice, ...]]:
    """A Node as the node agent labels it (mixed strategy) for a simulated node."""
    machine = sim.make_machine(gpus=gpus, products=(product,), seed=name)
    for index, profiles in layout.items():
        machine = sim.with_mig(machine, index, profiles)
    root = tmp_path / name
    sim.write_node(root, machine)
    found = SimDiscovery(root).discover()
    labels = {**wanted(Config(mig_strategy="mixed"), found), "kubernetes.io/hostname": name}
    meta = {
        "name": name,
        "labels": labels,
        "annotations": {GPUS_ANNOTATION: gpus_annotation(found)},
    }
    return {"kind": "Node", "metadata": meta}, found.mig_devices


@pytest.fixture
def cluster(tmp_path: Any) -> tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]]:
    """An A100-80GB node all-balanced, an H100 node with two 3g.40gb, an L4 node (no MIG)."""
    a100, a100_mig = node_object(tmp_path, "a100", "NVIDIA A100-SXM4-80GB", {0: ("balanced",)})
    h100, h100_mig = node_object(
        tmp_path, "h100", "NVIDIA H100 80GB HBM3", {0: ("3g.40gb",), 1: ("3g.40gb",)}
    )
    l4, _ = node_object(tmp_path, "l4", "NVIDIA L4", {})
    return fleet.Fleet.of([a100, h100, l4]), {"a100": a100_mig, "h100": h100_mig}


def affinity(p: dict[str, Any]) -> list[dict[str, Any]]:
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return list(terms[0]["matchExpressions"])


def test_the_fleet_reads_the_mig_devices_and_labels_the_agent_writes(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, mig = cluster
    a100 = next(n for n in nodes.nodes if n.name == "a100")
    assert a100.offers() == {"1g.10gb", "2g.20gb", "3g.40gb"}
    assert a100.mig_profiles == ("1g.10gb", "2g.20gb", "3g.40gb")  # GFD's mixed labels
    assert [m.uuid for g in a100.gpus for m in g.mig or ()] == [m.uuid for m in mig["a100"]]
    assert a100.gpus[1].mig is None  # MIG off
    assert nodes.mig_profiles() == ["1g.10gb", "2g.20gb", "3g.40gb"]


def test_with_a_device_plugin_a_profile_becomes_the_mixed_strategy_resource(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, _ = cluster
    raw = pod({keys.MIG_PROFILE: "1g.10gb", keys.COUNT: "2"})
    mutated, _ = admit(raw, nodes=nodes)
    c = mutated["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "2"}
    assert "NVIDIA_VISIBLE_DEVICES" not in env(mutated)  # the plugin's Allocate sets it
    subject = grant.Subject.of("ml", "app", grant.PLUGIN_DEVICES, "compute,utility", pod=ADMISSION)
    assert KEYS.verify(env(mutated)["GPUWIRE_GRANT"], subject)
    assert affinity(mutated) == [
        {"key": "nvidia.com/mig-1g.10gb.count", "operator": "Gt", "values": ["1"]}
    ]


def test_a_pod_that_already_asks_for_the_resource_is_a_plugin_pod(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, _ = cluster
    app = container()
    app["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": 1}}
    mutated, _ = admit(pod(containers=[app]), nodes=nodes)
    assert env(mutated)["GPUWIRE_GRANT"]
    assert "affinity" not in mutated["spec"]  # the scheduler places it by the resource


def test_without_a_device_plugin_the_webhook_names_free_mig_devices(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, mig = cluster
    raw = pod({keys.MIG_PROFILE: "3g.40gb", keys.MODEL: "H100"})
    mutated, outcome = admit(raw, policy=PLUGIN_LESS, nodes=nodes)
    named = env(mutated)["NVIDIA_VISIBLE_DEVICES"]
    assert named in {m.uuid for m in mig["h100"]}
    subject = grant.Subject.of("ml", "app", named, "compute,utility", pod=ADMISSION)
    assert KEYS.verify(env(mutated)["GPUWIRE_GRANT"], subject)
    expressions = affinity(mutated)
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h100"]} in expressions
    assert any("named without a device plugin" in w for w in outcome.warnings)
    # the next pod of the same kind gets the other one; then there is none left
    second, _ = admit(raw, policy=PLUGIN_LESS, nodes=nodes)
    assert {named, env(second)["NVIDIA_VISIBLE_DEVICES"]} == {m.uuid for m in mig["h100"]}
    denial = deny(raw, policy=PLUGIN_LESS, nodes=nodes)
    assert "gpuwire.io/mig-profile: '3g.40gb': no node has 1 free 3g.40gb" in denial.message


def test_held_and_unhealthy_mig_devices_are_not_named(tmp_path: Any) -> None:
    obj, devices = node_object(tmp_path, "a100", "NVIDIA A100-SXM4-80GB", {0: ("1g.10gb",) * 3})
    first, second, third = devices
    held = holders.NodeHolders(
        (holders.Holder("ml", "other", "app", "plugin-less", (first.uuid,)),), (), False
    )
    obj["metadata"]["annotations"][holders.ANNOTATION] = holders.encode(held)
    gpus = json.loads(obj["metadata"]["annotations"][GPUS_ANNOTATION])
    for m in gpus[0]["mig"]:
        m["healthy"] = m["uuid"] != second.uuid
    obj["metadata"]["annotations"][GPUS_ANNOTATION] = json.dumps(gpus)
    nodes = fleet.Fleet.of([obj])
    mutated, _ = admit(pod({keys.MIG_PROFILE: "1g.10gb"}), policy=PLUGIN_LESS, nodes=nodes)
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == third.uuid


def test_a_profile_no_node_offers_is_denied_listing_those_that_exist(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, _ = cluster
    for policy in (None, PLUGIN_LESS):
        denial = deny(pod({keys.MIG_PROFILE: "1g.5gb"}), nodes=nodes, policy=policy)
        assert denial.code == 400
        assert denial.message == (
            "gpuwire.io/mig-profile: '1g.5gb' is offered by no GPU node; "
            "MIG profiles present: 1g.10gb, 2g.20gb, 3g.40gb"
        )
    of_model = deny(pod({keys.MIG_PROFILE: "2g.20gb", keys.MODEL: "H100"}), nodes=nodes)
    assert "'2g.20gb' is offered by no GPU node of that model" in of_model.message


@pytest.mark.parametrize(
    ("annotations", "resources", "says"),
    [
        ({keys.MIG_PROFILE: "1g.10gb"}, {"nvidia.com/gpu": 1}, "asks for whole GPUs"),
        ({keys.MIG_PROFILE: "2g.20gb"}, {"nvidia.com/mig-1g.10gb": 1}, "disagrees with"),
        ({}, {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}, "one or the other"),
        ({keys.MIG_PROFILE: "1g.10gb", keys.COUNT: "all"}, {}, "not a number of MIG devices"),
        ({keys.MIG_PROFILE: "10gb"}, {}, "'10gb' is not a MIG profile"),
    ],
)
def test_mig_requests_that_contradict_themselves_are_denied(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
    annotations: dict[str, str],
    resources: dict[str, int],
    says: str,
) -> None:
    app = container()
    if resources:
        app["resources"] = {"limits": resources}
    denial = deny(pod(annotations, containers=[app]), nodes=cluster[0])
    assert says in denial.message
    assert denial.code == 400


def test_a_mig_device_named_by_uuid_pins_its_node(
    cluster: tuple[fleet.Fleet, dict[str, tuple[MigDevice, ...]]],
) -> None:
    nodes, mig = cluster
    target = mig["a100"][1]
    mutated, _ = admit(pod({keys.UUID: target.uuid}), policy=PLUGIN_LESS, nodes=nodes)
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == target.uuid
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["a100"]} in affinity(
        mutated
    )
