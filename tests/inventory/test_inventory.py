"""`gpuwire inventory` (and `kubectl gpuwire inventory`) against the kube-apiserver stand-in:
nodes whose annotations the node agent wrote (the labeler's GPU list, the holders from real
container records and the pod-resources stand-in), plugin-less and plugin nodes, pending
GPU pods; the table on 80 columns, JSON, filters, colour, watch, bad input."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from deviceplugin.agent import holding, labeler
from deviceplugin.config import Config
from deviceplugin.gpus.amd import AmdDiscovery
from deviceplugin.gpus.backend import open_discovery
from gpuwire import amdsim, cli, exits, holders, records, sim
from gpuwire.devices import Device
from gpuwire.holders import NodeHolders
from gpuwire.records import PLUGIN_LESS
from inventory import cli as inventory
from testbed.apiserver import ApiServer
from testbed.podresources import PodResourcesKubelet
from testbed.waiting import until

BIN = Path(sys.executable).parent
PLUGIN_NODE, PLUGIN_LESS_NODE = "gpu-a", "gpu-b"
Obj = dict[str, Any]


def cri(namespace: str, pod: str, container: str) -> dict[str, str]:
    return {
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.sandbox-uid": f"uid-{pod}",
        "io.kubernetes.cri.container-name": container,
    }


def pod(namespace: str, name: str, *, gpus: int = 0, **status: Any) -> Obj:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending", **status},
    }


def publish(settings: holding.Settings, node: str, gpus: Sequence[Device], api: Any) -> None:
    """What the node's agent does on each pass: its holders into the node annotation."""
    holding.Agent(settings, node, lambda: gpus, frozenset, api).step(1.0)


@pytest.fixture
def cluster(
    tmp_path: Path, socket_dir: Path, sleeper: subprocess.Popen[bytes]
) -> Iterator[ApiServer]:
    """Two 4-GPU nodes as their gpuwire agents leave them, and some pending pods.

    gpu-a runs the device plugin: team-a/trainer-0 was allocated GPUs 0 and 1 (pod-resources),
    and a plugin-less team-b/notebook squats on GPU 1. gpu-b is plugin-less: a daemonset pod
    granted `all`, and GPU 3 unhealthy.
    """
    with ApiServer() as api:
        core_api = k8s.CoreV1Api(api.client())
        for name in (PLUGIN_NODE, PLUGIN_LESS_NODE):
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
            root = tmp_path / name
            sim.write_node(root, sim.make_machine(gpus=4))
            discovery = open_discovery(str(root))
            node_gpus = discovery.discover()
            unhealthy = {node_gpus.devices[3].uuid} if name == PLUGIN_LESS_NODE else set()
            labeler.label_once(core_api, name, Config(sim=str(root)), node_gpus, unhealthy)
            uuids = [d.uuid for d in node_gpus.devices]
            record_dir = tmp_path / f"records-{name}"
            socket = socket_dir / f"{name}.sock"
            with PodResourcesKubelet(socket) as kubelet:
                if name == PLUGIN_NODE:
                    kubelet.add_pod("team-a", "trainer-0", "u1", ["main"])
                    kubelet.assign("u1", "main", "nvidia.com/gpu", uuids[:2])
                    kubelet.advertise("nvidia.com/gpu", uuids)
                    squatter = records.started(
                        "c-notebook", cri("team-b", "notebook", "lab"), [uuids[1]],
                        path=PLUGIN_LESS, whole_node=False, capabilities=["compute"],
                        pid=sleeper.pid,
                    )  # fmt: skip
                    records.write(str(record_dir), squatter)
                else:
                    daemon = records.started(
                        "c-daemon", cri("monitoring", "agent-x7k2p", "agent"), uuids,
                        path=PLUGIN_LESS, whole_node=True, capabilities=["compute", "utility"],
                        pid=sleeper.pid,
                    )  # fmt: skip
                    records.write(str(record_dir), daemon)
                settings = holding.Settings(
                    records_dir=str(record_dir), pod_resources=str(socket), publish=True
                )
                publish(settings, name, node_gpus.devices, core_api)
            discovery.close()
        unschedulable = {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. "
                    "preemption: 0/2 nodes are available: 2 No preemption victims found.",
                }
            ]
        }
        api.put(pod("team-c", "big-job", gpus=8, **unschedulable))
        refused = pod("team-a", "trainer-1", gpus=1)
        refused["spec"]["nodeName"] = PLUGIN_NODE
        refused["status"]["containerStatuses"] = [
            {
                "name": "main",
                "state": {
                    "waiting": {
                        "reason": "CreateContainerError",
                        "message": "gpuwire: unknown device '9': this node has 0-3",
                    }
                },
            }
        ]
        api.put(refused)
        api.put(pod("team-a", "web", gpus=0))  # pending, but no GPU pod
        yield api


