"""The DRA plugin against the kubelet DRA stand-in over real unix sockets, and the API stand-in
serving resource.k8s.io/v1 (every write validated against the 1.34 schema): registration
through the plugin watcher, prepare and unprepare with their per-claim errors, kubelet and
plugin restarts, health as taints in the next slice update, slices made again after the
kubelet wipes them."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.agent.labels import GPUS_ANNOTATION
from deviceplugin.config import Config
from deviceplugin.dra import cdi, checkpoint, publisher
from deviceplugin.dra.plugin import DraPlugin
from deviceplugin.gpus import healthfile
from gpuwire import claimtoken, nodegpus, sim
from gpuwire.dra import DRIVER
from gpuwire.grant import KeyRing
from testbed.apiserver import ApiServer
from testbed.kubelet_dra import KUBELET_1_33, DraKubelet
from testbed.lab import write_keys
from testbed.waiting import until

NODE = "gpu-node-1"
HOOK = "/opt/gpuwire/current/libexec/gpuwire-hook"


@dataclass
class Cluster:
    api: ApiServer
    kubelet: DraKubelet
    config: Config
    machine: sim.Machine
    root: Path
    keys: KeyRing
    plugin: DraPlugin | None = None
    stop: threading.Event | None = None
    thread: threading.Thread | None = None

    def start_plugin(self, **changes: Any) -> DraPlugin:
        self.plugin = DraPlugin(replace(self.config, **changes), api_client=self.api.client())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.plugin.run, args=(self.stop,), daemon=True)
        self.thread.start()
        return self.plugin

    def stop_plugin(self) -> None:
        if self.stop is not None and self.thread is not None:
            self.stop.set()
            self.thread.join(timeout=20)
            assert not self.thread.is_alive()

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.objects("resourceslices") if s["spec"]["nodeName"] == NODE]

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices() for d in s["spec"]["devices"]}

    def tokens(self) -> list[str]:
        """The claim tokens on the node (`gpuwire.claimtoken`)."""
        directory = Path(claimtoken.directory(self.config.allocation_dir))
        return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def put_claim(
    api: ApiServer,
    name: str,
    devices: list[str],
    namespace: str = "default",
    pool: str = NODE,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
    owner: str | None = None,
    device_class: str = "gpu.gpuwire.io",
    reserved: tuple[str, ...] = (),
) -> tuple[str, str, str]:
    """A ResourceClaim allocated (as the scheduler writes it) to `devices` of this node,
    reserved for the pods of UIDs `reserved` (and `owner`); with `owner`, generated from a
    template for the pod of that UID."""
    uid = str(uuid.uuid4())
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": device_class, "count": len(devices)}}]}}  # fmt: skip
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": spec,
    }
    if owner:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                               "uid": owner, "controller": True}]  # fmt: skip
    if allocated:
        results = [{"request": "gpus", "driver": DRIVER, "pool": pool, "device": d}
                   for d in devices]  # fmt: skip
        allocation: dict[str, Any] = {"devices": {"results": results}}
        if config:
            allocation["devices"]["config"] = config
        pods = (owner,) if owner else reserved
        obj["status"] = {"allocation": allocation, "reservedFor": [reservation(p) for p in pods]}
    stored = api.put(obj)
    return namespace, name, stored["metadata"]["uid"]


def reservation(pod: str) -> dict[str, str]:
    return {"resource": "pods", "name": f"pod-{pod[:8]}", "uid": pod}


def reserve(api: ApiServer, ref: tuple[str, str, str], pods: tuple[str, ...]) -> None:
    """The claim's `status.reservedFor` becomes these pods, as the scheduler adds a pod (at
    PreBind) and the resourceclaim controller drops one that is done."""
    claim = api.get("resourceclaims", ref[1], ref[0])
    assert claim is not None
    claim["status"]["reservedFor"] = [reservation(p) for p in pods]
    api.put(claim)


@contextlib.contextmanager
def cluster_of(
    machine: sim.Machine, tmp_path: Path, socket_dir: Path, **config: Any
) -> Iterator[Cluster]:
    """`machine` as a simulated node, the API stand-in with its Node, the kubelet DRA
    stand-in, and the plugin's config (started by the test)."""
    root = tmp_path / "node"
    sim.write_node(root, machine)
    keys = write_keys(tmp_path / "keys")
    settings = Config(
        sim=str(root),
        kubelet_root=str(socket_dir / "kubelet"),
        cdi_dir=str(tmp_path / "cdi"),
        allocation_dir=str(tmp_path / "allocations"),
        grant_key_dir=str(tmp_path / "keys"),
        hook=HOOK,
        node_name=NODE,
        recover_after=0.5,
        **config,
    )
    with ApiServer(schema="1.34") as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        with DraKubelet(socket_dir / "kubelet", NODE, api=api.client(), wipe_delay=0.5) as kubelet:
            c = Cluster(api, kubelet, settings, machine, root, keys)
            try:
                yield c
            finally:
                c.stop_plugin()


