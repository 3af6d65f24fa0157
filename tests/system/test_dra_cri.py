"""A prepared claim's CDI ids reach a container through a real containerd's CRI plugin, on
each generation a node may run: the kubelet DRA stand-in prepares the claim with the DRA
plugin (its CDI spec in containerd's CDI spec dir, its ld-cache hook served by the resident
gpuwire), the CRI kubelet stand-in
(testbed/kuberuntime.py) sends the ids in `CDI_devices` (field 17), containerd applies
gpuwire's edits for exactly the claim's GPUs. 1.6 drops the field: no GPU. A container
without the claim sees none; unprepare leaves no spec, and the ids then name nothing.

`cdi.k8s.io/*` pod annotations: what containerd makes of one as a pod author wrote it, and
of the same pod as the webhook admits it (outside trusted namespaces: removed).
"""

from __future__ import annotations

import contextlib
import copy
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
from gpuwire import grant
from gpuwire.dra import DRIVER
from runtime_hook.setup import launcher
from testbed import dracluster
from testbed.apiserver import ApiServer
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.image import NAME
from testbed.kubelet_dra import DraKubelet
from testbed.kuberuntime import CRIError, KubeRuntime, run_pod
from testbed.lab import Lab, served_launchers
from testbed.scheduler import Scheduler
from testbed.view import VIEW_SCRIPT, granted_view, shown, view
from testbed.webhook import serving
from tests.conftest import requires_binary, requires_root
from tests.system.test_containerd import SHIM, generation, lab, node_containerd
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
def dra_plugin(lab: Lab, cdi_dir: Path) -> Iterator[tuple[ApiServer, DraKubelet, DraPlugin]]:
    """The DRA plugin on the lab's node, writing claims' specs into `cdi_dir` (a containerd's
    CDI spec dir), registered with the kubelet DRA stand-in. The claims' ld-cache hook is a
    launcher only the resident can serve (its Python fallback does not exist), so every GPU
    start shows the resident serving it."""
    with tempfile.TemporaryDirectory(prefix="gw-dra-") as sockets, \
            ApiServer(schema="1.34") as api, \
            DraKubelet(Path(sockets), NODE) as kubelet:  # fmt: skip
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        hook = str(served_launchers() / launcher.HOOK)
        config = Config(sim=str(lab.node), kubelet_root=sockets, hook=hook, cdi_dir=str(cdi_dir),
                        node_name=NODE)  # fmt: skip
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


def put_claim(api: ApiServer, devices: list[str]) -> tuple[str, str, str]:
    name = f"claim-{uuid.uuid4().hex[:6]}"
    results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.gpuwire.io", "count": len(devices)}}]}}  # fmt: skip
    stored = api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"}, "spec": spec,
        "status": {"allocation": {"devices": {"results": results}}},
    })  # fmt: skip
    return "team-a", name, stored["metadata"]["uid"]


def pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p-{uuid.uuid4().hex[:6]}", "namespace": "team-a",
                            "uid": str(uuid.uuid4())}  # fmt: skip
    if annotations:
        meta["annotations"] = annotations
    container = {"name": "trainer", "image": "busybox", "command": ["sh", "-c", VIEW_SCRIPT]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [container]}}  # fmt: skip


def _image(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["spec"]["containers"][0]["image"] = NAME
    return obj


def run_view(kubelet: KubeRuntime, obj: dict[str, Any], ids: list[str] | None = None) -> Any:
    _, (cid,) = run_pod(kubelet, _image(obj), "", claims={"trainer": ids or []})
    status = kubelet.exited(cid)
    assert status.exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid))


def test_a_prepared_claim_gives_exactly_its_gpus_and_unprepare_leaves_nothing(
    generation: Generation, lab: Lab, dra_node: DraNode, kubelet: KubeRuntime
) -> None:
    ref = put_claim(dra_node.api, ["gpu-1", "gpu-3"])
    (answer,) = dra_node.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    ids = dra_node.kubelet.cdi_ids(ref[2], "gpus")
    assert ids == [f"k8s.gpu.gpuwire.io/claim={ref[2]}-gpu-{i}" for i in (1, 3)]
    seen = run_view(kubelet, pod(), ids)
    if not generation.cdi:  # 1.6: no CDI, the field is dropped
        assert seen["devices"] == ["nvidia*"]
    else:
        expected = granted_view(lab.machine.devices, (1, 3), CONTROL)
        assert shown(seen, expected) == expected
        assert seen["env"] == ["void"]  # no NVIDIA-style runtime below injects again
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
