"""`make demo`: its scenarios, played on its cluster, come out as the story tells them, and
the demo leaves nothing behind, also when it is interrupted.

The control plane and device plugin parts run anywhere; what the containers saw needs root
and containerd (the `containers` marker below).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from deviceplugin.api import api_pb2
from gpuwire import grant
from gpuwire.vendor import AMD, NVIDIA, Vendor
from scripts.demo import amd, dra, holders
from scripts.demo.amd import AmdNode
from scripts.demo.base import ROOT
from scripts.demo.cluster import NODE, RESOURCE, Cluster, up
from scripts.demo.dra import DraNode
from scripts.demo.kubelet import Allocation
from scripts.demo.scenarios import (
    AMD_SCENARIOS,
    DRA_SCENARIOS,
    SCENARIOS,
    Outcome,
    capabilities,
    gpus,
    play,
    render_nodes,
    variables,
)
from scripts.demo.show import command
from testbed.kuberuntime import container_config
from testbed.scheduler import AFFINITY, unfit
from testbed.view import amd_granted_view, granted_view, shown
from tests.conftest import requires_binary, requires_root

F = TypeVar("F", bound=Callable[..., None])


def needs_containers(test: F) -> F:
    marked: F = requires_root()(requires_binary("containerd", "ctr", "runc")(test))
    return marked


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with up() as running:
        yield running


Played = tuple[dict[str, Outcome], DraNode, AmdNode]


@pytest.fixture(scope="module")
def played(cluster: Cluster) -> Played:
    """Every scenario, in the demo's order: the device plugin's, then the DRA node's once it
    has joined, then the AMD node's."""
    found = {s.key: play(cluster, s) for s in SCENARIOS}
    node = dra.join(cluster, DRA_SCENARIOS[0].load())
    found |= {s.key: play(cluster, s, node) for s in DRA_SCENARIOS}
    amd_node = amd.join(cluster, AMD_SCENARIOS[0].load())
    return (
        found | {s.key: play(cluster, s, amd_node=amd_node) for s in AMD_SCENARIOS},
        node,
        amd_node,
    )


@pytest.fixture(scope="module")
def outcomes(played: Played) -> dict[str, Outcome]:
    return played[0]


@pytest.fixture(scope="module")
def dra_node(played: Played) -> DraNode:
    return played[1]


@pytest.fixture(scope="module")
def amd_node(played: Played) -> AmdNode:
    return played[2]


def env(pod: dict[str, Any] | None, container: int = 0) -> dict[str, str]:
    assert pod is not None
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][container].get("env", [])}


def verifies(
    cluster: Cluster,
    pod: dict[str, Any] | None,
    devices: str,
    caps: str | None,
    vendor: Vendor = NVIDIA,
) -> bool:
    assert pod is not None
    keys = grant.KeyRing.load(cluster.workdir / "keys")
    name = pod["spec"]["containers"][0]["name"]
    admission = pod["metadata"]["annotations"][grant.POD_ANNOTATION]  # the webhook's
    subject = grant.Subject.of(
        pod["metadata"]["namespace"], name, devices, caps, vendor, pod=admission, env=env(pod)
    )
    return keys.verify(env(pod)[grant.ENV], subject)


# --- the cluster and the control plane: anywhere


def test_the_plugin_registers_and_labels_the_node_the_webhook_reads(cluster: Cluster) -> None:
    node = cluster.node()
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert node["status"]["allocatable"][RESOURCE] == "4"
    assert cluster.kubelet.plugin(RESOURCE).allocatable == 4
    with cluster.webhook() as http:
        assert http.get("/readyz").status_code == 200


