"""The node agent's holders: the device plugin allocating through the kubelet stand-in, the
kubelet's pod-resources API served by its stand-in over a real unix socket, container
records of real processes, and the node annotation and metrics that come out, against the
kube-apiserver stand-in."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deviceplugin import cli
from deviceplugin.agent import holding, labeler, podresources
from deviceplugin.config import Config
from deviceplugin.gpus.simulated import SimDiscovery
from deviceplugin.plugin import serve
from gpuwire import holders, records, sim
from gpuwire.dra import DRIVER
from gpuwire.records import DRA, PLUGIN, PLUGIN_LESS
from testbed.apiserver import ApiServer
from testbed.kubelet import Kubelet
from testbed.podresources import PodResourcesKubelet
from testbed.waiting import until

NODE = "gpu-node-1"
RESOURCE = "nvidia.com/gpu"
DAEMON = {
    "io.kubernetes.cri.sandbox-namespace": "monitoring",
    "io.kubernetes.cri.sandbox-name": "agent-x7k2p",
    "io.kubernetes.cri.sandbox-uid": "u-agent",
    "io.kubernetes.cri.container-name": "agent",
}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield server


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> str:
    return str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def annotation(api: ApiServer) -> holders.NodeHolders | None:
    node = api.get("nodes", NODE)
    assert node is not None
    text = (node["metadata"].get("annotations") or {}).get(holders.ANNOTATION)
    return holders.decode(text) if text else None


def held(api: ApiServer) -> list[tuple[str, str, int, bool]]:
    node = annotation(api)
    return [(h.name, h.path, len(h.gpus), h.whole_node) for h in node.holders] if node else []


@pytest.fixture
def config(
    kubeconfig: str, sim_node: tuple[Path, sim.Machine], tmp_path: Path, socket_dir: Path
) -> Config:
    """The device plugin on the simulated node, writing to the apiserver stand-in's node."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k1").write_text("secret")
    return Config(
        kubelet_dir=str(socket_dir / "dp"),
        sim=str(sim_node[0]),
        allocation_dir=str(tmp_path / "alloc"),
        grant_key_dir=str(tmp_path / "keys"),
        node_name=NODE,
        kubeconfig=kubeconfig,
    )


@contextmanager
def serving(config: Config, settings: holding.Settings) -> Iterator[Kubelet]:
    """The plugin with its holders job, registered with a kubelet stand-in; stopped after."""
    stop = threading.Event()
    with Kubelet(Path(config.kubelet_dir)) as kubelet:
        thread = threading.Thread(target=serve.run, args=(config, stop, None, settings))
        thread.start()
        try:
            kubelet.plugin(RESOURCE)
            yield kubelet
        finally:
            stop.set()
            thread.join(timeout=30)


def patches(api: ApiServer) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text: str = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith("gpuwire_")]


