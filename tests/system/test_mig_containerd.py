"""MIG pods through containerd's own CRI plugin, on every containerd generation: the shim's
handler, the device plugin's Allocate answer for a MIG device of the mixed strategy, and
CDI (containerd applies gpuwire's spec, whose MIG devices carry their own nodes).

The node is tests/system/test_mig_runc.py's: GPU 0 all-balanced, GPU 1 in MIG mode without
MIG devices, GPUs 2 and 3 without MIG, and the MIG map the node agent writes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deviceplugin.allocate import Strategies, response
from deviceplugin.resources import as_device
from gpuwire import allocation
from testbed.containerd import Containerd
from testbed.containerds import Generation
from testbed.kuberuntime import KubeRuntime
from testbed.lab import Lab
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
