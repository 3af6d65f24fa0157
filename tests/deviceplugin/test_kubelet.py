"""The device plugin driven by a kubelet stand-in over real unix sockets: registration,
ListAndWatch, Allocate, GetPreferredAllocation, PreStartContainer, kubelet restarts, health
faults and recovery, several resources, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from deviceplugin.agent.labels import GPUS_ANNOTATION
from deviceplugin.api import api_pb2
from deviceplugin.config import STATE_DIR, Config
from deviceplugin.gpus import healthfile
from deviceplugin.plugin import sweep
from deviceplugin.plugin.resources import Rule
from gpuwire import allocation, cli, nodegpus, sim
from gpuwire.grant import KeyRing
from testbed.apiserver import ApiServer
from testbed.kubelet import Kubelet
from testbed.waiting import until
from tests.deviceplugin.support import serving

RESOURCE = "nvidia.com/gpu"


@pytest.fixture
def config(tmp_path: Path, socket_dir: Path, sim_node: tuple[Path, sim.Machine]) -> Config:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "key-1").write_text("cluster secret")
    return Config(
        kubelet_dir=str(socket_dir),
        sim=str(sim_node[0]),
        allocation_dir=str(tmp_path / "allocations"),
        grant_key_dir=str(keys),
        recover_after=0.3,
    )


@pytest.fixture
def kubelet(config: Config) -> Iterator[Kubelet]:
    with Kubelet(Path(config.kubelet_dir)) as k:
        yield k


def test_registers_what_it_serves(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    with serving(config):
        plugin_ = kubelet.plugin(RESOURCE)
        [registration] = kubelet.registrations
        assert registration.version == "v1beta1"
        assert registration.resource_name == RESOURCE
        assert (Path(config.kubelet_dir) / registration.endpoint).is_socket()
        assert registration.options == plugin_.options  # what GetDevicePluginOptions says
        assert plugin_.options == api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=True
        )
        devices = [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in plugin_.devices]
        assert devices == [(d.uuid, "Healthy", [d.numa_node]) for d in sim_node[1].devices]
        assert (plugin_.capacity, plugin_.allocatable) == (4, 4)


def test_allocate_gives_the_preferred_nvlink_pair_and_a_proof(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    gpus = sim_node[1].devices
    with serving(config):
        first, answer = kubelet.admit(RESOURCE, 2, pod_uid="pod-a")
        second, _ = kubelet.admit(RESOURCE, 2, pod_uid="pod-b")
    pairs = [{gpus[0].uuid, gpus[1].uuid}, {gpus[2].uuid, gpus[3].uuid}]
    assert set(first) in pairs  # an NVLink pair (0-1 or 2-3), not a split one
    assert set(second) in pairs
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(
        sorted(first, key=[g.uuid for g in gpus].index)
    )
    [mount] = answer.mounts
    token = allocation.token_of(mount.container_path)
    assert token is not None
    assert mount.read_only
    assert Path(mount.host_path) == Path(config.allocation_dir, token)
    proof = allocation.read(config.allocation_dir, token, KeyRing.load(config.grant_key_dir))
    assert (proof.resource, proof.devices) == (RESOURCE, tuple(sorted(first)))


def test_strategies_reach_the_kubelet(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    with serving(replace(config, device_specs=True, cdi="index")):
        ids, answer = kubelet.admit(RESOURCE, 1)
    index = next(d.index for d in sim_node[1].devices if d.uuid == ids[0])
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={index}"]
    paths = [(d.container_path, d.host_path) for d in answer.devices]
    assert (f"/dev/nvidia{index}", f"{sim_node[0]}/dev/nvidia{index}") in paths
    assert ("/dev/nvidiactl", f"{sim_node[0]}/dev/nvidiactl") in paths


def test_refused_allocate_names_the_device_and_leaves_no_token(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    good = sim_node[1].devices[0].uuid
    request = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[good]),
            api_pb2.ContainerAllocateRequest(devices_ids=["GPU-forged"]),
        ]
    )
    with serving(config), pytest.raises(grpc.RpcError) as refused:
        kubelet.plugin(RESOURCE).stub.Allocate(request, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device 'GPU-forged'" in refused.value.details()
    assert os.listdir(config.allocation_dir) == []  # the first container's token went too


def test_no_grant_key_is_a_clear_allocate_error(
    config: Config, kubelet: Kubelet, tmp_path: Path
) -> None:
    no_keys = replace(config, grant_key_dir=str(tmp_path / "no-keys"))
    with serving(no_keys), pytest.raises(grpc.RpcError) as refused:
        kubelet.admit(RESOURCE, 1)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no grant key" in refused.value.details()


def test_kubelet_restart_re_registers(config: Config, kubelet: Kubelet) -> None:
    with serving(config):
        kubelet.plugin(RESOURCE)
        kubelet.restart()  # sockets deleted, kubelet.sock created anew
        plugin_ = kubelet.plugin(RESOURCE)
        assert len(kubelet.registrations) == 2
        assert plugin_.capacity == 4
        kubelet.admit(RESOURCE, 1)  # the new connection serves Allocate


def test_new_kubelet_socket_alone_triggers_registration(config: Config, kubelet: Kubelet) -> None:
    """A kubelet that comes back without deleting the plugin's socket (or races it)."""
    with serving(config):
        kubelet.plugin(RESOURCE)
        kubelet.stop()
        kubelet.start()
        kubelet.wait(lambda: len(kubelet.registrations) == 2)
        assert kubelet.plugin(RESOURCE).capacity == 4


