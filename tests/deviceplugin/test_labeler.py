"""`gpuwire node label` and `gpuwire node advertise` against the kube-apiserver stand-in,
through the real `kubernetes` client: labels and the GPU annotation written only when they
change, foreign labels untouched, health in the annotation, the extended-resource PATCH."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin import cli
from deviceplugin.agent import labeler
from deviceplugin.config import Config
from deviceplugin.gpus.amd import AmdNodeGpus
from deviceplugin.gpus.backend import open_discovery
from deviceplugin.gpus.discovery import Latest, NodeGpus
from deviceplugin.plugin import serve
from gpuwire import limits, sim
from gpuwire.kfd import AmdNode
from gpuwire.roots import Roots
from testbed.apiserver import ApiServer
from testbed.kubelet import Kubelet
from testbed.waiting import until

NODE = "gpu-node-1"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE,
                    "labels": {
                        "kubernetes.io/hostname": NODE,
                        "nvidia.com/gpu.deploy.driver": "true",  # GPU Operator's
                        "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB",  # stale
                        "gpuwire.io/gpu.model.v100": "8",  # stale
                    },
                },
                "status": {"capacity": {"cpu": "64", "memory": "512Gi"}},
            }
        )
        yield server


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> str:
    return str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def node_meta(api: ApiServer) -> dict[str, Any]:
    node = api.get("nodes", NODE)
    assert node is not None
    meta: dict[str, Any] = node["metadata"]
    return meta


def writes(api: ApiServer) -> list[tuple[str, str, str]]:
    return [(r.method, r.path, r.content_type) for r in api.requests if r.method != "GET"]


def test_label_writes_labels_and_annotation_once(
    api: ApiServer,
    kubeconfig: str,
    sim_node: tuple[Path, sim.Machine],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, machine = sim_node
    argv = ["--sim", str(root), "--node", NODE, "--kubeconfig", kubeconfig]
    assert cli.label(argv) == 0
    meta = node_meta(api)
    labels = meta["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["gpuwire.io/gpu.model.a100"] == "4"
    assert "gpuwire.io/gpu.model.v100" not in labels  # ours and stale: removed
    assert labels["nvidia.com/gpu.deploy.driver"] == "true"  # not ours: kept
    assert labels["kubernetes.io/hostname"] == NODE
    gpus = json.loads(meta["annotations"]["gpuwire.io/gpus"])
    assert [(g["uuid"], g["healthy"]) for g in gpus] == [(d.uuid, True) for d in machine.devices]
    assert writes(api) == [("PATCH", f"/api/v1/nodes/{NODE}", "application/merge-patch+json")]
    capsys.readouterr()
    assert cli.label(argv) == 0  # nothing changed: one GET, no PATCH
    assert capsys.readouterr().out == f"node {NODE}: labels up to date\n"
    assert len(writes(api)) == 1


def test_runtime_ready_is_labelled_only_by_an_agent_that_says_so_and_unlabel_removes_it_all(
    api: ApiServer, kubeconfig: str, sim_node: tuple[Path, sim.Machine]
) -> None:
    """The RuntimeClass gpuwire waits for gpuwire.io/runtime-ready: an agent running with
    gpuwire's handler sets it (--runtime-ready) while the installer's ready file is there;
    `node unlabel` (uninstall) removes every label and annotation the agent writes, and
    nothing else."""
    root, _ = sim_node
    argv = ["--sim", str(root), "--node", NODE, "--kubeconfig", kubeconfig]
    ready = root / "run/gpuwire/node/ready"  # the installer's
    assert cli.label([*argv, "--runtime-ready", str(ready)]) == 0
    assert "gpuwire.io/runtime-ready" not in node_meta(api)["labels"]  # not installed yet
    ready.parent.mkdir(parents=True)
    ready.write_text("0.1.0\n")
    assert cli.label([*argv, "--runtime-ready", str(ready)]) == 0
    assert node_meta(api)["labels"]["gpuwire.io/runtime-ready"] == "true"
    node = api.get("nodes", NODE)
    assert node is not None
    node["metadata"]["annotations"] |= {"gpuwire.io/holders": "[]", "other.io/x": "y"}
    api.put(node)
    assert cli.label(argv) == 0  # an agent without the flag takes the label back
    assert "gpuwire.io/runtime-ready" not in node_meta(api)["labels"]
    assert cli.unlabel(["--node", NODE, "--kubeconfig", kubeconfig]) == 0
    meta = node_meta(api)
    assert meta["labels"] == {
        "kubernetes.io/hostname": NODE,
        "nvidia.com/gpu.deploy.driver": "true",
    }
    assert meta["annotations"] == {"other.io/x": "y"}


def test_dry_run_prints_and_writes_nothing(
    api: ApiServer, sim_node: tuple[Path, sim.Machine], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = sim_node
    assert cli.label(["--sim", str(root), "--dry-run", "--replicas", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["nvidia.com/gpu.replicas"] == "2"
    assert printed["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-SHARED"
    assert api.requests == []


def test_serve_with_labels_reports_health_in_the_annotation(
    api: ApiServer,
    kubeconfig: str,
    sim_node: tuple[Path, sim.Machine],
    tmp_path: Path,
    socket_dir: Path,
) -> None:
    root, machine = sim_node
    config = Config(
        kubelet_dir=str(socket_dir),
        sim=str(root),
        allocation_dir=str(tmp_path / "alloc"),
        grant_key_dir=str(tmp_path / "keys"),
        labels=True,
        node_name=NODE,
        kubeconfig=kubeconfig,
        recover_after=None,
    )

    def healthy() -> list[bool]:
        annotation = node_meta(api).get("annotations", {}).get("gpuwire.io/gpus", "[]")
        return [g["healthy"] for g in json.loads(annotation)]

    stop = threading.Event()
    with Kubelet(Path(config.kubelet_dir)) as kubelet:
        thread = threading.Thread(target=serve.run, args=(config, stop))
        thread.start()
        try:
            kubelet.plugin("nvidia.com/gpu")
            until(lambda: healthy() == [True] * 4)
            sim.inject_fault(root, machine.devices[2].uuid, 79)
            until(lambda: healthy() == [True, True, False, True])
        finally:
            stop.set()
            thread.join(timeout=30)
    assert node_meta(api)["labels"]["gpuwire.io/gpu.count"] == "4"


def test_labeler_survives_api_errors(
    api: ApiServer, kubeconfig: str, sim_node: tuple[Path, sim.Machine]
) -> None:
    root, _ = sim_node
    config = Config(sim=str(root), node_name=NODE, kubeconfig=kubeconfig, label_interval=0.2)
    api.fail("PATCH", f"/api/v1/nodes/{NODE}", 500, times=2)
    stop = threading.Event()
    thread = threading.Thread(
        target=labeler.run, args=(config, Latest(open_discovery(str(root))), stop)
    )
    thread.start()
    try:
        until(lambda: "gpuwire.io/gpu.present" in node_meta(api)["labels"])
    finally:
        stop.set()
        thread.join(timeout=30)
    assert [r.method for r in api.requests].count("PATCH") == 3


def test_advertise_patches_status_capacity(
    api: ApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--resource",
        "nvidia.com/gpu",
        "--count",
        "4",
        "--node",
        NODE,
        "--kubeconfig",
        kubeconfig,
    ]
    assert cli.advertise(argv) == 0
    node = api.get("nodes", NODE)
    assert node is not None
    assert node["status"]["capacity"] == {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4"}
    assert writes(api) == [("PATCH", f"/api/v1/nodes/{NODE}/status", "application/json-patch+json")]
    out = capsys.readouterr().out
    assert '"path": "/status/capacity/nvidia.com~1gpu"' in out
    assert cli.advertise(argv) == 0
    assert "already advertised" in capsys.readouterr().out
    assert len(writes(api)) == 1


def test_advertise_on_a_node_without_capacity(api: ApiServer, kubeconfig: str) -> None:
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare"}})
    argv = ["--count", "2", "--node", "bare", "--kubeconfig", kubeconfig]
    assert cli.advertise(argv) == 0
    node = api.get("nodes", "bare")
    assert node is not None
    assert node["status"]["capacity"] == {"nvidia.com/gpu": "2"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--resource", "gpu", "--count", "1"],
            "--resource 'gpu' is not an extended resource name",
        ),
        (["--count", "-1"], "--count -1: expected 0 or more"),
    ],
)
def test_advertise_refuses_bad_input(
    api: ApiServer, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.advertise(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert api.requests == []


def test_node_name_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    assert labeler.node_name(None) == "from-downward-api"
    assert labeler.node_name("given") == "given"


def test_the_limits_labels_say_what_holds_limits_on_this_node(tmp_path: Path) -> None:
    """gpuwire.io/limits.mps where the agent runs MPS daemons (mps.root and the driver's
    control program), .hami where HAMi-core's library is there; neither where the plugin
    answers with CDI devices (no gpuwire runtime joins them) or the mechanism is missing."""
    from testbed import mps_control

    node = tmp_path / "node"
    sim.write_node(node, sim.make_machine(gpus=2))
    gpus = open_discovery(str(node)).discover()
    library = str(node / sim.HAMI_LIBRARY)
    config = Config(sim=str(node), mps_root=str(tmp_path / "mps"), hami_library=library)

    def held(c: Config) -> dict[str, str]:
        wanted = labeler.wanted(c, gpus)
        return {k: v for k, v in wanted.items() if k.startswith(limits.LABEL_PREFIX)}

    (node / "usr/bin/nvidia-cuda-mps-control").unlink()  # a driver without MPS
    assert held(config) == {"gpuwire.io/limits.hami": "true"}
    mps_control.install(node)
    assert held(config) == {"gpuwire.io/limits.mps": "true", "gpuwire.io/limits.hami": "true"}
    assert held(replace(config, cdi="uuid")) == {}
    assert held(replace(config, mps_root=None, hami_library=str(node / "none.so"))) == {}


def test_a_node_whose_discovery_found_no_gpu_is_not_ready_for_gpu_pods(tmp_path: Path) -> None:
    """gpuwire.io/runtime-ready sends GPU pods to a node: one where discovery found no GPU
    gets no such label, AMD's as NVIDIA's. Before: an AMD node got it whatever its
    discovery found."""
    ready = tmp_path / "ready"
    ready.write_text("0.1.0\n")
    nvidia = NodeGpus("550.54.15", "12.4", (), ())
    amd = AmdNodeGpus("6.8.5", "", (), (), kfd=AmdNode(Roots(str(tmp_path)), "6.8.5", (), None))
    for vendor, empty in (("nvidia", nvidia), ("amd", amd)):
        config = Config(vendor=vendor, runtime_ready=str(ready))
        assert labeler.runtime_ready(config)
        assert "gpuwire.io/runtime-ready" not in labeler.wanted(config, empty), vendor
