"""Labels: GFD's keys and formats, gpuwire's normalised keys, stable on mixed nodes, and a
patch that changes only what differs."""

from __future__ import annotations

import json

import pytest

from deviceplugin.agent.labels import changes, gpus_annotation, labels, model_token
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from deviceplugin.plugin.resources import Resource, Rule, assign
from gpuwire import sim


def node_of(machine: sim.Machine) -> NodeGpus:
    gpus = tuple(Gpu(g.device, g.compute_capability) for g in machine.gpus)
    return NodeGpus(machine.driver_version, machine.cuda_version, gpus)


A100X4 = node_of(sim.make_machine(gpus=4))


def test_gfd_and_gpuwire_keys_for_a_homogeneous_node() -> None:
    resources = assign(A100X4.devices, [], "nvidia.com/gpu")
    assert labels(A100X4, resources) == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "nvidia.com/mig.capable": "false",
        "gpuwire.io/gpu.present": "true",
        "gpuwire.io/gpu.count": "4",
        "gpuwire.io/gpu.model": "a100",
        "gpuwire.io/gpu.memory": "80",
        "gpuwire.io/gpu.nvlink": "true",
        "gpuwire.io/gpu.model.a100": "4",
        "gpuwire.io/gpu.model.a100.memory": "80",
    }


def test_time_slicing_labels() -> None:
    shared = [Resource("nvidia.com/gpu", A100X4.devices, replicas=4)]
    out = labels(A100X4, shared)
    assert out["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED"
    assert out["nvidia.com/gpu.replicas"] == "4"
    assert out["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    renamed = [Resource("nvidia.com/gpu.shared", A100X4.devices, replicas=4)]
    assert (
        labels(A100X4, renamed, renamed=True)["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    )


def test_mixed_node_labels_do_not_depend_on_order() -> None:
    products = (
        "NVIDIA L4",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA L4",
        "NVIDIA L4",
    )
    node = node_of(sim.make_machine(gpus=5, products=products, nvlink="none"))
    shuffled = NodeGpus(node.driver_version, node.cuda_version, tuple(reversed(node.gpus)))
    out = labels(node, assign(node.devices, [], "nvidia.com/gpu"))
    assert out == labels(shuffled, assign(shuffled.devices, [], "nvidia.com/gpu"))
    assert out["nvidia.com/gpu.product"] == "NVIDIA-L4"  # 3 L4s beat 2 H100s
    assert out["nvidia.com/gpu.memory"] == "23034"
    assert out["nvidia.com/gpu.family"] == "ada-lovelace"
    assert out["gpuwire.io/gpu.model"] == "mixed"
    assert out["gpuwire.io/gpu.model.l4"] == "3"
    assert out["gpuwire.io/gpu.model.h100"] == "2"
    assert out["gpuwire.io/gpu.model.h100.memory"] == "80"  # 81559 MiB, rounded
    assert out["gpuwire.io/gpu.memory"] == "22"
    assert out["gpuwire.io/gpu.nvlink"] == "false"


def test_a_tie_goes_to_the_model_of_the_lowest_index() -> None:
    node = node_of(sim.make_machine(gpus=2, products=("NVIDIA H200", "Tesla T4")))
    assert labels(node, [])["nvidia.com/gpu.product"] == "NVIDIA-H200"


def test_no_gpus_no_labels() -> None:
    assert labels(NodeGpus("550.54.15", "12.4", ()), []) == {}


@pytest.mark.parametrize(
    ("product", "token"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("Quadro RTX 8000", "rtx-8000"),
        ("NVIDIA", "nvidia"),
    ],
)
def test_model_tokens(product: str, token: str) -> None:
    assert model_token(product) == token


def test_gpus_annotation_is_what_the_webhook_reads() -> None:
    resources = assign(A100X4.devices, [Rule("*", "nvidia.com/a100")], "nvidia.com/gpu")
    entries = json.loads(gpus_annotation(A100X4, resources, {A100X4.devices[1].uuid}))
    assert entries[1] == {
        "index": 1,
        "uuid": A100X4.devices[1].uuid,
        "product": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "numa_node": 0,
        "healthy": False,
        "resource": "nvidia.com/a100",
        "replicas": 1,
    }
    assert [e["healthy"] for e in entries] == [True, False, True, True]


def test_changes_touch_only_what_differs_and_what_we_own() -> None:
    current = {
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.product": "old",
        "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/gpu.deploy.driver": "true",  # GPU Operator's: not ours
        "gpuwire.io/gpu.model.v100": "2",
        "kubernetes.io/hostname": "n1",
    }
    wanted = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.product": "new"}
    owned = ("nvidia.com/gpu.product", "nvidia.com/cuda.driver-version.revision", "gpuwire.io/gpu.")
    assert changes(current, wanted, owned) == {
        "nvidia.com/gpu.product": "new",
        "nvidia.com/cuda.driver-version.revision": None,
        "gpuwire.io/gpu.model.v100": None,
    }
    assert changes(wanted, wanted, owned) == {}