@pytest.fixture(name="c")
def cluster(tmp_path: Path, socket_dir: Path) -> Iterator[Cluster]:
    machine = sim.make_machine(gpus=4)
    with cluster_of(machine, tmp_path, socket_dir, shared_gpus=(machine.devices[3].uuid,)) as c:
        yield c


def cdi_files(c: Cluster) -> list[str]:
    directory = Path(c.config.cdi_dir)
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_registers_through_the_plugin_watcher_and_publishes_every_gpu(c: Cluster) -> None:
    c.start_plugin()
    plugin = c.kubelet.wait_registered(DRIVER)
    assert plugin.version == "v1"
    assert plugin.endpoint == f"{c.config.kubelet_root}/plugins/{DRIVER}/dra.sock"
    assert list(c.kubelet.infos[-1].supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
    ]  # fmt: skip
    until(lambda: len(c.devices()) == 4)
    (obj,) = c.slices()
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert c.devices()["gpu-3"]["allowMultipleAllocations"] is True
    until(lambda: set(c.kubelet.device_health(DRIVER).values()) == {"Healthy"})
    assert len(c.kubelet.device_health(DRIVER)) == 4


def test_a_node_with_hami_core_publishes_its_shared_gpus_as_held_by_it(c: Cluster) -> None:
    """hami.library named and there: the shared GPU says hamiLimits (a claim can select it),
    and the preload list its claims' containers mount is in the plugin's directory."""
    c.start_plugin(hami_library=str(c.root / sim.HAMI_LIBRARY))
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    assert c.devices()["gpu-3"]["attributes"]["hamiLimits"] == {"bool": True}
    assert c.devices()["gpu-3"]["attributes"]["mpsLimits"] == {"bool": False}
    preload = Path(c.config.kubelet_root, "plugins", DRIVER, "ld.so.preload")
    assert preload.read_text() == "/usr/local/vgpu/libvgpu.so\n"


def test_without_hami_core_no_shared_gpu_claims_a_holder(c: Cluster) -> None:
    c.start_plugin(hami_library=str(c.root / "no/libvgpu.so"))  # named, not there
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    assert c.devices()["gpu-3"]["attributes"]["hamiLimits"] == {"bool": False}


