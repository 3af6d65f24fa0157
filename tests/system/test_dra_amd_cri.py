"""An AMD claim through a real containerd's CRI plugin: the DRA plugin on a simulated AMD node
(two MI300X in CPX: sixteen partitions, `--vendor amd`) prepares a claim of one partition, the
CRI kubelet stand-in sends its CDI ids, containerd applies the claim's spec: the container sees
`/dev/kfd` and exactly that partition's render node, one of a sibling partition made inside
stays denied by the cgroup, and `AMD_VISIBLE_DEVICES` names the partition. Under gpuwire's
handler the claim's token is the proof the shim accepts (the same edits again add nothing), and
in another namespace it fails the start. On containerd 1.7 and 2.x: 1.6 drops CRI's CDI devices,
so a claim reaches no container there (test_dra_cri shows it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuwire import amdsim
from testbed import containerds
from testbed.containerds import Generation
from testbed.kuberuntime import CRIError, KubeRuntime, run_pod
from testbed.lab import AmdLab
from testbed.view import amd_granted_view, shown, sibling_denied, view
from tests.conftest import requires_binary, requires_root
from tests.system.test_amd_containerd import mknod_pod
from tests.system.test_containerd import HANDLER, SHIM, generation_of, node_containerd
from tests.system.test_dra_cri import DraNode, dra_plugin, prepared, release

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]
CDI_SUITES = [s for s in containerds.SUITES if s != "bookworm"]  # containerd 1.7, 2.x


@pytest.fixture(scope="module", params=CDI_SUITES)
def generation(request: pytest.FixtureRequest) -> Generation:
    return generation_of(request.param)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> AmdLab:
    machine = amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS1")
    return AmdLab(tmp_path_factory.mktemp("dra-amd") / "lab", machine)


@pytest.fixture(scope="module")
def dra_node(generation: Generation, lab: AmdLab) -> Iterator[DraNode]:
    assert generation.cdi, generation.version
    with node_containerd(generation, lab, ["--runtime-path", SHIM, "--cdi"]) as containerd, \
            dra_plugin(lab, containerd.home / "cdi", "amd") as (api, kubelet, plugin):  # fmt: skip
        yield DraNode(containerd, api, kubelet, plugin)


@pytest.fixture
def kubelet(dra_node: DraNode) -> Iterator[KubeRuntime]:
    with dra_node.containerd.kuberuntime() as runtime:
        yield runtime


def run_view(
    kubelet: KubeRuntime, obj: dict[str, object], ids: list[str], handler: str
) -> dict[str, list[str]]:
    _, (cid,) = run_pod(kubelet, obj, handler, claims={"trainer": ids})
    assert kubelet.exited(cid).exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid))


def test_a_claims_container_sees_kfd_and_exactly_its_render_node(
    lab: AmdLab, dra_node: DraNode, kubelet: KubeRuntime
) -> None:
    given, sibling = lab.found.gpus[3], lab.found.gpus[4]
    name = f"gpu-{given.card}-{given.device.minor}"
    trainer = mknod_pod(SIBLING=str(sibling.device.minor))
    ref, ids = prepared(dra_node, [name], reserved=(trainer,))
    assert ids == [f"k8s.gpu.gpuwire.io/claim={ref[2]}-{name}"]
    expected = {**amd_granted_view([given.device.minor]), **sibling_denied()}
    for handler in ("", HANDLER):  # the engine's CDI alone; and with gpuwire's shim on top
        again = dict(trainer, metadata={**trainer["metadata"], "name": f"p-{handler or 'runc'}"})
        seen = run_view(kubelet, again, ids, handler)
        assert shown(seen, expected) == expected
        assert seen["env"] == [given.device.uuid]
    assert run_view(kubelet, mknod_pod(), [], "")["dri"] == [""]  # no claim: no GPU
    elsewhere = mknod_pod()
    elsewhere["metadata"]["namespace"] = "team-b"
    with pytest.raises(CRIError, match=f"claim team-a/{ref[1]} is "):
        run_view(kubelet, elsewhere, ids, HANDLER)
    release(dra_node, ref)