def test_plugin_started_before_the_kubelet_registers_when_it_appears(config: Config) -> None:
    with serving(config):
        time.sleep(0.2)  # let the plugin find no kubelet.sock
        with Kubelet(Path(config.kubelet_dir)) as kubelet:
            assert kubelet.plugin(RESOURCE).capacity == 4


def test_fault_makes_a_gpu_unhealthy_then_it_recovers(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    root, machine = sim_node
    bad = machine.devices[1].uuid
    with serving(config):
        plugin_ = kubelet.plugin(RESOURCE)
        seen = len(plugin_.snapshots)
        assert cli.main(["sim", "fault", str(root), "--gpu", "1", "--xid", "79"]) == 0
        after_fault = {d.ID: d.health for d in kubelet.next_snapshot(plugin_, seen)}
        assert after_fault == {
            d.uuid: "Unhealthy" if d.uuid == bad else "Healthy" for d in machine.devices
        }
        assert (plugin_.capacity, plugin_.allocatable) == (4, 3)
        after_quiet = {d.ID: d.health for d in kubelet.next_snapshot(plugin_, seen + 1)}
        assert set(after_quiet.values()) == {"Healthy"}


def test_a_fault_survives_a_plugin_restart(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    """The node agent's health state on disk (`<state dir>/health.json`): NVML reports only
    events after a start, so without it the restarted plugin would offer a GPU that faulted
    a second ago as Healthy."""
    root, machine = sim_node
    bad = machine.devices[2].uuid
    config = replace(config, recover_after=600.0)
    with serving(config):
        plugin_ = kubelet.plugin(RESOURCE)
        seen = len(plugin_.snapshots)
        sim.inject_fault(root, bad, 79)
        kubelet.next_snapshot(plugin_, seen)
    with serving(config):
        again = kubelet.wait(lambda: (p := kubelet.plugins.get(RESOURCE)) is not plugin_
                             and p is not None and p.snapshots and p)  # fmt: skip
        first = {d.ID: d.health for d in again.snapshots[0]}
    assert first == {d.uuid: "Unhealthy" if d.uuid == bad else "Healthy" for d in machine.devices}
    assert (root / STATE_DIR.lstrip("/") / "health.json").is_file()  # the simulated node's own


def test_a_torn_health_state_is_rebuilt_from_the_nodes_gpus_annotation(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine], tmp_path: Path
) -> None:
    """The device-plugin role's health file cut short: not believed, nor is every GPU taken
    for healthy (a GPU that faulted a second ago would be offered to new work): what the
    labels told the API server (the Node's gpuwire.io/gpus) is the first ListAndWatch, and
    the bad file is kept aside."""
    root, machine = sim_node
    bad = machine.devices[2].uuid
    with ApiServer() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node"}})
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        config = replace(config, recover_after=600.0, labels=True, label_interval=0.2,
                         node_name="gpu-node", kubeconfig=kubeconfig)  # fmt: skip
        with serving(config):
            plugin_ = kubelet.plugin(RESOURCE)
            sim.inject_fault(root, bad, 79)
            until(lambda: [g.uuid for g in annotated(api) if not g.healthy] == [bad])
        state = Path(config.node_state())
        whole = (state / healthfile.NAME).read_text()
        (state / healthfile.NAME).write_text(whole[: len(whole) // 2])
        with serving(config):
            again = kubelet.wait(lambda: (p := kubelet.plugins.get(RESOURCE)) is not plugin_
                                 and p is not None and p.snapshots and p)  # fmt: skip
            first = {d.ID: d.health for d in again.snapshots[0]}
    assert first == {d.uuid: "Unhealthy" if d.uuid == bad else "Healthy" for d in machine.devices}
    assert [p.name.split(".bad-")[0] for p in state.glob("*.bad-*")] == [healthfile.NAME]
    assert healthfile.load(state, 0.0, 0.0).keys() == {bad}


def annotated(api: ApiServer) -> tuple[nodegpus.NodeGpu, ...]:
    node = api.get("nodes", "gpu-node") or {}
    text = (node.get("metadata", {}).get("annotations") or {}).get(GPUS_ANNOTATION)
    return nodegpus.decode(text) if text else ()


def test_ignored_xid_changes_nothing(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    root, machine = sim_node
    with serving(replace(config, recover_after=None)):
        plugin_ = kubelet.plugin(RESOURCE)
        seen = len(plugin_.snapshots)
        sim.inject_fault(root, machine.devices[0].uuid, 13)  # ignored by default
        sim.inject_fault(root, machine.devices[3].uuid, 48)  # double-bit ECC: critical
        snapshot = kubelet.next_snapshot(plugin_, seen)
        assert [d.health for d in snapshot] == ["Healthy", "Healthy", "Healthy", "Unhealthy"]


def test_unhealthy_gpu_is_refused_and_pre_start_check_stops_restarts(
    config: Config, kubelet: Kubelet, sim_node: tuple[Path, sim.Machine]
) -> None:
    root, _ = sim_node
    with serving(replace(config, pre_start_check=True, recover_after=None)):
        plugin_ = kubelet.plugin(RESOURCE)
        assert plugin_.options.pre_start_required
        ids, _ = kubelet.admit(RESOURCE, 1)  # PreStartContainer passes
        seen = len(plugin_.snapshots)
        sim.inject_fault(root, ids[0], 79)
        kubelet.next_snapshot(plugin_, seen)
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.start_container(RESOURCE, ids)  # the container restarts
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"device '{ids[0]}'" in refused.value.details()
        assert "is unhealthy" in refused.value.details()
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        with pytest.raises(grpc.RpcError, match="is unhealthy"):
            plugin_.stub.Allocate(request, timeout=5)


def test_mixed_node_gets_one_server_per_model(tmp_path: Path, config: Config) -> None:
    root = tmp_path / "mixed"
    machine = sim.make_machine(gpus=4, products=("NVIDIA A100-SXM4-80GB", "NVIDIA L4"))
    sim.write_node(root, machine)
    rules = (Rule("*A100*", "nvidia.com/a100"), Rule("*L4*", "nvidia.com/l4", replicas=2))
    with (
        Kubelet(Path(config.kubelet_dir)) as kubelet,
        serving(replace(config, sim=str(root), rules=rules)),
    ):
        a100 = kubelet.plugin("nvidia.com/a100")
        l4 = kubelet.plugin("nvidia.com/l4")
        assert {r.endpoint for r in kubelet.registrations} == {
            "gpuwire-nvidia.com_a100.sock",
            "gpuwire-nvidia.com_l4.sock",
        }
        assert [d.ID for d in a100.devices] == [
            machine.devices[0].uuid,
            machine.devices[2].uuid,
        ]
        assert len(l4.devices) == 4
        ids, answer = kubelet.admit("nvidia.com/l4", 1)
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0].split("::")[0]


def test_time_slicing_refuses_more_than_one_replica(config: Config, kubelet: Kubelet) -> None:
    with serving(replace(config, replicas=4, fail_requests_greater_than_one=True)):
        assert kubelet.plugin(RESOURCE).capacity == 16
        ids, _ = kubelet.admit(RESOURCE, 1)
        assert "::" in ids[0]
        with pytest.raises(grpc.RpcError, match=r"request for 'nvidia.com/gpu: 2' too large"):
            kubelet.admit(RESOURCE, 2)


def test_tokens_of_gone_pods_are_swept(config: Config, kubelet: Kubelet) -> None:
    with serving(config):
        _, kept = kubelet.admit(RESOURCE, 1, pod_uid="running")
        _, dropped = kubelet.admit(RESOURCE, 1, pod_uid="finished")
        kubelet.remove_pod("finished")
    checkpoint = Path(config.kubelet_dir, sweep.CHECKPOINT)
    removed = sweep.sweep(config.allocation_dir, checkpoint, grace=0, now=time.time() + 1)
    assert removed == [allocation.token_of(dropped.mounts[0].container_path)]
    assert os.listdir(config.allocation_dir) == [allocation.token_of(kept.mounts[0].container_path)]


def test_serve_command_removes_its_socket_on_sigterm(config: Config, kubelet: Kubelet) -> None:
    argv = [
        sys.executable, "-m", "gpuwire.cli", "device-plugin", "serve",
        "--kubelet-dir", config.kubelet_dir, "--sim", str(config.sim),
        "--allocation-dir", config.allocation_dir, "--grant-key-dir", config.grant_key_dir,
    ]  # fmt: skip
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        plugin_ = kubelet.plugin(RESOURCE, timeout=30)
        socket = Path(config.kubelet_dir, plugin_.endpoint)
        assert socket.is_socket()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        _, err = process.communicate()
    assert not socket.exists()
    assert "registered nvidia.com/gpu with the kubelet" in err


def test_gpus_shared_through_mps_hand_each_replica_its_share(
    config: Config, socket_dir: Path, sim_node: tuple[Path, sim.Machine]
) -> None:
    """`sharing.mps.replicas: 4`: a quarter of a GPU per replica, in the token (MAC'd) and as
    the client variables; the GPU's control daemon has the quarter as its defaults; two
    replicas in one request are refused, as NVIDIA's plugin refuses them."""
    from gpuwire import mps
    from testbed import mps_control
    from testbed.waiting import until

    root, machine = sim_node
    mps_control.install(root)
    shared = replace(config, mps_root=str(socket_dir / "mps"), mps_replicas=4)
    gpu = machine.devices[0]
    with Kubelet(socket_dir) as kubelet, serving(shared):
        served = kubelet.plugin(RESOURCE)
        kubelet.wait(lambda: served.capacity == 4 * len(machine.devices))
        until(lambda: all(mps.ready(str(socket_dir / "mps"), d.uuid) for d in machine.devices))
        quarter = gpu.memory_mib // 4
        daemon = mps.ready(str(socket_dir / "mps"), gpu.uuid)
        assert daemon is not None
        assert daemon.defaults == mps.Defaults(25, quarter)
        ids, answer = kubelet.admit(RESOURCE, 1)
        assert dict(answer.envs) == {
            "NVIDIA_VISIBLE_DEVICES": ids[0].partition("::")[0],
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={quarter}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        }
        token = Path(answer.mounts[0].host_path).name
        found = allocation.read(shared.allocation_dir, token, KeyRing.load(shared.grant_key_dir))
        assert found.share == allocation.Share("mps", quarter, 25)
        with pytest.raises(grpc.RpcError, match="maximum request size for shared resources is 1"):
            kubelet.admit(RESOURCE, 2)
    assert all(mps.ready(str(socket_dir / "mps"), d.uuid) is None for d in machine.devices)