def test_the_plugin_publishes_who_holds_which_gpu_and_serves_metrics(
    api: ApiServer,
    config: Config,
    sim_node: tuple[Path, sim.Machine],
    tmp_path: Path,
    socket_dir: Path,
    sleeper: subprocess.Popen[bytes],
) -> None:
    root, machine = sim_node
    record_dir = tmp_path / "containers"
    port = free_port()
    settings = holding.Settings(
        records_dir=str(record_dir),
        pod_resources=str(socket_dir / "pr" / "kubelet.sock"),
        interval=0.05,
        grace=0,
        publish=True,
        metrics_port=port,
    )
    with (
        serving(config, settings) as kubelet,
        PodResourcesKubelet(Path(settings.pod_resources), kubelet) as pod_resources,
    ):
        kubelet.admit(RESOURCE, 2, pod_uid="u-trainer", container="main")
        pod_resources.add_pod("team-a", "trainer-0", "u-trainer", ["main", "logger"])
        until(lambda: held(api) == [("team-a/trainer-0", PLUGIN, 2, False)])
        published = annotation(api)
        assert published is not None
        assert (published.plugin, published.shared) == (True, ())
        # a daemonset-style pod granted every GPU by annotation, on the plugin's node
        every = [d.uuid for d in machine.devices]
        started = records.started(
            "c-agent",
            DAEMON,
            every,
            path=PLUGIN_LESS,
            whole_node=True,
            capabilities=["compute", "utility"],
            pid=sleeper.pid,
        )
        records.write(str(record_dir), started)
        until(lambda: len(held(api)) == 2)
        assert held(api) == [
            ("monitoring/agent-x7k2p", PLUGIN_LESS, 4, True),
            ("team-a/trainer-0", PLUGIN, 2, False),
        ]
        lines = scrape(port)
        info = [line for line in lines if line.startswith("gpuwire_gpu_info{")]
        assert len(info) == 4
        assert f'uuid="{every[0]}"' in info[0]
        assert 'product="NVIDIA A100-SXM4-80GB"' in info[0]
        assert sum(line.endswith(" 1.0") for line in lines if "gpu_health{" in line) == 4
        allocations = [line for line in lines if line.startswith("gpuwire_gpu_allocation{")]
        assert len(allocations) == 6
        assert any(
            'namespace="team-a"' in a and 'pod="trainer-0"' in a and 'path="plugin"' in a
            for a in allocations
        )
        conflicts = [line for line in lines if line.startswith("gpuwire_gpu_conflict{")]
        kinds = sorted(c.split('kind="')[1].split('"')[0] for c in conflicts)
        assert kinds == ["all-beside-plugin"] * 4 + ["shared-gpu"] * 2
        # the daemon's container dies without a delete: swept, published, metrics follow
        sleeper.kill()
        sleeper.wait()
        until(lambda: len(held(api)) == 1)
        assert not record_dir.joinpath("c-agent").exists()
        until(lambda: not any("gpu_conflict{" in line for line in scrape(port)))
        sim.inject_fault(root, every[1], 79)
        unhealthy = f'gpuwire_gpu_health{{index="1",node="{NODE}",uuid="{every[1]}"}} 0.0'
        until(lambda: unhealthy in scrape(port))
    with pytest.raises(urllib.error.URLError):  # the endpoint went with the agent
        scrape(port)


def test_the_plugin_knows_it_allocates_without_pod_resources(
    api: ApiServer, config: Config, tmp_path: Path, socket_dir: Path
) -> None:
    settings = holding.Settings(
        records_dir=str(tmp_path / "records"),
        pod_resources=str(socket_dir / "absent.sock"),
        interval=0.05,
        publish=True,
    )
    with serving(config, settings):
        until(lambda: annotation(api) is not None)
    assert annotation(api) == holders.NodeHolders((), (), True)