def test_prepare_writes_the_claims_cdi_spec_and_unprepare_removes_it(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "trainer", ["gpu-1", "gpu-2"])
    uid = ref[2]
    (answer,) = c.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    ids = [(d.device_name, list(d.cdi_device_ids)) for d in answer.devices]
    assert ids == [("gpu-1", [f"k8s.gpu.gpuwire.io/claim={uid}-gpu-1"]),
                   ("gpu-2", [f"k8s.gpu.gpuwire.io/claim={uid}-gpu-2"])]  # fmt: skip
    assert [list(d.request_names) for d in answer.devices] == [["gpus"], ["gpus"]]
    spec = json.loads((Path(c.config.cdi_dir) / cdi.spec_file(uid)).read_text())
    assert spec["kind"] == "k8s.gpu.gpuwire.io/claim"
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
             for d in spec["devices"]}  # fmt: skip
    assert nodes == {f"{uid}-gpu-1": ["/dev/nvidia1"], f"{uid}-gpu-2": ["/dev/nvidia2"]}
    common = spec["containerEdits"]
    assert {n["path"] for n in common["deviceNodes"]} == {
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"
    }  # fmt: skip
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in common["env"]
    assert [h["hookName"] for h in common["hooks"]] == ["createRuntime"]
    assert common["hooks"][0]["path"] == HOOK
    assert all(m["hostPath"].startswith(str(c.root)) for m in common["mounts"])
    gpus = [c.machine.devices[i].uuid for i in (1, 2)]
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(gpus)}" in common["env"]
    # the claim's token, once per device, each in that device's own edits
    token = claimtoken.path(c.config.allocation_dir, uid)
    proofs = {
        d["name"]: [(m["hostPath"], m["containerPath"], m["options"])
                    for m in d["containerEdits"]["mounts"]]
        for d in spec["devices"]
    }  # fmt: skip
    assert proofs == {
        f"{uid}-{name}": [(token, f"/run/gpuwire/allocations/claims/{uid}/{name}",
                           ["ro", "nosuid", "nodev", "bind"])]
        for name in ("gpu-1", "gpu-2")
    }  # fmt: skip
    proved = claimtoken.read(c.config.allocation_dir, uid, c.keys)
    assert (proved.namespace, proved.name, proved.pods) == ("default", "trainer", ())
    assert [(d.name, d.uuid, d.share) for d in proved.devices] == [
        ("gpu-1", gpus[0], False), ("gpu-2", gpus[1], False)
    ]  # fmt: skip
    prepared = checkpoint.load(Path(c.config.kubelet_root) / "plugins" / DRIVER)
    assert set(prepared) == {uid}
    assert token in prepared[uid].files

    assert c.kubelet.unprepare(DRIVER, [ref]) == {uid: ""}
    assert cdi_files(c) == []
    assert c.tokens() == []
    assert checkpoint.load(Path(c.config.kubelet_root) / "plugins" / DRIVER) == {}
    assert c.kubelet.unprepare(DRIVER, [ref]) == {uid: ""}  # unpreparing again: still fine


def test_prepare_and_unprepare_are_idempotent(c: Cluster) -> None:
    plugin = c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "once", ["gpu-0"])
    first = plugin.preparer.prepare([_ref(ref)])
    reads = len([r for r in c.api.requests if r.path.endswith("/resourceclaims/once")])
    again = plugin.preparer.prepare([_ref(ref)])
    assert again == first
    assert len([r for r in c.api.requests if r.path.endswith("/resourceclaims/once")]) == reads
    assert len(cdi_files(c)) == 1


def _ref(ref: tuple[str, str, str]) -> Any:
    from deviceplugin.dra.claims import ClaimRef

    return ClaimRef(*ref)


def test_each_claim_fails_alone_naming_what_is_wrong(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    good = put_claim(c.api, "good", ["gpu-0"])
    unallocated = put_claim(c.api, "pending", ["gpu-1"], allocated=False)
    elsewhere = put_claim(c.api, "elsewhere", ["gpu-1"], pool="gpu-node-2")
    unknown = put_claim(c.api, "unknown", ["gpu-9"])
    bad_config = put_claim(c.api, "bad-config", ["gpu-2"], config=[{
        "source": "FromClaim", "requests": [],
        "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "gpu.gpuwire.io/v1alpha1", "kind": "GpuConfig",
            "driverCapabilities": "compute,cuda"}}}])  # fmt: skip
    missing = ("default", "gone", str(uuid.uuid4()))
    recreated = (good[0], good[1], str(uuid.uuid4()))
    claims = [good, unallocated, elsewhere, unknown, bad_config, missing]
    answers = c.kubelet.prepare(DRIVER, claims)
    errors = {name: answers[uid].error for _, name, uid in claims}
    assert errors["good"] == ""
    assert errors["pending"] == "claim default/pending is not allocated"
    assert "in pool gpu-node-2, not this node's (gpu-node-1)" in errors["elsewhere"]
    assert "no device 'gpu-9' (it has gpu-0, gpu-1, gpu-2, gpu-3)" in errors["unknown"]
    assert "driverCapabilities 'compute,cuda'" in errors["bad-config"]
    assert "unknown driver capability cuda" in errors["bad-config"]
    assert errors["gone"] == "claim default/gone does not exist"
    (mismatch,) = c.kubelet.prepare(DRIVER, [recreated]).values()
    assert "the kubelet asked for" in mismatch.error
    assert cdi_files(c) == [cdi.spec_file(good[2])]  # nothing of the failed claims stays
    assert c.tokens() == [good[2]]


