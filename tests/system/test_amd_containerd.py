"""Proof with containerd's own CRI plugin on a simulated AMD node, on each generation: a pod
through gpuwire's handler gets `/dev/kfd` and exactly its partitions' render nodes, a
sibling's stays denied by the cgroup; without a grant it gets nothing; the `cdi` overlay's
path (no runtime class: the device plugin names CDI devices of kind `amd.com/gpu`, containerd
applies the spec `gpuwire cdi generate` wrote for the node) gives exactly those from 1.7 on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deviceplugin.api import api_pb2
from gpuwire import amdsim
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.kuberuntime import KubeRuntime, run_pod
from testbed.lab import AmdLab
from testbed.view import AMD_VIEW_SCRIPT, amd_granted_view, shown, sibling_denied, view
from tests.conftest import requires_binary, requires_root
from tests.system.test_containerd import HANDLER, SHIM, generation, node_containerd, pod

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]
__all__ = ["generation"]  # the fixture, one containerd generation per module run


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> AmdLab:
    machine = amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS1")
    return AmdLab(tmp_path_factory.mktemp("amd-containerd") / "lab", machine)


@pytest.fixture(scope="module")
def node(generation: Generation, lab: AmdLab) -> Iterator[Containerd]:
    cdi = ["--cdi"] if generation.cdi else []
    with node_containerd(generation, lab, ["--runtime-path", SHIM, *cdi]) as containerd:
        yield containerd


@pytest.fixture
def kubelet(node: Containerd) -> Iterator[KubeRuntime]:
    with node.kuberuntime() as runtime:
        yield runtime


def mknod_pod(**env: str) -> dict[str, Any]:
    obj = pod(command=AMD_VIEW_SCRIPT, **env)
    obj["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["MKNOD"]}}
    return obj


def run_view(
    kubelet: KubeRuntime, obj: dict[str, Any], handler: str, answer: Any = None
) -> dict[str, list[str]]:
    answers = {"trainer": [answer]} if answer else None
    _, (cid,) = run_pod(kubelet, obj, handler, answers)
    assert kubelet.exited(cid).exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid))


def test_a_pod_through_the_handler_gets_exactly_its_partitions(
    lab: AmdLab, kubelet: KubeRuntime
) -> None:
    given = lab.found.devices[3]
    obj = mknod_pod(**lab.grant(given.uuid), SIBLING=str(lab.found.devices[4].minor))
    seen = run_view(kubelet, obj, HANDLER)
    expected = {**amd_granted_view([given.minor]), **sibling_denied()}
    assert shown(seen, expected) == expected
    assert seen["env"] == [given.uuid]


def test_no_grant_no_gpu(lab: AmdLab, kubelet: KubeRuntime) -> None:
    seen = run_view(kubelet, mknod_pod(AMD_VISIBLE_DEVICES="all", SIBLING="128"), HANDLER)
    assert seen["dri"] == [""]
    assert shown(seen, sibling_denied()) == sibling_denied()


def test_cdi_devices_of_kind_amd_com_gpu(
    generation: Generation, lab: AmdLab, kubelet: KubeRuntime
) -> None:
    given = lab.found.devices[9]
    answer = api_pb2.ContainerAllocateResponse(
        cdi_devices=[api_pb2.CDIDevice(name=f"amd.com/gpu={given.uuid}")]
    )
    seen = run_view(kubelet, mknod_pod(SIBLING=str(given.minor + 1)), "", answer)
    if not generation.cdi:  # containerd 1.6 drops CRI's CDI devices
        assert seen["dri"] == [""]
        return
    expected = {**amd_granted_view([given.minor]), **sibling_denied()}
    assert shown(seen, expected) == expected
    assert seen["env"] == ["void"]  # the spec's common env: no AMD runtime may inject again
