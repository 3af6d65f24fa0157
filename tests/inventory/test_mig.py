"""MIG in the inventory: holders of MIG devices under their parent GPU, in the table, the JSON
and the node agent's metrics; a node whose agent wrote its annotations from a simulated
MIG node, a device-plugin pod on one MIG device (pod-resources), a plugin-less one on
another (its container record) and a third one squatting on the plugin pod's."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, generate_latest

from deviceplugin.agent import holding, labeler
from deviceplugin.agent.metrics import Metrics
from deviceplugin.config import Config
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import records, sim
from gpuwire.devices import MigDevice
from gpuwire.records import PLUGIN_LESS
from testbed.apiserver import ApiServer
from testbed.podresources import PodResourcesKubelet
from tests.inventory.test_inventory import cri, run

NODE = "gpu-m"


@pytest.fixture
def mig_cluster(
    tmp_path: Path, socket_dir: Path, sleeper: subprocess.Popen[bytes]
) -> Iterator[tuple[ApiServer, tuple[MigDevice, ...], Metrics]]:
    machine = sim.with_mig(sim.make_machine(gpus=2), 0, ("balanced",))
    root = tmp_path / "node"
    sim.write_node(root, machine)
    found = SimDiscovery(root).discover()
    big, _, small, _ = found.mig_devices
    with ApiServer() as api:
        core_api = k8s.CoreV1Api(api.client())
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        labeler.label_once(core_api, NODE, Config(sim=str(root), mig_strategy="mixed"), found)
        record_dir = tmp_path / "records"
        for cid, who, held in (
            ("c-notebook", cri("team-b", "notebook", "lab"), small),
            ("c-squat", cri("team-c", "squat", "x"), big),
        ):
            record = records.started(
                cid, who, [held.uuid], path=PLUGIN_LESS, whole_node=False,
                capabilities=["compute"], pid=sleeper.pid,
            )  # fmt: skip
            records.write(str(record_dir), record)
        metrics = Metrics()
        with PodResourcesKubelet(socket_dir / "kubelet.sock") as kubelet:
            kubelet.add_pod("team-a", "trainer", "u1", ["main"])
            kubelet.assign("u1", "main", "nvidia.com/mig-3g.40gb", [big.uuid])
            kubelet.advertise("nvidia.com/mig-3g.40gb", [big.uuid])
            settings = holding.Settings(
                records_dir=str(record_dir),
                pod_resources=str(socket_dir / "kubelet.sock"),
                publish=True,
            )
            holding.Agent(
                settings,
                NODE,
                lambda: found.devices,
                frozenset,
                core_api,
                metrics,
                lambda: found.mig_devices,
            ).step(1.0)
        yield api, found.mig_devices, metrics


def test_the_table_lists_mig_devices_and_their_holders_under_their_gpu(
    mig_cluster: tuple[ApiServer, tuple[MigDevice, ...], Metrics], tmp_path: Path
) -> None:
    api, _, _ = mig_cluster
    text = run(api, tmp_path)
    rows = [line.split() for line in text.splitlines()]
    assert max(map(len, text.splitlines())) <= 80
    assert rows[1:8] == [
        [NODE, "0", "A100-SXM4-80GB", "80", "GiB", "ok", "-"],
        ["└", "MIG", "3g.40gb", "39", "GiB", "ok", "team-a/trainer,", "team-c/squat*", "!"],
        ["└", "MIG", "2g.20gb", "20", "GiB", "ok", "-"],
        ["└", "MIG", "1g.10gb", "10", "GiB", "ok", "team-b/notebook*"],
        ["└", "MIG", "1g.10gb", "10", "GiB", "ok", "-"],
        ["1", "A100-SXM4-80GB", "80", "GiB", "ok", "-"],
        ["1/2", "allocated"],
    ]
    conflicts = " ".join(text[text.index("CONFLICTS") :].split())
    assert "MIG 3g.40gb of GPU 0 held by team-a/trainer and team-c/squat" in conflicts


def test_json_and_metrics_put_mig_holders_under_their_gpu(
    mig_cluster: tuple[ApiServer, tuple[MigDevice, ...], Metrics], tmp_path: Path
) -> None:
    api, mig, metrics = mig_cluster
    big, _, small, _ = mig
    (node,) = json.loads(run(api, tmp_path, "-o", "json"))["nodes"]
    gpu0, gpu1 = node["gpus"]
    assert "mig" not in gpu1  # MIG off
    assert [(m["uuid"], m["profile"], m["gi"]) for m in gpu0["mig"]] == [
        (m.uuid, m.profile, m.gi) for m in mig
    ]
    assert [h["pod"] for h in gpu0["mig"][0]["holders"]] == ["trainer", "squat"]
    assert gpu0["mig"][0]["conflict"] is True
    assert gpu0["holders"] == []  # the GPU itself: nobody
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert (
        f'gpuwire_mig_device_allocation{{container="lab",index="0",namespace="team-b",'
        f'node="{NODE}",parent_uuid="{small.parent_uuid}",path="plugin-less",pod="notebook",'
        f'profile="1g.10gb",uuid="{small.uuid}"}} 1.0'
    ) in text
    assert f'gpuwire_mig_device_info{{ci="0",gi="{big.gi}",index="0",memory="40192"' in text
    assert f'uuid="{small.uuid}"' not in text.split("gpuwire_gpu_allocation")[1].split("#")[0]
