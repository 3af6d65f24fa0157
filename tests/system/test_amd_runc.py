"""Proof with real runc on a simulated AMD node: the prestart hook and the shim, each also served
by the resident, give a container `/dev/kfd` and exactly its GPUs' (or partitions') render
nodes, with the cgroup rules that let it open them: a granted node opens with ENXIO (the
cgroup allows it, no driver answers), a sibling's is not there, and made inside with mknod
(the container has CAP_MKNOD, and runc's default rules allow mknod) it cannot be opened or
written: EPERM, the device cgroup's answer, which is also what keeps KFD from showing that GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import amdsim
from testbed.lab import AmdLab
from testbed.view import AMD_VIEW_SCRIPT, amd_granted_view, shown, sibling_denied, view
from tests.conftest import requires_binary, requires_root
from tests.system.test_runc import DELIVERIES, make_bundle, run

pytestmark = [requires_root(), requires_binary("runc")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> AmdLab:
    """Two MI300X in CPX: sixteen partitions, each a device with its own render node."""
    machine = amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS4")
    return AmdLab(tmp_path_factory.mktemp("amd") / "lab", machine)


@pytest.fixture(autouse=True)
def config(lab: AmdLab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it


def with_mknod(lab: AmdLab, env: dict[str, str], delivery: str) -> dict[str, list[str]]:
    bundle = make_bundle(lab, env, delivery=delivery, script=AMD_VIEW_SCRIPT)
    caps = bundle.spec["process"]["capabilities"]
    for kind in ("bounding", "effective", "permitted"):
        caps[kind] = [*caps[kind], "CAP_MKNOD"]
    bundle.save()
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    return view(out.stdout)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_partitions_of_two_gpus_and_nothing_of_their_siblings(lab: AmdLab, delivery: str) -> None:
    """Partition 1 of GPU 0 and partition 0 of GPU 1 (an XGMI pair across GPUs); the sibling
    asked for is partition 2 of GPU 0, beside the first."""
    given = [lab.found.devices[1], lab.found.devices[8]]
    sibling = lab.found.devices[2].minor
    env = {**lab.grant(f"{given[0].uuid},{given[1].uuid}"), "SIBLING": str(sibling)}
    seen = with_mknod(lab, env, delivery)
    expected = {**amd_granted_view([d.minor for d in given]), **sibling_denied()}
    assert shown(seen, expected) == expected
    assert seen["dri"] == ["renderD129 renderD136"]
    assert "mknod" not in seen  # made: the EPERM is the cgroup's, not a missing capability
    if delivery.startswith("shim"):  # the shim also finalises the env the process sees
        assert seen["env"] == [f"{given[0].uuid},{given[1].uuid}"]
    assert any(
        f"team-a/trainer: GPUs 1 ({given[0].uuid}), 8 ({given[1].uuid}): grant" in line
        for line in lab.log_lines()
    )


@pytest.mark.parametrize("delivery", ["prestart", "shim"])
def test_an_image_that_bakes_in_all_gets_nothing(lab: AmdLab, delivery: str) -> None:
    seen = with_mknod(lab, {"AMD_VISIBLE_DEVICES": "all", "SIBLING": "128"}, delivery)
    assert seen["dri"] == [""]  # no /dev/dri at all
    assert "open /dev/kfd" not in seen
    assert shown(seen, sibling_denied()) == sibling_denied()
    assert lab.log_lines()[-1].endswith(
        "team-a/trainer: no GPU: AMD_VISIBLE_DEVICES=all not honoured: no GPUWIRE_GRANT, no "
        'device-plugin allocation, and the container is not privileged (trust = "granted")'
    )


def test_a_whole_gpu_by_bus_id_is_all_its_partitions(lab: AmdLab) -> None:
    seen = with_mknod(lab, {**lab.grant("0000:15:00.0"), "SIBLING": "128"}, "shim")
    expected = {**amd_granted_view(range(136, 144)), **sibling_denied()}
    assert shown(seen, expected) == expected


def test_card_nodes_where_the_config_asks(lab: AmdLab, tmp_path: Path) -> None:
    lab.configure(**{"amd-cards": "true"})
    try:
        seen = with_mknod(lab, lab.grant("3"), "prestart")
    finally:
        lab.configure()
    assert seen["dri"] == ["card4 renderD131"]  # card0 is the BMC's
    assert seen["open /dev/dri/card4"] == [
        "cat: can't open '/dev/dri/card4': No such device or address"
    ]