def test_a_claim_generated_for_a_pod_is_bound_to_it_and_a_shared_one_to_its_pods(
    c: Cluster,
) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    pod, first, second = (str(uuid.uuid4()) for _ in range(3))
    own = put_claim(c.api, "p-gpu", ["gpu-0"], namespace="team-a", owner=pod)
    shared = put_claim(c.api, "team-gpus", ["gpu-3"], namespace="team-a", reserved=(first,))
    assert {a.error for a in c.kubelet.prepare(DRIVER, [own, shared]).values()} == {""}
    mine = claimtoken.read(c.config.allocation_dir, own[2], c.keys)
    assert (mine.pods, mine.refusal("team-a", pod)) == ((pod,), None)
    assert mine.refusal("team-a", first) == (
        f"claim team-a/p-gpu is reserved for pod {pod}, not {first}"
    )
    theirs = claimtoken.read(c.config.allocation_dir, shared[2], c.keys)
    assert (theirs.pods, theirs.refusal("team-a", first)) == ((first,), None)
    assert theirs.refusal("team-a", second) == (
        f"claim team-a/team-gpus is reserved for pod {first}, not {second}"
    )
    assert theirs.refusal("team-b", first) == (
        "claim team-a/team-gpus is in namespace team-a, not team-b"
    )
    # what the watch may show: a claim generated for a pod stays its pod's, and a namesake
    # (the claim deleted and made again) binds nothing of this one
    assert c.plugin is not None
    for ref, uid in ((own, own[2]), (shared, str(uuid.uuid4()))):
        seen = {"metadata": {"uid": uid}, "status": {"reservedFor": [reservation(second)]}}
        c.plugin.preparer.rebind(ref[2], seen)
    assert claimtoken.read(c.config.allocation_dir, own[2], c.keys).pods == (pod,)
    assert claimtoken.read(c.config.allocation_dir, shared[2], c.keys).pods == (first,)


def test_a_shared_claims_token_follows_the_pods_it_is_reserved_for(c: Cluster) -> None:
    """The kubelet prepares a claim once per node: for the second pod it calls no plugin, so
    the plugin follows the claim's reservedFor itself, across its own restart too."""
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    first, second, third = (str(uuid.uuid4()) for _ in range(3))
    shared = put_claim(c.api, "team-gpus", ["gpu-3"], namespace="team-a", reserved=(first,))
    assert c.kubelet.prepare(DRIVER, [shared])[shared[2]].error == ""

    def pods() -> tuple[str, ...]:
        return claimtoken.read(c.config.allocation_dir, shared[2], c.keys).pods

    assert pods() == (first,)
    reserve(c.api, shared, (first, second))  # the scheduler, binding the second pod
    assert c.kubelet.prepare(DRIVER, [shared])[shared[2]].error == ""  # sends nothing
    until(lambda: pods() == tuple(sorted((first, second))))
    reserve(c.api, shared, (second,))  # the first pod is done
    until(lambda: pods() == (second,))
    c.stop_plugin()
    reserve(c.api, shared, (second, third))  # while the plugin is away
    c.start_plugin()
    until(lambda: pods() == tuple(sorted((second, third))))
    c.kubelet.wait_registered(DRIVER)
    assert c.kubelet.unprepare(DRIVER, [shared]) == {shared[2]: ""}
    assert c.tokens() == []
    reserve(c.api, shared, (third,))  # an unprepared claim is followed no more
    time.sleep(0.5)
    assert c.tokens() == []