def run(api: ApiServer, tmp_path: Path, *argv: str, out: io.StringIO | None = None) -> str:
    stream = out or io.StringIO()
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    assert inventory.main([*argv, "--kubeconfig", kubeconfig], stream) == 0
    return stream.getvalue()


def test_the_table_shows_each_gpu_with_its_holders_and_fits_80_columns(
    cluster: ApiServer, tmp_path: Path
) -> None:
    text = run(cluster, tmp_path)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80
    assert "\x1b[" not in text  # not a terminal: no colour
    rows = [line.split() for line in lines]
    assert rows[0] == ["NODE", "GPU", "PRODUCT", "MEMORY", "HEALTH", "HOLDERS"]
    gpu = ["A100-SXM4-80GB", "80", "GiB"]
    assert rows[1:6] == [
        [PLUGIN_NODE, "0", *gpu, "ok", "team-a/trainer-0"],
        ["1", *gpu, "ok", "team-a/trainer-0,", "team-b/notebook*", "!"],  # plugin-less; conflict
        ["2", *gpu, "ok", "-"],
        ["3", *gpu, "ok", "-"],
        ["2/4", "allocated"],
    ]
    assert rows[6:11] == [
        [PLUGIN_LESS_NODE, "0", *gpu, "ok", "monitoring/agent-x7k2p*"],
        ["1", *gpu, "ok", "monitoring/agent-x7k2p*"],
        ["2", *gpu, "ok", "monitoring/agent-x7k2p*"],
        ["3", *gpu, "FAIL", "monitoring/agent-x7k2p*"],
        ["4/4", "allocated"],
    ]
    assert lines[11] == "cluster: 6/8 GPUs allocated on 2 nodes, 2 pending GPU pods, 1 conflict"
    pending = lines[13:20]
    assert pending[0].split() == ["PENDING", "POD", "REQUEST", "WHY"]
    assert pending[1].startswith(
        "team-a/trainer-1  1 nvidia.com/gpu  on gpu-a: CreateContainerError"
    )
    assert pending[3].startswith("team-c/big-job    8 nvidia.com/gpu  Unschedulable: 0/2 nodes")
    assert "team-a/web" not in text  # pending, but asks for no GPU
    conflicts = " ".join(text[text.index("CONFLICTS") :].split())
    assert (
        "! gpu-a: GPU 1 held by team-a/trainer-0 and team-b/notebook, and not shared" in conflicts
    )
    assert lines[-1] == "* plugin-less: GPUs granted by annotation, not by a device plugin"


def test_long_names_are_cut_and_wrapped_to_80_columns() -> None:
    gpus = [
        {
            "index": 0,
            "uuid": "GPU-1",
            "product": "NVIDIA H100 80GB HBM3 Very Long Edition",
            "memory_mib": 81559,
        }
    ]
    many = tuple(
        holders.Holder(f"namespace-{i}", "p" * 60, "c", "plugin", ("GPU-1",)) for i in range(3)
    )
    node = {
        "metadata": {
            "name": "node-" + "x" * 40,
            "annotations": {
                "gpuwire.io/gpus": json.dumps(gpus),
                holders.ANNOTATION: holders.encode(NodeHolders(many, (), True)),
            },
        }
    }
    waiting = pod(
        "ns",
        "q" * 70,
        gpus=1,
        conditions=[{"type": "PodScheduled", "status": "False", "message": "m " * 80}],
    )
    text = inventory.report([node], [waiting])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[1].startswith(
        "node-xxxxxxxx…    0  H100 80GB HBM3 …  80 GiB  ok      namespace-0/ppp"
    )
    assert sum(line.rstrip().endswith("…,") for line in lines) == 2  # one holder a line, cut
    assert sum("m m m" in line for line in lines) >= 4  # the reason wraps, whole
    assert "ns/" + "q" * 24 + "…" in text