def test_the_annotation_is_written_only_when_it_changes(
    api: ApiServer, kubeconfig: str, tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gpus = sim.make_machine(gpus=2).devices
    settings = holding.Settings(
        records_dir=str(tmp_path), pod_resources=str(tmp_path / "none.sock"), publish=True
    )
    node_agent = holding.Agent(
        settings, NODE, lambda: gpus, frozenset, labeler.core_api(kubeconfig)
    )
    node_agent.step(1000.0)
    assert (patches(api), held(api)) == (1, [])  # an empty list is news too: nobody holds any
    node_agent.step(1001.0)
    assert patches(api) == 1
    grant = records.started(
        "c1",
        DAEMON,
        [gpus[0].uuid],
        path=PLUGIN_LESS,
        whole_node=False,
        capabilities=["compute"],
        pid=sleeper.pid,
    )
    records.write(str(tmp_path), grant)
    node_agent.step(1002.0)
    assert (patches(api), held(api)) == (2, [("monitoring/agent-x7k2p", PLUGIN_LESS, 1, False)])
    restarted = holding.Agent(settings, NODE, lambda: gpus, frozenset, labeler.core_api(kubeconfig))
    restarted.step(1003.0)  # a new agent reads what the node carries before writing
    assert patches(api) == 2
    node = api.get("nodes", NODE)
    assert node is not None
    del node["metadata"]["annotations"][holders.ANNOTATION]
    api.put(node)  # someone removed it
    node_agent.step(1004.0)
    assert patches(api) == 2  # not looked at again before the resync period
    node_agent.step(1004.0 + holding.RESYNC)
    assert patches(api) == 3
    assert len(held(api)) == 1


def test_a_conflict_is_logged_when_it_starts_and_when_it_ends(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    gpus = sim.make_machine(gpus=2).devices
    settings = holding.Settings(records_dir=str(tmp_path), pod_resources="/nonexistent")
    node_agent = holding.Agent(settings, NODE, lambda: gpus, frozenset)
    for name in ("c1", "c2"):
        annotations = {**DAEMON, "io.kubernetes.cri.sandbox-name": name}
        two = records.started(
            name, annotations, [gpus[1].uuid], path=PLUGIN_LESS, whole_node=False,
            capabilities=["compute"], pid=sleeper.pid,
        )  # fmt: skip
        records.write(str(tmp_path), two)
    caplog.set_level("INFO", logger="deviceplugin.agent.holding")
    node_agent.step(1.0)
    node_agent.step(2.0)
    records.remove(str(tmp_path), "c2")
    node_agent.step(3.0)
    what = "GPU 1 held by monitoring/c1 and monitoring/c2, and not shared"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"conflict on node {NODE}: {what}"),
        ("INFO", f"conflict on node {NODE} is over: {what}"),
    ]