def test_a_prepare_that_fails_after_its_token_leaves_neither(c: Cluster) -> None:
    """The spec cannot be written (its directory is a file): the token written before it is
    removed, and the claim fails alone; without a grant key nothing is written at all."""
    Path(c.config.cdi_dir).write_text("in the way")
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    (answer,) = c.kubelet.prepare(DRIVER, [put_claim(c.api, "blocked", ["gpu-0"])]).values()
    assert "claim default/blocked: " in answer.error
    assert c.tokens() == []
    c.stop_plugin()
    Path(c.config.cdi_dir).unlink()
    for key in Path(c.config.grant_key_dir).iterdir():
        key.unlink()
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    (answer,) = c.kubelet.prepare(DRIVER, [put_claim(c.api, "unsigned", ["gpu-0"])]).values()
    assert f"no grant key in {c.config.grant_key_dir} to sign its token with" in answer.error
    assert (cdi_files(c), c.tokens()) == ([], [])


def test_an_unhealthy_gpu_fails_a_claim_that_does_not_tolerate_its_taint(c: Cluster) -> None:
    c.start_plugin(recover_after=60.0)
    c.kubelet.wait_registered(DRIVER)
    sim.inject_fault(c.root, c.machine.devices[1].uuid, 79)
    until(lambda: "taints" in c.devices().get("gpu-1", {}))
    (answer,) = c.kubelet.prepare(DRIVER, [put_claim(c.api, "on-bad", ["gpu-1"])]).values()
    assert f"gpu-1 ({c.machine.devices[1].uuid}) is unhealthy" in answer.error
    assert "gpu.gpuwire.io/xid=79:NoExecute, not tolerated" in answer.error


def test_a_1_33_kubelet_speaks_v1beta1(c: Cluster) -> None:
    c.kubelet.versions = KUBELET_1_33
    c.start_plugin()
    plugin = c.kubelet.wait_registered(DRIVER)
    assert plugin.version == "v1beta1"
    assert plugin.health_version is None
    ref = put_claim(c.api, "old", ["gpu-0"])
    (answer,) = c.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    assert list(answer.devices[0].cdi_device_ids) == [f"k8s.gpu.gpuwire.io/claim={ref[2]}-gpu-0"]


def test_kubelet_restart_registers_the_plugin_again(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "kept", ["gpu-0"])
    c.kubelet.prepare(DRIVER, [ref])
    before = len(c.kubelet.infos)
    c.kubelet.restart()
    c.kubelet.wait_registered(DRIVER)
    assert len(c.kubelet.infos) == before + 1
    assert ref[2] in c.kubelet.prepared  # in the kubelet's own state, prepared again on use
    (again,) = c.kubelet.prepare(DRIVER, [ref]).values()  # idempotent: the same answer
    assert (again.error, list(again.devices[0].cdi_device_ids)) == (
        "", [f"k8s.gpu.gpuwire.io/claim={ref[2]}-gpu-0"]
    )  # fmt: skip
    until(lambda: len(c.devices()) == 4)  # the kubelet wiped the node's slices at start
    assert c.kubelet.unprepare(DRIVER, [ref]) == {ref[2]: ""}
    assert cdi_files(c) == []