def test_json_has_every_gpu_holder_pending_pod_and_conflict(
    cluster: ApiServer, tmp_path: Path
) -> None:
    data = json.loads(run(cluster, tmp_path, "-o", "json"))
    assert (data["gpuNodes"], data["total"], data["allocated"]) == (2, 8, 6)
    a, b = data["nodes"]
    assert (a["name"], a["allocated"], a["holdersKnown"]) == (PLUGIN_NODE, 2, True)
    gpu1 = a["gpus"][1]
    assert gpu1["conflict"] is True
    assert [(h["namespace"], h["pod"], h["container"], h["path"]) for h in gpu1["holders"]] == [
        ("team-a", "trainer-0", "main", "plugin"),
        ("team-b", "notebook", "lab", "plugin-less"),
    ]
    assert [g["healthy"] for g in b["gpus"]] == [True, True, True, False]
    assert b["gpus"][0]["holders"] == [
        {
            "namespace": "monitoring",
            "pod": "agent-x7k2p",
            "container": "agent",
            "path": "plugin-less",
            "all": True,
        }
    ]
    assert [(p["namespace"], p["pod"], p["reason"]) for p in data["pending"]] == [
        ("team-a", "trainer-1", "CreateContainerError"),
        ("team-c", "big-job", "Unschedulable"),
    ]
    assert data["pending"][1]["request"] == "8 nvidia.com/gpu"
    [conflict] = data["conflicts"]
    assert (conflict["node"], conflict["kind"]) == (PLUGIN_NODE, "shared-gpu")


def test_a_plugin_less_all_pod_on_a_plugin_node_is_flagged(
    cluster: ApiServer, tmp_path: Path
) -> None:
    node = cluster.get("nodes", PLUGIN_LESS_NODE)
    assert node is not None
    held = holders.decode(node["metadata"]["annotations"][holders.ANNOTATION])
    node["metadata"]["annotations"][holders.ANNOTATION] = holders.encode(
        NodeHolders(held.holders, held.shared, True)  # now a device plugin advertises there too
    )
    cluster.put(node)
    text = run(cluster, tmp_path)
    assert "monitoring/agent-x7k2p took all GPUs (GPU 0, GPU 1, GPU 2, GPU 3) without" in " ".join(
        text.split()
    )
    assert sum(line.rstrip().endswith("!") for line in text.splitlines()) == 5


def test_filters_by_node_and_namespace(cluster: ApiServer, tmp_path: Path) -> None:
    only_b = run(cluster, tmp_path, "--node", PLUGIN_LESS_NODE)
    assert PLUGIN_NODE + " " not in only_b
    assert "cluster: 4/4 GPUs allocated on 1 node\n" in only_b
    assert "PENDING" not in only_b  # no pending pod is bound to gpu-b
    team_b = run(cluster, tmp_path, "-n", "team-b")
    rows = [line.split() for line in team_b.splitlines()[1:3]]
    assert rows == [
        [PLUGIN_NODE, "1", "A100-SXM4-80GB", "80", "GiB", "ok", "team-b/notebook*", "!"],
        ["2/4", "allocated"],
    ]
    assert "cluster: 6/8 GPUs allocated on 2 nodes, 1 conflict" in team_b  # totals: every GPU