def test_all_gpus_is_granted_all_with_the_video_capability(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    pod = outcomes["all-gpus"].pod
    assert env(pod)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(pod)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility,video"
    assert verifies(cluster, pod, "all", "compute,utility,video")
    assert pod is not None
    assert pod["spec"]["runtimeClassName"] == "gpuwire"
    assert pod["spec"]["nodeName"] == NODE


def test_two_gpus_come_from_the_plugin_as_an_nvlink_pair(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    outcome = outcomes["two-gpus"]
    assert verifies(cluster, outcome.pod, "plugin", "compute,utility")
    (allocation,) = outcome.containers[0].allocations
    by_uuid = {d.uuid: d for d in cluster.devices}
    first, second = (by_uuid[u] for u in allocation.devices)
    assert (second.index, 12) in first.nvlinks
    assert set(allocation.preferred) == set(allocation.devices)
    assert allocation.envs == {"NVIDIA_VISIBLE_DEVICES": f"{first.uuid},{second.uuid}"}
    (mount,) = allocation.mounts
    assert mount.source.parent == cluster.workdir / "allocations"
    assert mount.destination == f"/run/gpuwire/allocations/{mount.source.name}"


def test_h100_is_denied_naming_the_models_there_are(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    admission = outcomes["h100"].admission
    assert not admission.allowed
    assert admission.code == 400
    assert admission.message == (
        "gpuwire.io/gpu-model: 'H100' matches no GPU node; models present: NVIDIA-A100-SXM4-80GB"
    )
    assert cluster.api.get("pods", "wants-h100", "ml-research") is None  # never stored


def test_a_baked_in_all_is_voided_by_the_webhook_unless_it_does_not_look(
    outcomes: dict[str, Outcome],
) -> None:
    assert env(outcomes["baked-in"].pod) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert outcomes["kube-system"].admission.allowed
    assert outcomes["kube-system"].admission.patch == []


def test_mps_limits_are_sized_from_the_nodes_gpu(outcomes: dict[str, Outcome]) -> None:
    pod_env = env(outcomes["mps"].pod)
    assert pod_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # 25 % of 81920 MiB
    assert pod_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_every_verdict_holds_or_says_why_it_was_not_checked(
    cluster: Cluster, outcomes: dict[str, Outcome], dra_node: DraNode, amd_node: AmdNode
) -> None:
    verdicts = {s.key: s.judge(outcomes[s.key], cluster.devices) for s in SCENARIOS}
    verdicts |= {s.key: s.judge(outcomes[s.key], dra_node.devices) for s in DRA_SCENARIOS}
    verdicts |= {s.key: s.judge(outcomes[s.key], amd_node.devices) for s in AMD_SCENARIOS}
    if cluster.containerd is None:
        assert verdicts["amd-xgmi-pair"].seen == "allocated GPUs 2,3 (one XGMI hive); not run"
        assert verdicts["amd-xgmi-pair"].ok is None
        assert verdicts["h100"].ok is True
        assert verdicts["two-gpus"].ok is None  # the pair was allocated, not run
        assert verdicts["two-gpus"].seen.startswith("allocated GPUs ")
        assert verdicts["mps"].seen == "not run"
        assert verdicts["dra-linked"].seen == "allocated GPUs 0,1 (NVLink); not run"
        assert verdicts["dra-linked"].ok is None
        assert verdicts["dra-share-a"].seen == "allocated a 30Gi share of GPU 3; not run"
        assert verdicts["dra-share-c"].ok is True
    elif dra_node.containerd is None:
        assert verdicts["dra-share-c"].ok is True
        assert verdicts["dra-linked"].ok is None  # no containerd 1.7 or 2.x here
    else:
        assert {k: v.ok for k, v in verdicts.items()} == {k: True for k in verdicts}


# --- the DRA node: anywhere


def test_the_dra_pods_get_claims_from_one_template_per_request(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    templates = cluster.api.objects("resourceclaimtemplates", "ml-dra")
    assert len(templates) == 2  # the pair's, and the 30 GiB share's (three pods)
    pod = outcomes["dra-share-a"].pod
    assert pod is not None
    (entry,) = pod["spec"]["resourceClaims"]
    assert entry["resourceClaimTemplateName"].startswith("gpuwire-")
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": entry["name"]}]
    assert env(pod) == {"NVIDIA_VISIBLE_DEVICES": "void"}  # the claim's CDI spec gives GPUs
    assert pod["spec"]["runtimeClassName"] == "gpuwire"  # gpuwire's runtime checks its claim


def test_the_pair_is_an_nvlink_pair_of_whole_gpus_and_the_shares_are_of_gpu_3(
    outcomes: dict[str, Outcome], dra_node: DraNode
) -> None:
    (claim,) = outcomes["dra-linked"].claims
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [(dra.NODE, "gpu-0"), (dra.NODE, "gpu-1")]
    assert claim["status"]["reservedFor"][0]["name"] == "linked-pair"
    for key in ("dra-share-a", "dra-share-b"):
        (claim,) = outcomes[key].claims
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == f"gpu-{dra_node.shared.minor}"
        assert result["consumedCapacity"]["memory"] == "30Gi"
    waiting = outcomes["dra-share-c"]
    assert waiting.pending == "0/2 nodes are available: 2 cannot allocate all claims."
    (claim,) = waiting.claims
    assert "allocation" not in (claim.get("status") or {})


# --- the AMD node: anywhere


def test_the_amd_node_is_labelled_by_its_plugin_and_one_grammar_selects_it(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    node = cluster.api.get("nodes", amd.NODE)
    assert node is not None
    assert node["metadata"]["labels"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X"
    assert node["status"]["allocatable"][amd.RESOURCE] == "4"
    for key, count in (("amd-mi300x", "1"), ("amd-xgmi-pair", "2")):
        pod = outcomes[key].pod
        assert pod is not None
        assert pod["spec"]["nodeName"] == amd.NODE
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {amd.RESOURCE: count}
        assert set(env(pod)) == {grant.ENV}  # AMD's plugin gives AMD_VISIBLE_DEVICES
        assert verifies(cluster, pod, "plugin", None, AMD)
    monitor = outcomes["amd-all-gpus"].pod
    assert env(monitor)["AMD_VISIBLE_DEVICES"] == "all"
    assert "NVIDIA_VISIBLE_DEVICES" not in env(monitor)  # it can land on AMD nodes only
    assert verifies(cluster, monitor, "all", None, AMD)


def test_the_amd_pair_is_one_xgmi_hive_beside_the_first_pods_gpu(
    outcomes: dict[str, Outcome], amd_node: AmdNode
) -> None:
    by_uuid = {d.uuid: d for d in amd_node.devices}
    (first,) = outcomes["amd-mi300x"].containers[0].allocations
    (pair,) = outcomes["amd-xgmi-pair"].containers[0].allocations
    assert [by_uuid[u].index for u in first.devices] == [0]
    assert sorted(by_uuid[u].index for u in pair.devices) == [2, 3]  # not GPU 1, of GPU 0's hive
    assert set(pair.preferred) == set(pair.devices)
    assert pair.envs == {"AMD_VISIBLE_DEVICES": ",".join(pair.devices)}


# --- what the containers saw: root and containerd


def seen(outcome: Outcome) -> dict[str, list[str]]:
    (started,) = outcome.containers
    assert started.running, started.error
    assert started.seen is not None
    return dict(started.seen)


@needs_containers
def test_the_daemonset_pod_sees_every_gpu_and_the_video_libraries(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    view = seen(outcomes["all-gpus"])
    expected = granted_view(cluster.devices, (0, 1, 2, 3))
    assert shown(view, expected) == expected
    assert capabilities(view) == ("compute", "utility", "video")
    (said,) = outcomes["all-gpus"].containers[0].runtime_log
    assert said.startswith("media/transcoder: GPUs 0 (")
    assert said.endswith("capabilities compute,utility,video: grant")


@needs_containers
def test_the_pair_sees_exactly_its_allocation(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    (allocation,) = outcomes["two-gpus"].containers[0].allocations
    indices = tuple(d.index for d in cluster.devices if d.uuid in allocation.devices)
    expected = granted_view(cluster.devices, indices)
    view = seen(outcomes["two-gpus"])
    assert shown(view, expected) == expected
    assert variables(view)["NVIDIA_VISIBLE_DEVICES"] == allocation.envs["NVIDIA_VISIBLE_DEVICES"]
    (said,) = outcomes["two-gpus"].containers[0].runtime_log
    assert said.endswith("capabilities compute,utility: allocation")


@needs_containers
def test_a_baked_in_all_gets_no_gpu_either_way(outcomes: dict[str, Outcome]) -> None:
    voided, unchecked = seen(outcomes["baked-in"]), seen(outcomes["kube-system"])
    for view in (voided, unchecked):
        assert view["devices"] == ["nvidia*"]  # the glob matched nothing
        assert view["smi"] == ["nvidia-smi: not found"]
        assert variables(view)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert outcomes["baked-in"].containers[0].runtime_log == ()  # it asked for nothing
    (said,) = outcomes["kube-system"].containers[0].runtime_log
    assert said.startswith("kube-system/tool: no GPU: NVIDIA_VISIBLE_DEVICES=all ")
    assert "no GPUWIRE_GRANT" in said


@needs_containers
def test_containerd_wrote_the_annotations_the_shim_trusted(outcomes: dict[str, Outcome]) -> None:
    """From the pod's metadata, sent over CRI: the demo's kubelet step writes none."""
    pod = outcomes["two-gpus"].pod
    assert pod is not None
    annotations = outcomes["two-gpus"].containers[0].annotations
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "ml-research"
    assert annotations["io.kubernetes.cri.sandbox-name"] == "trainer"
    assert annotations["io.kubernetes.cri.sandbox-uid"] == pod["metadata"]["uid"]
    assert annotations["io.kubernetes.cri.container-name"] == "trainer"


@needs_containers
def test_the_mps_pod_gets_its_limits_and_one_gpu(outcomes: dict[str, Outcome]) -> None:
    view = seen(outcomes["mps"])
    assert len(gpus(view)) == 1
    assert {k: v for k, v in variables(view).items() if k.startswith("CUDA_MPS")} == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    }
    assert view["mps"] == ["control", "nvidia-cuda-mps-control.pid"]  # its daemon's pipes
    (said,) = outcomes["mps"].containers[0].runtime_log
    assert "limits held by mps: allocation" in said


@pytest.fixture
def dra_ran(dra_node: DraNode) -> DraNode:
    """The DRA node, where its containers ran (containerd 1.7 or 2.x is here)."""
    if dra_node.containerd is None:
        pytest.skip(dra_node.no_containers)
    return dra_node


@needs_containers
def test_the_dra_pair_sees_exactly_its_claims_gpus(
    outcomes: dict[str, Outcome], dra_ran: DraNode
) -> None:
    expected = granted_view(dra_ran.devices, (0, 1))
    view = seen(outcomes["dra-linked"])
    assert shown(view, expected) == expected
    started = outcomes["dra-linked"].containers[0]
    assert len(started.cdi_ids) == 2
    assert all(i.startswith("k8s.gpu.gpuwire.io/claim=") for i in started.cdi_ids)


@needs_containers
def test_the_dra_shares_see_gpu_3_held_to_30_gib_by_hami_core(
    outcomes: dict[str, Outcome], dra_ran: DraNode
) -> None:
    for key in ("dra-share-a", "dra-share-b"):
        view = seen(outcomes[key])
        assert gpus(view) == (dra_ran.shared.minor,)
        assert variables(view)["CUDA_DEVICE_MEMORY_LIMIT"] == "30720m"
        assert any("libvgpu.so" in line for line in view.get("preload", [])), view


@needs_containers
def test_amd_containers_get_kfd_and_exactly_their_render_nodes(
    outcomes: dict[str, Outcome], amd_node: AmdNode
) -> None:
    by_uuid = {d.uuid: d for d in amd_node.devices}
    for key in ("amd-mi300x", "amd-xgmi-pair"):
        (allocation,) = outcomes[key].containers[0].allocations
        expected = amd_granted_view([by_uuid[u].minor for u in allocation.devices])
        view = seen(outcomes[key])
        assert shown(view, expected) == expected
        (said,) = outcomes[key].containers[0].runtime_log
        assert said.endswith(": allocation")
    view = seen(outcomes["amd-all-gpus"])
    assert render_nodes(view) == (128, 136, 144, 152)  # each MI300X's own; XCPs 1-7 idle in SPX
    expected = amd_granted_view([d.minor for d in amd_node.devices])
    assert shown(view, expected) == expected
    (said,) = outcomes["amd-all-gpus"].containers[0].runtime_log
    assert said.startswith("media/monitor: GPUs 0 (")
    assert said.endswith(": grant")


@needs_containers
def test_running_pods_keep_their_gpus_and_report_their_phase(
    cluster: Cluster, outcomes: dict[str, Outcome]
) -> None:
    allocated = {
        d for key in ("two-gpus", "mps") for d in outcomes[key].containers[0].allocations[0].devices
    }
    assert cluster.kubelet.plugin(RESOURCE).allocated == allocated
    assert len(allocated) == 3
    keys = ("all-gpus", "two-gpus", "baked-in", "kube-system", "mps", "dra-linked", "amd-all-gpus")
    for key in keys:
        pod = outcomes[key].pod
        assert pod is not None
        stored = cluster.api.get("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
        assert stored is not None
        assert stored["status"]["phase"] == "Running", key


@needs_containers
def test_the_inventory_shows_each_pod_on_the_gpus_it_saw_and_flags_the_overlap(
    cluster: Cluster, outcomes: dict[str, Outcome], dra_node: DraNode, amd_node: AmdNode
) -> None:
    taken = holders.take(cluster, list(outcomes.values()), dra_node.devices, amd_node.devices)
    uuids = {d.index: d.uuid for d in cluster.devices}
    trainer = tuple(sorted(uuids[i] for i in gpus(seen(outcomes["two-gpus"]))))
    (inference,) = (uuids[i] for i in gpus(seen(outcomes["mps"])))
    assert taken.held == {
        ("media", "transcoder", "transcoder"): tuple(sorted(uuids.values())),
        ("ml-research", "trainer", "trainer"): trainer,
        ("ml-serving", "inference", "server"): (inference,),
    }
    assert {c.kind for c in taken.conflicts} == {"shared-gpu", "all-beside-plugin"}
    assert "cluster: 11/12 GPUs allocated on 3 nodes, 1 pending GPU pod, 8 conflicts" in taken.table
    assert "ml-research/trainer !" in taken.table
    assert holders.judge(taken).ok
    dra_uuids = {d.index: d.uuid for d in dra_node.devices}
    assert (
        taken.dra_held
        == {
            ("ml-dra", "linked-pair", "trainer"): tuple(sorted((dra_uuids[0], dra_uuids[1]))),
            ("ml-dra", "share-a", "server"): (dra_uuids[3],),
            ("ml-dra", "share-b", "server"): (dra_uuids[3],),
        }
        == taken.dra_expected
    )
    assert taken.dra_shared == {dra_uuids[3]: 61440}
    assert "60/80 GiB" in taken.table
    assert "ml-dra/share-c" in taken.table  # pending, with the scheduler's reason
    assert holders.judge_dra(taken).ok
    amd_uuids = {d.index: d.uuid for d in amd_node.devices}
    assert (
        taken.amd_held
        == {
            ("ml-serving", "rocm-inference", "server"): (amd_uuids[0],),
            ("ml-research", "rocm-trainer", "trainer"): tuple(sorted((amd_uuids[2], amd_uuids[3]))),
            ("media", "rocm-monitor", "monitor"): tuple(sorted(amd_uuids.values())),
        }
        == taken.amd_expected
    )
    assert holders.judge_amd(taken).ok


# --- the kubelet step and the scheduler, as functions


def test_the_pods_env_is_listed_after_the_plugins_and_wins() -> None:
    """As the kubelet lists them to CRI: the plugin's envs, then the pod's, which containerd
    and runc let win (tests/system/test_containerd.py shows it in a container)."""
    spec = {"name": "c", "image": "img", "env": [{"name": "A", "value": "pod"}]}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {"containers": [spec]},
    }
    answer = api_pb2.ContainerAllocateResponse(envs={"A": "plugin", "B": "plugin"})
    plugin = Allocation("nvidia.com/gpu", (), ("GPU-1",), answer)
    config = container_config(pod, spec, "sha256:1", [plugin.answer], "/termination-log")
    listed = [(e.key, e.value) for e in config.envs]
    assert set(listed[:2]) == {("A", "plugin"), ("B", "plugin")}  # a map: in no order
    assert listed[2:] == [("A", "pod")]
    assert dict(listed) == {"A": "pod", "B": "plugin"}


def test_the_scheduler_step_keeps_a_pod_off_a_node_that_does_not_match() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"nvidia.com/gpu.memory": "40960", "kind": "gpu"}},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}},
    }

    def pod(expression: dict[str, Any], gpus: int = 1) -> dict[str, Any]:
        terms = [{"matchExpressions": [expression]}]
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        limits = {"nvidia.com/gpu": gpus}
        container = {"name": "c", "resources": {"limits": limits}}
        return {"spec": {"affinity": {"nodeAffinity": required}, "containers": [container]}}

    memory = "nvidia.com/gpu.memory"
    assert unfit(pod({"key": memory, "operator": "Gt", "values": ["40959"]}), node, None) == ""
    assert unfit(pod({"key": memory, "operator": "Gt", "values": ["40960"]}), node, None) == (
        AFFINITY
    )
    assert unfit(pod({"key": "kind", "operator": "NotIn", "values": ["gpu"]}), node, None) != ""
    assert unfit(pod({"key": "kind", "operator": "Exists"}, gpus=5), node, None) == (
        "Insufficient nvidia.com/gpu"
    )
    runtime_class = {"scheduling": {"nodeSelector": {"kind": "cpu"}}}
    assert unfit(pod({"key": "kind", "operator": "Exists"}), node, runtime_class) == AFFINITY


def test_commands_keep_each_flag_with_its_value_when_wrapped() -> None:
    argv = ["gpuwire", "webhook", "serve", *["--tls-cert", "/tmp/d/" + "x" * 40] * 3]
    lines = command(argv, {"/tmp/d": "$DEMO"})
    assert lines[0] == "  gpuwire webhook serve --tls-cert $DEMO/" + "x" * 40 + " \\"
    assert all(line.strip().startswith("--tls-cert $DEMO/") for line in lines[1:])


# --- nothing left behind


def left_behind(*paths: Path) -> list[str]:
    """Processes, files and mounts of one demo run still there (its work dir, its
    containerds' homes)."""
    found = [str(p) for p in paths if p.exists()]
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and any(str(p) in cmdline for p in paths):
            found.append(f"pid {proc.name}: {cmdline}")
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount under {p}" for p in paths if str(p) in mounts]
    return found


def test_a_failure_inside_still_stops_and_removes_everything() -> None:
    """The DRA and AMD nodes too: their plugins, kubelets and containerds go with the cluster."""
    made: list[Path] = []

    def broken_scenario() -> None:
        with up() as running:
            made.append(running.workdir)
            if running.containerd is not None:
                made.append(running.containerd.home)
            node = dra.join(running, DRA_SCENARIOS[0].load())
            if node.containerd is not None:
                made.append(node.containerd.home)
            amd_node = amd.join(running, AMD_SCENARIOS[0].load())
            if amd_node.containerd is not None:
                made.append(amd_node.containerd.home)
            raise RuntimeError("a scenario broke")

    with pytest.raises(RuntimeError, match="a scenario broke"):
        broken_scenario()
    assert left_behind(*made) == []


def test_ctrl_c_stops_and_removes_everything() -> None:
    """Ctrl-C reaches the whole foreground process group, the demo's children included."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "scripts.demo"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    paths: dict[str, Path] = {}
    for line in demo.stdout:
        for name in ("$DEMO", "$CTD"):
            if f"{name} = " in line:
                paths[name] = Path(line.split(" = ")[1].strip())
        if line.startswith("2. "):  # the first scenario has run, the second is starting
            break
    os.killpg(demo.pid, signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 130, err
    assert "interrupted: everything the demo started is stopped and removed" in err
    assert left_behind(*paths.values()) == []