def test_plugin_restart_keeps_prepared_claims_and_unprepares_deleted_ones(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "survivor", ["gpu-2"])
    (first,) = c.kubelet.prepare(DRIVER, [ref]).values()
    c.stop_plugin()
    assert not (Path(c.config.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
    c.api.delete("resourceclaims", "survivor", "default")  # gone from the API meanwhile
    plugin = c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    assert plugin.preparer.prepare([_ref(ref)])[ref[2]] == plugin.preparer.prepared[ref[2]]
    assert [d.cdi_ids for d in plugin.preparer.prepared[ref[2]].devices] == [
        tuple(first.devices[0].cdi_device_ids)
    ]
    assert c.kubelet.unprepare(DRIVER, [ref]) == {ref[2]: ""}
    assert cdi_files(c) == []


def test_orphaned_specs_and_tokens_are_removed_at_start(c: Cluster) -> None:
    """A plugin that died between writing a claim's files and its checkpoint."""
    Path(c.config.cdi_dir).mkdir(parents=True)
    stray = Path(c.config.cdi_dir) / cdi.spec_file(str(uuid.uuid4()))
    stray.write_text("{}")
    other = Path(c.config.cdi_dir) / "nvidia.yaml"
    other.write_text("kind: nvidia.com/gpu\n")
    token = Path(claimtoken.path(c.config.allocation_dir, str(uuid.uuid4())))
    token.parent.mkdir(parents=True)
    token.write_text("{}")
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    assert cdi_files(c) == ["nvidia.yaml"]
    assert c.tokens() == []


def test_a_fault_taints_the_gpu_in_the_next_slice_update_and_recovery_clears_it(
    c: Cluster,
) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    generation = c.slices()[0]["spec"]["pool"]["generation"]
    sim.inject_fault(c.root, c.machine.devices[2].uuid, 74)
    until(lambda: "taints" in c.devices()["gpu-2"])
    (taint,) = c.devices()["gpu-2"]["taints"]
    assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.gpuwire.io/xid", "74",
                                                                "NoSchedule")  # fmt: skip
    assert taint["timeAdded"]
    assert c.slices()[0]["spec"]["pool"]["generation"] == generation + 1
    until(lambda: c.kubelet.device_health(DRIVER).get("gpu-2") == "Unhealthy")
    until(lambda: "taints" not in c.devices()["gpu-2"])  # quiet for recover_after (0.5 s)
    until(lambda: c.kubelet.device_health(DRIVER).get("gpu-2") == "Healthy")
    assert c.slices()[0]["spec"]["pool"]["generation"] == generation + 2


def test_a_fault_wakes_the_publisher_itself(c: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher's own looks (its tick, its watch of the slices) are out of this test:
    the health change alone must bring the taint (left to the tick, a fault waited 0.2 s for
    it, and one whose quiet period ended first was never published)."""
    monkeypatch.setattr(publisher, "TICK", 3600.0)
    monkeypatch.setattr(publisher.Publisher, "_watch", lambda self, stop: None)
    c.start_plugin(recover_after=600.0)
    until(lambda: len(c.devices()) == 4)
    sim.inject_fault(c.root, c.machine.devices[2].uuid, 79)
    until(lambda: "taints" in c.devices()["gpu-2"])


def test_a_fault_survives_a_plugin_restart_until_its_quiet_period_is_over(c: Cluster) -> None:
    """NVML, like the simulated node, reports only events after the plugin starts: without
    the health state on disk, the restarted plugin would publish gpu-2 untainted."""
    c.start_plugin(recover_after=4.0)
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    faulted = time.monotonic()
    sim.inject_fault(c.root, c.machine.devices[2].uuid, 79)
    until(lambda: "taints" in c.devices()["gpu-2"])
    c.stop_plugin()
    for obj in c.slices():  # as the kubelet wipes a gone driver's slices
        c.api.delete("resourceslices", obj["metadata"]["name"])
    c.start_plugin(recover_after=4.0)
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    (taint,) = c.devices()["gpu-2"]["taints"]  # the first slices the new plugin wrote
    assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.gpuwire.io/xid", "79",
                                                                "NoExecute")  # fmt: skip
    until(lambda: c.kubelet.device_health(DRIVER).get("gpu-2") == "Unhealthy")
    until(lambda: "taints" not in c.devices()["gpu-2"], timeout=15)
    assert time.monotonic() - faulted >= 3.9  # the quiet period ran on across the restart
    c.stop_plugin()
    c.start_plugin(recover_after=4.0)  # recovered: it stays healthy after another restart
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    assert all("taints" not in d for d in c.devices().values())


def test_a_torn_health_state_is_rebuilt_from_the_taints_the_slices_carry(c: Cluster) -> None:
    """A health file cut short (a crash of a disk that lied about its writes, a hand edit)
    is not believed, nor is every GPU taken for healthy: what the API server was told (the
    slices' taints, the Node's gpuwire.io/gpus) comes back in the first slices, and the bad
    file is kept aside."""
    c.start_plugin(recover_after=600.0, labels=True)
    c.kubelet.wait_registered(DRIVER)
    sim.inject_fault(c.root, c.machine.devices[2].uuid, 79)
    until(lambda: "taints" in c.devices().get("gpu-2", {}))
    until(lambda: unhealthy_on_node(c) == [c.machine.devices[2].uuid])
    c.stop_plugin()  # the kubelet wipes its slices: the Node's gpuwire.io/gpus still says it
    plugin_dir = Path(c.config.kubelet_root) / "plugins" / DRIVER
    whole = (plugin_dir / healthfile.NAME).read_text()
    (plugin_dir / healthfile.NAME).write_text(whole[: len(whole) // 2])
    c.start_plugin(recover_after=600.0, labels=True)
    assert c.plugin is not None
    assert c.plugin.health.unhealthy() == {c.machine.devices[2].uuid}
    until(lambda: "taints" in c.devices().get("gpu-2", {}))
    assert [p.name.split(".bad-")[0] for p in plugin_dir.glob("*.bad-*")] == [healthfile.NAME]
    assert healthfile.load(plugin_dir, 0.0, 0.0).keys() == {c.machine.devices[2].uuid}


def unhealthy_on_node(c: Cluster) -> list[str]:
    """The GPUs the Node's gpuwire.io/gpus says are unhealthy."""
    node = c.api.get("nodes", NODE) or {}
    text = (node["metadata"].get("annotations") or {}).get(GPUS_ANNOTATION)
    return [g.uuid for g in nodegpus.decode(text) if not g.healthy] if text else []


def test_a_torn_checkpoint_is_rebuilt_from_the_claims_allocated_here(c: Cluster) -> None:
    """A checkpoint that is not what was written: the claims the API server says are
    allocated on this node and reserved are prepared again (the kubelet holds them prepared
    and hands their CDI ids to new containers); the one no longer reserved, and its files, go."""
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    used = put_claim(c.api, "used", ["gpu-0"], reserved=("pod-a",))
    done = put_claim(c.api, "done", ["gpu-1"], reserved=("pod-b",))
    c.kubelet.prepare(DRIVER, [used, done])
    reserve(c.api, done, ())  # its pod is gone; the kubelet's unprepare is still to come
    c.stop_plugin()
    plugin_dir = Path(c.config.kubelet_root) / "plugins" / DRIVER
    text = (plugin_dir / checkpoint.NAME).read_text()
    (plugin_dir / checkpoint.NAME).write_text(text.replace('"gpu-0"', '"gpu-3"'))  # a bit flip
    os.unlink(Path(c.config.cdi_dir) / cdi.spec_file(used[2]))  # and a reboot's empty /var/run/cdi
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    prepared = checkpoint.load(plugin_dir)
    assert [d.device for d in prepared[used[2]].devices] == ["gpu-0"]
    assert set(prepared) == {used[2]}
    assert cdi_files(c) == [cdi.spec_file(used[2])]
    assert c.tokens() == [used[2]]
    assert [p.name.split(".bad-")[0] for p in plugin_dir.glob("*.bad-*")] == [checkpoint.NAME]
    assert c.kubelet.unprepare(DRIVER, [used, done]) == {used[2]: "", done[2]: ""}
    assert (cdi_files(c), c.tokens()) == ([], [])


def test_a_prepared_claim_whose_files_are_gone_gets_them_again(c: Cluster) -> None:
    """After a reboot the CDI spec directory (a tmpfs) is empty while the checkpoint and the
    kubelet's state are not: the kubelet's next prepare is answered with the files back."""
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "trainer", ["gpu-1"], reserved=("pod-a",))
    c.kubelet.prepare(DRIVER, [ref])
    spec = Path(c.config.cdi_dir) / cdi.spec_file(ref[2])
    written = spec.read_text()
    spec.unlink()
    c.kubelet.restart()  # it prepares the claims of its state again
    c.kubelet.wait_registered(DRIVER)
    (answer,) = c.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    assert spec.read_text() == written


def test_without_device_taints_an_unhealthy_gpu_leaves_the_slice(
    tmp_path: Path, socket_dir: Path
) -> None:
    root = tmp_path / "node"
    machine = sim.make_machine(gpus=2)
    sim.write_node(root, machine)
    config = Config(sim=str(root), kubelet_root=str(socket_dir / "k"), cdi_dir=str(tmp_path / "c"),
                    hook=HOOK, node_name=NODE, recover_after=0.5)  # fmt: skip
    with ApiServer(schema="1.34", device_taints=False) as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        c = Cluster(api, DraKubelet(socket_dir / "k", NODE), config, machine, root, KeyRing({}))
        c.start_plugin()
        try:
            until(lambda: len(c.devices()) == 2)
            sim.inject_fault(root, machine.devices[0].uuid, 48)
            until(lambda: set(c.devices()) == {"gpu-1"})
            until(lambda: set(c.devices()) == {"gpu-0", "gpu-1"})  # recovered
            assert c.plugin is not None
            assert c.plugin.publisher.taints_dropped
        finally:
            c.stop_plugin()


def test_slices_the_kubelet_wipes_are_published_again(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    until(lambda: len(c.devices()) == 4)
    for s in c.slices():
        c.api.delete("resourceslices", s["metadata"]["name"])
    until(lambda: len(c.devices()) == 4)


def test_removed_sockets_are_served_and_registered_again(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    registered = len(c.kubelet.infos)
    (Path(c.config.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock").unlink()
    until(lambda: len(c.kubelet.infos) > registered)
    c.kubelet.wait_registered(DRIVER)
    ref = put_claim(c.api, "after", ["gpu-0"])
    (answer,) = c.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""


def test_a_claims_files_reach_the_disk_whole_before_the_checkpoint_names_them(
    c: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file's data is fsync'd before its rename (whole or absent after a crash, never
    empty); of a new claim's directories only the checkpoint's is synced (a spec or token
    whose rename a crash lost is missing, and written again as above), and the directory of
    a file replaced is synced before the checkpoint names it (else a crash left the old)."""
    plugin = c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    calls: list[str] = []
    sync, rename, me = os.fsync, os.replace, threading.get_ident()

    def fsync(fd: int) -> None:
        if threading.get_ident() == me:  # not the plugin's own threads (health, node state)
            calls.append("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        sync(fd)

    def replace(src: str, dst: str) -> None:
        if threading.get_ident() == me:
            calls.append(f"rename {dst}")
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ref = put_claim(c.api, "trainer", ["gpu-1"])
    uid = ref[2]
    token = claimtoken.path(c.config.allocation_dir, uid)
    spec = os.path.join(c.config.cdi_dir, cdi.spec_file(uid))
    saved = str(checkpoint.path(plugin.preparer.directory))

    def written(path: str) -> list[str]:
        directory, name = os.path.split(path)
        return [f"fsync {directory}/.{name}.{os.getpid()}.{me}.tmp", f"rename {path}"]

    plugin.preparer.prepare([_ref(ref)])
    assert calls == [*written(token), *written(spec), *written(saved),
                     f"fsync {plugin.preparer.directory}"]  # fmt: skip
    calls.clear()
    os.unlink(spec)  # its files gone: the token is replaced, the spec new
    plugin.preparer.prepare([_ref(ref)])
    assert calls == [*written(token), f"fsync {os.path.dirname(token)}", *written(spec),
                     *written(saved), f"fsync {plugin.preparer.directory}"]  # fmt: skip