def test_a_gpu_held_whole_beside_a_container_on_its_mig_device_is_a_conflict(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    sim.write_node(tmp_path / "node", sim.with_mig(sim.make_machine(gpus=1), 0, ("balanced",)))
    found = SimDiscovery(tmp_path / "node").discover()
    (gpu,), mig = found.devices, found.mig_devices
    settings = holding.Settings(records_dir=str(tmp_path / "records"), pod_resources="/nonexistent")
    for name, held in (("whole", gpu.uuid), ("slice", mig[0].uuid)):
        annotations = {**DAEMON, "io.kubernetes.cri.sandbox-name": name}
        records.write(str(tmp_path / "records"), records.started(
            name, annotations, [held], path=PLUGIN_LESS, whole_node=False,
            capabilities=["compute"], pid=sleeper.pid,
        ))  # fmt: skip
    caplog.set_level("WARNING", logger="deviceplugin.agent.holding")
    snapshot = holding.Agent(settings, NODE, lambda: (gpu,), frozenset, mig=lambda: mig).step(1.0)
    assert [(c.kind, c.gpus) for c in snapshot.conflicts] == [
        (holders.GPU_AND_MIG, (gpu.uuid, mig[0].uuid))
    ]
    assert [r.getMessage() for r in caplog.records] == [
        f"conflict on node {NODE}: GPU 0 held whole by monitoring/whole while "
        f"MIG {mig[0].profile} of GPU 0 is held by monitoring/slice"
    ]


def test_an_old_kubelet_without_allocatable_resources_still_shows_the_plugin(
    tmp_path: Path, socket_dir: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gpus = sim.make_machine(gpus=2).devices
    path = socket_dir / "kubelet.sock"
    with PodResourcesKubelet(path, allocatable=False) as pod_resources:
        pod_resources.add_pod("team-a", "trainer", "u1", ["main"])
        pod_resources.assign("u1", "main", RESOURCE, [gpus[1].uuid])
        assignments, allocatable, claimed = podresources.read(str(path))
        assert claimed == []
        assert allocatable == []
        assert [(a.pod, a.device_ids) for a in assignments] == [("trainer", (gpus[1].uuid,))]
        everything = records.started(
            "c1", DAEMON, [g.uuid for g in gpus], path=PLUGIN_LESS, whole_node=True,
            capabilities=["compute"], pid=sleeper.pid,
        )  # fmt: skip
        records.write(str(tmp_path), everything)
        settings = holding.Settings(records_dir=str(tmp_path), pod_resources=str(path))
        node = holding.observe(settings, gpus, time.time())
    assert node.plugin is True
    assert sorted(c.kind for c in holders.conflicts(node)) == ["all-beside-plugin", "shared-gpu"]
    assert pod_resources.calls == ["List", "GetAllocatableResources"] * 2


def test_a_kubelet_that_does_not_answer_is_named(socket_dir: Path) -> None:
    path = socket_dir / "kubelet.sock"
    path.touch()  # a stale file where the socket was
    with pytest.raises(podresources.PodResourcesError, match=f"pod-resources API at {path}"):
        podresources.read(str(path), timeout=1)


def label_argv(root: Path, kubeconfig: str, tmp_path: Path, pod_resources: str) -> list[str]:
    """`gpuwire node label --holders` once, on the simulated node."""
    argv = ["--sim", str(root), "--node", NODE, "--kubeconfig", kubeconfig, "--holders"]
    return [*argv, "--records-dir", str(tmp_path / "records"), "--pod-resources-socket",
            pod_resources]  # fmt: skip


def test_node_label_publishes_holders_once(
    api: ApiServer,
    kubeconfig: str,
    sim_node: tuple[Path, sim.Machine],
    tmp_path: Path,
    sleeper: subprocess.Popen[bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, machine = sim_node
    grant = records.started(
        "c1", DAEMON, [machine.devices[0].uuid], path=PLUGIN_LESS, whole_node=False,
        capabilities=["compute"], pid=sleeper.pid,
    )  # fmt: skip
    records.write(str(tmp_path / "records"), grant)
    assert cli.label(label_argv(root, kubeconfig, tmp_path, "/nonexistent")) == 0
    assert f"node {NODE}: gpuwire.io/holders: 1 container(s) hold GPUs" in capsys.readouterr().out
    assert held(api) == [("monitoring/agent-x7k2p", PLUGIN_LESS, 1, False)]


def test_node_label_once_names_the_gpus_of_dra_claims(
    api: ApiServer,
    kubeconfig: str,
    sim_node: tuple[Path, sim.Machine],
    tmp_path: Path,
    socket_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """pod-resources lists a claim's device by its DRA name (`gpu-<minor>`); the one-shot
    labeler's holders name the GPU it is, as the long-running agent's do."""
    root, machine = sim_node
    gpu = machine.devices[1]
    claim = {
        "metadata": {"name": "trainer-gpu", "namespace": "team-a"},
        "status": {"allocation": {"devices": {"results": [
            {"driver": DRIVER, "pool": NODE, "device": f"gpu-{gpu.minor}", "request": "gpu"},
        ]}}},
    }  # fmt: skip
    path = socket_dir / "kubelet.sock"
    with PodResourcesKubelet(path) as pod_resources:
        pod_resources.add_pod("team-a", "trainer", "u1", ["main"])
        pod_resources.claim("u1", "main", claim, {})
        assert cli.label(label_argv(root, kubeconfig, tmp_path, str(path))) == 0
    assert f"node {NODE}: gpuwire.io/holders: 1 container(s) hold GPUs" in capsys.readouterr().out
    node = annotation(api)
    assert node is not None
    assert [(h.name, h.path, h.gpus, h.claims) for h in node.holders] == [
        ("team-a/trainer", DRA, (gpu.uuid,), ("team-a/trainer-gpu",))
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metrics-port", "9445"], "--metrics-port needs --watch"),
        (["--watch", "--metrics-port", "0"], "'0': expected a port number from 1 to 65535"),
        (["--watch", "--holders-interval", "-1"], "'-1': expected a number of seconds, 0 or more"),
    ],
)
def test_holder_flags_refuse_what_cannot_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.label(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