def test_wide_adds_uuids_containers_and_paths(cluster: ApiServer, tmp_path: Path) -> None:
    text = run(cluster, tmp_path, "-o", "wide")
    header = text.splitlines()[0].split()
    assert header[:3] == ["NODE", "GPU", "UUID"]
    assert "team-a/trainer-0/main (plugin)" in text
    assert "monitoring/agent-x7k2p/agent (plugin-less, all)" in text
    node = cluster.get("nodes", PLUGIN_NODE)
    assert node is not None
    first = json.loads(node["metadata"]["annotations"]["gpuwire.io/gpus"])[0]["uuid"]
    assert first in text


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(
    cluster: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = run(cluster, tmp_path, out=Terminal())
    assert "\x1b[31m" in coloured  # the conflict and the failed GPU in red
    plain = [line.replace("\x1b[", "") for line in coloured.splitlines()]
    assert len(plain) == len(run(cluster, tmp_path).splitlines())
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in run(cluster, tmp_path, out=Terminal())


def test_which_pending_pods_wait_for_a_gpu() -> None:
    def waiting(name: str, annotations: dict[str, str], env: dict[str, str] | None = None) -> Obj:
        obj = pod("ns", name)
        obj["metadata"]["annotations"] = annotations
        obj["spec"]["containers"][0]["env"] = [
            {"name": k, "value": v} for k, v in (env or {}).items()
        ]
        return obj

    pods = [
        waiting("counted", {"gpuwire.io/gpu-count": "2", "gpuwire.io/gpu-model": "A100"}),
        waiting("hami", {"nvidia.com/use-gputype": "H100"}),
        waiting("typo", {"gpuwire.io/gpu-count": "two"}),  # the webhook denies it; still listed
        waiting("mutated", {}, {"NVIDIA_VISIBLE_DEVICES": "all"}),
        waiting("driver-only", {"gpuwire.io/gpu-count": "none"}),
        waiting("profile-only", {"gpuwire.io/limit-profile": "hami"}),
        waiting("voided", {}, {"NVIDIA_VISIBLE_DEVICES": "void"}),
    ]
    data = json.loads(inventory.report([], pods, output="json"))
    assert [(p["pod"], p["request"]) for p in data["pending"]] == [
        ("counted", "gpu-count=2, gpu-model=A100"),
        ("hami", "use-gputype=H100"),
        ("mutated", "NVIDIA_VISIBLE_DEVICES=all"),
        ("typo", "gpu-count=two"),
    ]


def test_a_cluster_without_gpu_nodes_says_so() -> None:
    node = {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "8"}}}
    assert inventory.report([node], []) == (
        "cluster: 0/0 GPUs allocated on 0 nodes (no node lists GPUs or advertises a GPU resource)\n"
    )


