"""A prepared claim's CDI ids reach a container through a real containerd's CRI plugin, on
each generation a node may run: the kubelet DRA stand-in prepares the claim with the DRA
plugin (its CDI spec in containerd's CDI spec dir, its ld-cache hook served by the resident
gpuwire), the CRI kubelet stand-in
(testbed/kuberuntime.py) sends the ids in `CDI_devices` (field 17), containerd applies
gpuwire's edits for exactly the claim's GPUs. 1.6 drops the field: no GPU. A container
without the claim sees none; unprepare leaves no spec, and the ids then name nothing.

Under the `gpuwire` runtime handler too (CDI and the shim both on): the claim's token is the
proof the shim's trust accepts for the container its claim binds, and refuses, failing the
start, in another pod or namespace; the shim's edits on top of the engine's add no device or
mount twice, and it makes the links and ld cache of the claim spec's hook itself (runc runs
no hook); the container has a record, a DRA holder of the claim.

`cdi.k8s.io/*` pod annotations: what containerd makes of one as a pod author wrote it, and
of the same pod as the webhook admits it (outside trusted namespaces: removed).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from deviceplugin.config import Config
from deviceplugin.dra import cdi, checkpoint
from deviceplugin.dra.plugin import DraPlugin
from gpuwire import claimtoken, grant, records
from gpuwire.dra import DRIVER
from runtime_hook.setup import launcher
from runtime_hook.start import spec as ocispec
from testbed import dracluster
from testbed.apiserver import ApiServer
from testbed.containerd import CRI_NAMESPACE, Containerd
from testbed.containerds import Generation
from testbed.image import NAME, write_layout_tar
from testbed.kubelet_dra import DraKubelet
from testbed.kuberuntime import CRIError, KubeRuntime, run_pod
from testbed.lab import Lab, served_launchers
from testbed.scheduler import Scheduler
from testbed.view import VIEW_SCRIPT, granted_view, shown, view
from testbed.waiting import until
from testbed.webhook import serving
from tests.conftest import requires_binary, requires_root
from tests.system.test_containerd import (
    HANDLER,
    HOOK,
    SHIM,
    configure,
    generation,
    lab,
    node_containerd,
)
from tests.webhook.support import client, eventually, make_files
from webhook.fleet import Fleet
from webhook.mutation import mutate
from webhook.policy import Policy
from webhook.review import decode_patch, request_for

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]
__all__ = ["generation", "lab"]  # the module's fixtures, shared with test_containerd

NODE = "gpu-node-1"
CONTROL = "nvidia-uvm nvidia-uvm-tools"  # a claim's default capabilities: compute, utility


@dataclass
class DraNode:
    containerd: Containerd
    api: ApiServer
    kubelet: DraKubelet
    plugin: DraPlugin

    @property
    def cdi_dir(self) -> Path:
        return Path(self.plugin.config.cdi_dir)


@contextlib.contextmanager
def dra_plugin(
    lab: Lab, cdi_dir: Path, vendor: str = "nvidia"
) -> Iterator[tuple[ApiServer, DraKubelet, DraPlugin]]:
    """The DRA plugin on the lab's node (of `vendor`'s GPUs), writing claims' specs into
    `cdi_dir` (a containerd's CDI spec dir), registered with the kubelet DRA stand-in. The
    claims' ld-cache hook is a launcher only the resident can serve (its Python fallback does
    not exist), so every GPU start shows the resident serving it."""
    with tempfile.TemporaryDirectory(prefix="gw-dra-") as sockets, \
            ApiServer(schema="1.34") as api, \
            DraKubelet(Path(sockets), NODE) as kubelet:  # fmt: skip
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        hook = str(served_launchers() / launcher.HOOK)
        config = Config(sim=str(lab.node), vendor=vendor, kubelet_root=sockets, hook=hook,
                        cdi_dir=str(cdi_dir),
                        node_name=NODE, allocation_dir=str(lab.allocations),
                        grant_key_dir=str(lab.root / "keys"))  # fmt: skip
        plugin = DraPlugin(config, api_client=api.client())
        stop = threading.Event()
        thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
        thread.start()
        try:
            kubelet.wait_registered(DRIVER)
            yield api, kubelet, plugin
        finally:
            stop.set()
            thread.join(timeout=20)


@pytest.fixture(scope="module")
def dra_node(generation: Generation, lab: Lab) -> Iterator[DraNode]:
    """A containerd with CDI on (from 1.7), and the DRA plugin writing claims' specs into its
    CDI spec dir."""
    cdi_flag = ["--cdi"] if generation.cdi else []
    with node_containerd(generation, lab, ["--runtime-path", SHIM, *cdi_flag]) as containerd, \
            dra_plugin(lab, containerd.home / "cdi") as (api, kubelet, plugin):  # fmt: skip
        yield DraNode(containerd, api, kubelet, plugin)


@pytest.fixture
def kubelet(dra_node: DraNode) -> Iterator[KubeRuntime]:
    with dra_node.containerd.kuberuntime() as runtime:
        yield runtime


def reserved_for(*pods: dict[str, Any]) -> list[dict[str, str]]:
    return [{"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in pods]  # fmt: skip


def reserve(api: ApiServer, ref: tuple[str, str, str], *pods: dict[str, Any]) -> None:
    """The claim reserved for these pods, as the scheduler reserves it for each pod it binds."""
    claim = api.get("resourceclaims", ref[1], ref[0])
    assert claim is not None
    claim["status"]["reservedFor"] = reserved_for(*pods)
    api.put(claim)


def put_claim(
    api: ApiServer,
    devices: list[str],
    owner: dict[str, Any] | None = None,
    reserved: tuple[dict[str, Any], ...] = (),
) -> tuple[str, str, str]:
    """A claim of team-a allocated `devices`, reserved for the pods `reserved` (and `owner`);
    with `owner`, generated for that pod."""
    name = f"claim-{uuid.uuid4().hex[:6]}"
    results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.gpuwire.io", "count": len(devices)}}]}}  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "controller": True,
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]  # fmt: skip
    stored = api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
        "spec": spec, "status": {"allocation": {"devices": {"results": results}},
                                 "reservedFor": reserved_for(*((owner,) if owner else reserved))},
    })  # fmt: skip
    return "team-a", name, stored["metadata"]["uid"]


def prepared(
    dra_node: DraNode,
    devices: list[str],
    owner: dict[str, Any] | None = None,
    reserved: tuple[dict[str, Any], ...] = (),
) -> tuple[tuple[str, str, str], list[str]]:
    """A claim of `devices` put and prepared: its reference and the CDI ids its request got."""
    ref = put_claim(dra_node.api, devices, owner, reserved)
    (answer,) = dra_node.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    return ref, dra_node.kubelet.cdi_ids(ref[2], "gpus")


def release(dra_node: DraNode, *refs: tuple[str, str, str]) -> None:
    """The claims unprepared and deleted: their GPUs free for the next test's scheduler."""
    assert dra_node.kubelet.unprepare(DRIVER, list(refs)) == {r[2]: "" for r in refs}
    for namespace, name, _ in refs:
        dra_node.api.delete("resourceclaims", name, namespace)


