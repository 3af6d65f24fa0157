"""MIG pods through containerd's own CRI plugin, on every containerd generation: the shim's
handler, the device plugin's Allocate answer for a MIG device of the mixed strategy, CDI
(containerd applies gpuwire's spec, whose MIG devices carry their own nodes), and a DRA claim
allocated a MIG device (the DRA plugin publishes it, prepares the claim through the kubelet
DRA stand-in, and containerd applies the claim's spec from the ids in CRI's `CDI_devices`).

The node is tests/system/test_mig_runc.py's: GPU 0 all-balanced, GPU 1 in MIG mode without
MIG devices, GPUs 2 and 3 without MIG, and the MIG map the node agent writes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deviceplugin.dra import devices
from deviceplugin.gpus.simulated import SimDiscovery
from deviceplugin.plugin.allocate import Strategies, response
from deviceplugin.plugin.resources import as_device
from gpuwire import allocation
from gpuwire.dra import DRIVER
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.kuberuntime import KubeRuntime, run_pod
from testbed.lab import Lab
from testbed.view import view
from tests.conftest import requires_binary, requires_root
from tests.system.test_containerd import (  # noqa: F401 - `generation` is a fixture
    HANDLER,
    SHIM,
    generation,
    granted,
    node_containerd,
    pod,
    run_view,
)
from tests.system.test_dra_cri import NODE, dra_plugin
from tests.system.test_mig_runc import EPERM, sibling_script

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("mig-containerd") / "lab", mig={0: ("balanced",), 1: ()})


@pytest.fixture(scope="module")
def node(generation: Generation, lab: Lab) -> Iterator[Containerd]:  # noqa: F811
    cdi = ["--cdi"] if generation.cdi else []
    with node_containerd(generation, lab, ["--runtime-path", SHIM, *cdi]) as containerd:
        yield containerd


@pytest.fixture
def kubelet(node: Containerd) -> Iterator[KubeRuntime]:
    with node.kuberuntime() as runtime:
        yield runtime


def expected_caps(lab: Lab, index: int) -> list[str]:
    target = lab.mig[index]
    return [" ".join(sorted(f"nvidia-cap{c}" for c in (target.gi_cap, target.ci_cap)))]


def smi(lab: Lab, index: int) -> list[str]:
    target = lab.mig[index]
    return [
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(0)})",
        f"  MIG {target.profile:<11} Device  0: (UUID: {target.uuid})",
    ]


def test_a_mig_pod_through_the_shim_sees_its_mig_device_only(
    lab: Lab, kubelet: KubeRuntime
) -> None:
    """containerd's default capabilities include CAP_MKNOD: a sibling's capability node made
    in the pod is refused by the device cgroup."""
    target, sibling = lab.mig[2], lab.mig[3]
    obj = pod(command=sibling_script(sibling.ci_cap), **granted(lab, target.uuid))
    seen, _ = run_view(kubelet, obj, HANDLER)
    assert seen["devices"] == ["nvidia-caps nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"]
    assert seen["caps"] == expected_caps(lab, 2)
    assert seen["smi"] == smi(lab, 2)
    assert seen["sibling"] == [EPERM]


def allocated(lab: Lab, index: int, strategies: Strategies):  # type: ignore[no-untyped-def]
    """The device plugin's Allocate answer for MIG device `index` (mixed strategy)."""
    target = lab.mig[index]
    resource = f"nvidia.com/mig-{target.profile}"
    token = allocation.write(lab.allocations, resource, [target.uuid], lab.keys).token
    gpu = as_device(target, lab.machine.devices[0])
    return response([gpu], token, str(lab.allocations), strategies, (), (target,))


def test_a_mig_device_allocated_by_the_plugin_reaches_the_pod(
    lab: Lab, kubelet: KubeRuntime
) -> None:
    answer = allocated(lab, 1, Strategies())
    seen, _ = run_view(kubelet, pod(**granted(lab, "plugin")), HANDLER, answer)
    assert seen["caps"] == expected_caps(lab, 1)
    assert seen["smi"] == smi(lab, 1)
    assert seen["env"] == [lab.mig[1].uuid]


def test_a_mig_device_through_cdi(generation: Generation, lab: Lab, kubelet: KubeRuntime) -> None:  # noqa: F811
    answer = allocated(lab, 3, Strategies(cdi="uuid"))
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={lab.mig[3].uuid}"]
    seen, _ = run_view(kubelet, pod(), handler="", answer=answer)
    if not generation.cdi:  # containerd 1.6 drops CRI's CDI devices
        assert seen["devices"] == ["nvidia*"]
        return
    assert seen["caps"] == expected_caps(lab, 3)
    assert seen["smi"] == smi(lab, 3)


def test_a_dra_claim_allocated_a_mig_device_sees_that_mig_device_only(
    generation: Generation,  # noqa: F811
    lab: Lab,
    node: Containerd,
    kubelet: KubeRuntime,
) -> None:
    """The claim names the device as the scheduler would (`mig.gpu.gpuwire.io`); its container
    gets the parent's node and that MIG device's capability nodes, a sibling's is refused."""
    target, sibling = lab.mig[1], lab.mig[3]
    published = devices.devices(SimDiscovery(lab.node).discover(), devices.Sharing())
    (name,) = [d.name for d in published if d.mig == target]
    with dra_plugin(lab, node.home / "cdi") as (api, dra, _):
        result = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": name}
        spec = {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.gpu.gpuwire.io"}}]}}  # fmt: skip
        claim = api.put({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "one-mig", "namespace": "team-a"}, "spec": spec,
            "status": {"allocation": {"devices": {"results": [result]}}},
        })  # fmt: skip
        ref = ("team-a", "one-mig", claim["metadata"]["uid"])
        (answer,) = dra.prepare(DRIVER, [ref]).values()
        assert answer.error == ""
        ids = {"trainer": dra.cdi_ids(ref[2], "mig")}
        _, (cid,) = run_pod(kubelet, pod(command=sibling_script(sibling.ci_cap)), "", claims=ids)
        assert kubelet.exited(cid).exit_code == 0, kubelet.logs(cid)
        seen = view(kubelet.logs(cid))
        assert dra.unprepare(DRIVER, [ref]) == {ref[2]: ""}
    if not generation.cdi:  # containerd 1.6 drops CRI's CDI devices
        assert seen["devices"] == ["nvidia*"]
        return
    assert seen["devices"] == ["nvidia-caps nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"]
    assert seen["caps"] == expected_caps(lab, 1)
    assert seen["smi"] == smi(lab, 1)
    assert seen["sibling"] == [EPERM]
    assert seen["env"] == [target.uuid]  # the claim's spec names the MIG device it gives