def test_the_demo_can_render_api_objects_directly(cluster: ApiServer) -> None:
    text = inventory.report(cluster.objects("nodes"), cluster.objects("pods"))
    assert "team-a/trainer-0" in text
    assert text.startswith("NODE")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "yaml"], "argument -o/--output: 'yaml': expected one of table, wide, json"),
        (["--interval", "0"], "argument --interval: '0': expected a number of seconds above 0"),
    ],
)
def test_bad_flags_name_the_value_and_what_is_accepted(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        inventory.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_api_server_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ApiServer() as api:
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        api.fail("GET", "/api/v1/nodes", 403)
        assert cli.main(["inventory", "--kubeconfig", kubeconfig]) == exits.CLUSTER
    assert capsys.readouterr().err == (
        f"gpuwire inventory: {api.url} answered 403 Forbidden: injected fault (403)\n"
    )
    assert cli.main(["inventory", "--kubeconfig", str(tmp_path / "missing")]) == exits.NO_CLUSTER
    assert capsys.readouterr().err == (
        f"gpuwire inventory: --kubeconfig {tmp_path}/missing does not exist; give a kubeconfig "
        "file\n"
    )


def test_files_stand_in_for_the_cluster(
    cluster: ApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get ... -o yaml` files give the inventory the cluster gives; before: no way
    to run it without a cluster."""
    kubeconfig = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
    assert cli.main(["inventory", "-o", "wide", "--kubeconfig", kubeconfig]) == 0
    online = capsys.readouterr().out
    files = []
    for flag, resource in [
        ("--nodes", "nodes"),
        ("--pods", "pods"),
        ("--claims", "resourceclaims"),
        ("--slices", "resourceslices"),
    ]:
        path = tmp_path / f"{resource}.yaml"
        listed = {"apiVersion": "v1", "kind": "List", "items": cluster.objects(resource)}
        path.write_text(yaml.safe_dump(listed))
        files += [flag, str(path)]
    assert cli.main(["inventory", "-o", "wide", *files]) == 0
    assert capsys.readouterr().out == online
    assert "team-a/trainer-0" in online
    with pytest.raises(SystemExit):
        cli.main(["inventory", *files, "--kubeconfig", kubeconfig])  # one or the other
    assert "--kubeconfig and --context name a cluster" in capsys.readouterr().err


def test_gpuwire_and_kubectl_run_it(cluster: ApiServer, tmp_path: Path) -> None:
    kubeconfig = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    direct = subprocess.run(
        [str(BIN / "gpuwire"), "inventory", "--kubeconfig", kubeconfig],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    plugin = subprocess.run(
        [str(BIN / "kubectl"), "gpuwire", "inventory", "--kubeconfig", kubeconfig],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout == direct.stdout
    assert "team-a/trainer-0" in direct.stdout
    assert ("inventory",) in [w for w, _, _ in cli.COMMANDS]
    usage = subprocess.run([str(BIN / "kubectl-gpuwire")], capture_output=True, text=True)
    assert usage.returncode == 2
    assert "usage: kubectl gpuwire inventory" in usage.stderr


def test_watch_prints_again_when_something_changes(cluster: ApiServer, tmp_path: Path) -> None:
    kubeconfig = str(cluster.write_kubeconfig(tmp_path / "kubeconfig"))
    argv = ["inventory", "--watch", "--interval", "0.1", "--kubeconfig", kubeconfig]
    watch = subprocess.Popen(
        [str(BIN / "gpuwire"), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    output = watch.stdout
    assert output is not None
    seen: list[str] = []

    def printed(text: str) -> bool:
        seen.append(output.readline())
        return text in seen[-1]

    try:
        until(lambda: printed("cluster: 6/8"))
        cluster.delete("pods", "big-job", "team-c")
        until(lambda: printed("1 pending GPU pod"))
        assert sum(line.startswith("cluster:") for line in seen) == 2  # once per change
    finally:
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=10) == 0


def test_amd_gpus_and_partitions_with_their_holders(tmp_path: Path) -> None:
    """An AMD node as its node agent writes it (AMD discovery of the simulated node, its
    partitions under AMD's mixed naming) with a holder of two partitions, and pending pods that
    ask for AMD partitions or write AMD_VISIBLE_DEVICES."""
    amdsim.write_node(tmp_path, amdsim.make_machine(1, "MI300X", compute="CPX", memory="NPS1"))
    config = Config(vendor="amd", amd_naming="mixed", sim=str(tmp_path))
    found = AmdDiscovery(str(tmp_path)).discover()
    two = tuple(sorted(d.uuid for d in found.devices[:2]))
    held = holders.NodeHolders(
        (holders.Holder("team-a", "infer-0", "main", PLUGIN_LESS, two),), (), False
    )
    node = {
        "metadata": {
            "name": "amd-0",
            "labels": labeler.wanted(config, found),
            "annotations": {
                **labeler.node_annotations(config, found),
                holders.ANNOTATION: holders.encode(held),
            },
        },
        "status": {"allocatable": {"amd.com/cpx_nps1": "8"}},
    }
    asking = pod("team-b", "asks")
    asking["spec"]["containers"][0]["resources"]["limits"] = {"amd.com/cpx_nps1": "2"}
    written = pod("team-b", "wrote")
    written["spec"]["containers"][0]["env"] = [{"name": "AMD_VISIBLE_DEVICES", "value": "all"}]
    data = json.loads(inventory.report([node], [asking, written], output="json"))
    (listed,) = data["nodes"]
    assert [g["product"] for g in listed["gpus"]] == ["AMD Instinct MI300X"] * 8
    assert [[h["pod"] for h in g["holders"]] for g in listed["gpus"][:3]] == [
        ["infer-0"],
        ["infer-0"],
        [],
    ]
    assert [(p["pod"], p["request"]) for p in data["pending"]] == [
        ("asks", "2 amd.com/cpx_nps1"),
        ("wrote", "AMD_VISIBLE_DEVICES=all"),
    ]