def pod(
    annotations: dict[str, str] | None = None, namespace: str = "team-a", script: str = VIEW_SCRIPT
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": namespace,
                            "uid": str(uuid.uuid4())}  # fmt: skip
    if annotations:
        meta["annotations"] = annotations
    container = {"name": "trainer", "image": "busybox", "command": ["sh", "-c", script]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container]}}  # fmt: skip


def _image(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["containers"][0]["image"] = NAME
    return obj


def run_view(
    kubelet: KubeRuntime, obj: dict[str, Any], ids: list[str] | None = None, handler: str = ""
) -> Any:
    _, (cid,) = run_pod(kubelet, _image(obj), handler, claims={"trainer": ids or []})
    status = kubelet.exited(cid)
    assert status.exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid))


def test_a_prepared_claim_gives_exactly_its_gpus_and_unprepare_leaves_nothing(
    generation: Generation, lab: Lab, dra_node: DraNode, kubelet: KubeRuntime
) -> None:
    ref, ids = prepared(dra_node, ["gpu-1", "gpu-3"])
    assert ids == [f"k8s.gpu.gpuwire.io/claim={ref[2]}-gpu-{i}" for i in (1, 3)]
    (hook,) = json.loads((dra_node.cdi_dir / cdi.spec_file(ref[2])).read_text())[
        "containerEdits"]["hooks"]  # fmt: skip
    assert hook["path"] == str(served_launchers() / launcher.CALL)  # no shell in front
    seen = run_view(kubelet, pod(), ids)
    if not generation.cdi:  # 1.6: no CDI, the field is dropped
        assert seen["devices"] == ["nvidia*"]
    else:
        expected = granted_view(lab.machine.devices, (1, 3), CONTROL)
        assert shown(seen, expected) == expected
        assert seen["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]  # the claim's GPUs
    assert run_view(kubelet, pod())["devices"] == ["nvidia*"]  # no claim: no GPU

    assert dra_node.kubelet.unprepare(DRIVER, [ref]) == {ref[2]: ""}
    assert not (dra_node.cdi_dir / cdi.spec_file(ref[2])).exists()
    assert checkpoint.load(dra_node.plugin.sockets.plugin_dir) == {}
    if generation.cdi:  # the ids name nothing any more: the start fails, naming them
        with pytest.raises(CRIError, match=f"claim={ref[2]}-gpu-1"):
            run_view(kubelet, pod(), ids)
    dra_node.api.delete("resourceclaims", ref[1], ref[0])  # its GPUs free for the next test


def test_cdi_annotations_written_by_a_pod_author_are_removed_by_the_webhook(
    dra_node: DraNode, kubelet: KubeRuntime
) -> None:
    """A pod author's `cdi.k8s.io/*` annotation naming every GPU: containerd (1.6, 1.7 and
    2.x alike) applies CDI annotations of the container config only, which the kubelet fills
    from device plugins, not the pod's (containerd issue #7329), so through CRI it gives no
    GPU; runtimes that read them from the OCI spec (a handler passing `cdi.k8s.io/*` pod
    annotations through, NVIDIA's runtime in CDI mode) would. The webhook removes them
    outside trusted namespaces: the pod it admits names no CDI device anywhere."""
    written = pod({"cdi.k8s.io/mine": "nvidia.com/gpu=all"})
    assert run_view(kubelet, written)["devices"] == ["nvidia*"]
    outcome = mutate(written, "team-a", Policy(), Fleet(), grant.KeyRing({}))
    assert outcome.allowed
    admitted = jsonpatch.apply_patch(written, list(outcome.patch))
    assert "cdi.k8s.io/mine" not in admitted["metadata"].get("annotations", {})
    admitted["metadata"] |= {"name": f"{written['metadata']['name']}-2", "uid": str(uuid.uuid4())}
    _, (cid,) = run_pod(kubelet, _image(admitted), "")
    kubelet.exited(cid)
    assert not any(k.startswith("cdi.k8s.io/") for k in kubelet.spec(cid).get("annotations", {}))


# What the container shows beside the GPU view: mount points it has twice, then it waits, so
# that its bundle (the config.json the shim wrote) is there to read.
HELD = (
    VIEW_SCRIPT
    + r"""
awk '{print $5}' /proc/self/mountinfo | sort | uniq -d | sed 's/^/twice: /'
echo "ready: yes"
sleep 600
"""
)


def records_of(lab: Lab, *pods: dict[str, Any]) -> list[records.ContainerRecord]:
    """The container records of these pods (the lab's records dir serves every generation)."""
    uids = {p["metadata"]["uid"] for p in pods}
    return [
        e.record for e in records.scan(str(lab.records)) if e.record and e.record.pod_uid in uids
    ]


def bundle_spec(dra_node: DraNode, cid: str) -> dict[str, Any]:
    """The config.json runc ran the container from: containerd's spec, then the shim's edits."""
    state = dra_node.containerd.home / "state/io.containerd.runtime.v2.task/k8s.io" / cid
    spec: dict[str, Any] = json.loads((state / "config.json").read_text())
    return spec


def test_under_gpuwires_runtime_a_claim_is_proof_recorded_and_injected_once(
    generation: Generation, lab: Lab, dra_node: DraNode, kubelet: KubeRuntime
) -> None:
    trainer = pod(script=HELD)
    ref, ids = prepared(dra_node, ["gpu-1", "gpu-3"], reserved=(trainer,))
    _, (cid,) = run_pod(kubelet, _image(trainer), HANDLER, claims={"trainer": ids})
    if not generation.cdi:  # 1.6 drops CDI devices: nothing to prove, nothing recorded
        other = pod()
        assert run_view(kubelet, other, ids, HANDLER)["devices"] == ["nvidia*"]
        assert records_of(lab, trainer, other) == []
        release(dra_node, ref)
        return
    until(lambda: "ready: yes" in kubelet.logs(cid))
    seen = view(kubelet.logs(cid))
    expected = granted_view(lab.machine.devices, (1, 3), CONTROL)
    assert shown(seen, expected) == expected
    assert seen["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]
    assert "twice" not in seen  # no mount point twice in the container
    spec = bundle_spec(dra_node, cid)
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert sorted(paths) == sorted(set(paths))
    rules = [json.dumps(r, sort_keys=True) for r in spec["linux"]["resources"]["devices"]]
    assert sorted(rules) == sorted(set(rules))
    assert len(spec["mounts"]) == len({(m["destination"], m["source"]) for m in spec["mounts"]})
    # the claim spec's ld-cache hook, which containerd put in, was made by the shim: runc ran none
    assert ocispec.ldcache_hooks(kubelet.spec(cid)) != []
    assert ocispec.ldcache_hooks(spec) == []
    [held] = records_of(lab, trainer)
    assert (held.path, held.pod, held.gpus) == (
        records.DRA, trainer["metadata"]["name"], tuple(sorted((lab.uuid(1), lab.uuid(3))))
    )  # fmt: skip
    assert held.claims == (f"team-a/{ref[1]}",)
    assert any(line.endswith("capabilities compute,utility: claim") for line in lab.log_lines())
    kubelet.stop(cid)
    kubelet.remove(cid)
    assert records_of(lab, trainer) == []  # deleted: its record goes

    # a shared claim serves the pods it is reserved for: replayed into another pod of its
    # namespace (its CDI ids given by other means), it fails the start
    others = [pod(), pod(namespace="team-b"), pod(), pod()]
    uid = others[0]["metadata"]["uid"]
    with pytest.raises(
        CRIError,
        match=f"claim team-a/{ref[1]} is reserved for pod "
        f"{trainer['metadata']['uid']}, not {others[3]['metadata']['uid']}",
    ):
        run_view(kubelet, others[3], ids, HANDLER)  # fmt: skip
    # the scheduler binds a second pod with it; the kubelet finds it prepared and calls no
    # plugin: the plugin, watching the claim, binds its token to that pod too
    reserve(dra_node.api, ref, trainer, others[0])
    until(lambda: uid in claimtoken.read(str(lab.allocations), ref[2], lab.keys).pods)
    assert run_view(kubelet, others[0], ids, HANDLER)["devices"] == expected["devices"]
    with pytest.raises(CRIError, match=f"claim team-a/{ref[1]} is in namespace team-a, not team-b"):
        run_view(kubelet, others[1], ids, HANDLER)
    # a claim generated for one pod serves that pod alone
    owner = pod()
    mine, own_ids = prepared(dra_node, ["gpu-0"], owner)
    assert run_view(kubelet, owner, own_ids, HANDLER)["devices"] != ["nvidia*"]
    with pytest.raises(CRIError, match=f"reserved for pod {owner['metadata']['uid']}, not "):
        run_view(kubelet, others[2], own_ids, HANDLER)
    assert records_of(lab, owner, *others) == []  # exited and deleted, refused: none left
    release(dra_node, ref, mine)


def test_under_the_prestart_hook_a_claim_is_proof_and_nothing_is_injected_again(
    generation: Generation, lab: Lab, dra_node: DraNode
) -> None:
    """The `gpuwire` handler as `configure --prestart-hook` makes it (runc, the hook in the
    base spec), CDI on: the hook accepts the claim, keeps the container's record and injects
    nothing over what the engine applied; in another namespace the claim fails the start."""
    first = pod(script=HELD.replace("sleep 600", ""))
    ref, ids = prepared(dra_node, ["gpu-2"], reserved=(first,))
    containerd = Containerd.create(cri=True, generation=generation)
    with containerd:
        base = containerd.home / "base-spec.json"
        on = ["--cdi"] if generation.cdi else []
        configure(containerd, "--prestart-hook", "--hook-path", HOOK, "--base-spec", str(base), *on)
        spec = json.loads(base.read_text())
        spec["hooks"]["prestart"][-1]["env"].append(f"GPUWIRE_CONFIG={lab.config}")
        base.write_text(json.dumps(spec))
        (containerd.home / "cdi").mkdir(exist_ok=True)
        shutil.copy(dra_node.cdi_dir / cdi.spec_file(ref[2]), containerd.home / "cdi")
        containerd.start()
        containerd.import_image(write_layout_tar(containerd.home / "busybox.tar"), CRI_NAMESPACE)
        with containerd.kuberuntime() as kubelet:
            seen = run_view(kubelet, first, ids, HANDLER)
            if not generation.cdi:  # 1.6 drops CDI devices
                assert seen["devices"] == ["nvidia*"]
                release(dra_node, ref)
                return
            expected = granted_view(lab.machine.devices, (2,), CONTROL)
            assert shown(seen, expected) == expected
            assert "twice" not in seen
            assert any(
                "gpuwire-hook" in line and line.endswith(": claim") for line in lab.log_lines()
            )
            with pytest.raises(CRIError, match="is in namespace team-a, not team-b"):
                run_view(kubelet, pod(namespace="team-b"), ids, HANDLER)
    release(dra_node, ref)


def test_annotations_to_the_containers_view_through_the_webhook_scheduler_kubelet_and_cri(
    generation: Generation, lab: Lab, dra_node: DraNode, kubelet: KubeRuntime, tmp_path: Path
) -> None:
    """The whole DRA path: the served webhook (policy `allocation: dra`) turns "2 linked
    A100s" into a claim template it creates in the API server; the resourceclaim controller
    and the scheduler stand-ins (testbed/scheduler.py) make and allocate the claim on the
    node's published devices, an NVLink pair; the kubelet DRA stand-in prepares it with the
    DRA plugin; containerd's CRI plugin applies its CDI spec: the container sees exactly that
    pair. A second such pod gets the other pair; a third waits with the scheduler's reason."""
    api = dra_node.api
    for c in dracluster.device_classes():
        api.put(c)
    api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    files = make_files(tmp_path)
    files.policy.write_text("allocation: dra\nnamespaces:\n  - match: ['*']\n")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    asks = {"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-count": "2"}
    seen_pairs = []
    with serving(files.args("--kubeconfig", str(kubeconfig), nodes=None)) as served, \
            client(served, files.tls.ca) as http:  # fmt: skip
        eventually(lambda: http.get("/readyz").status_code == 200, "the webhook to be ready")
        for attempt in range(3):
            raw = pod(asks)
            body = request_for(raw, "team-a", uid=str(uuid.uuid4()))
            reply = http.post("/mutate", json=body).json()
            assert reply["response"]["allowed"], reply
            admitted = jsonpatch.apply_patch(raw, decode_patch(reply))
            api.put(admitted)
            decision = Scheduler(api).schedule("team-a", admitted["metadata"]["name"])
            if attempt == 2:  # both pairs are taken
                assert not decision.scheduled
                assert decision.message == "0/1 nodes are available: 1 cannot allocate all claims."
                break
            assert decision.node == NODE
            stored = api.get("pods", admitted["metadata"]["name"], "team-a")
            assert stored is not None
            (status,) = stored["status"]["resourceClaimStatuses"]
            claim = api.get("resourceclaims", status["resourceClaimName"], "team-a")
            assert claim is not None
            ref = ("team-a", claim["metadata"]["name"], claim["metadata"]["uid"])
            (answer,) = dra_node.kubelet.prepare(DRIVER, [ref]).values()
            assert answer.error == ""
            allocated = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
            minors = tuple(int(d.removeprefix("gpu-")) for d in allocated)
            seen_pairs.append(minors)
            seen = run_view(kubelet, stored, dra_node.kubelet.cdi_ids(ref[2]))
            if generation.cdi:
                expected = granted_view(lab.machine.devices, minors, CONTROL)
                assert shown(seen, expected) == expected
            else:  # 1.6 drops CRI's CDI field: no GPU
                assert seen["devices"] == ["nvidia*"]
            assert dra_node.kubelet.unprepare(DRIVER, [ref]) == {ref[2]: ""}
    assert sorted(seen_pairs) == [(0, 1), (2, 3)]  # each an NVLink pair of the node
    assert len(api.objects("resourceclaimtemplates", "team-a")) == 1  # one request, one template
