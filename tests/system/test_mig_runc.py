"""MIG through real runc on a simulated MIG node: the prestart hook and the shim, run by
Python and served by a resident.

GPU 0 runs mig-parted's all-balanced layout (2 × 1g.10gb, 2g.20gb, 3g.40gb), GPU 1 MIG
with no instances yet, GPUs 2 and 3 no MIG. A container granted one MIG device sees its
parent's node and exactly its two capability nodes; a capability node of a sibling made
inside the container (CAP_MKNOD) is refused by the device cgroup (EPERM), where its own
opens with ENXIO (allowed, no driver to answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwire import allocation
from testbed.lab import Lab, cri_annotations
from testbed.view import VIEW_SCRIPT, view
from tests.conftest import requires_binary, requires_root
from tests.system.test_runc import DELIVERIES, granted_env, make_bundle, run

pytestmark = [requires_root(), requires_binary("runc")]

ENXIO = "cat: can't open '{}': No such device or address"
EPERM = "cat: can't open '/tmp/sibling': Operation not permitted"
CAPS_MAJOR = 509  # the simulated node's nvidia-caps major (/proc/devices)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab", mig={0: ("balanced",), 1: ()})
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it
    return lab


def sibling_script(minor: int) -> str:
    """VIEW_SCRIPT, then an attempt at a capability the container was not given."""
    make = f"mknod /tmp/sibling c {CAPS_MAJOR} {minor}"
    return VIEW_SCRIPT + f'{make} && cat /tmp/sibling 2>&1 >/dev/null | sed "s|^|sibling: |"\n'


def with_mknod(bundle_spec: dict[str, object]) -> None:
    caps = bundle_spec["process"]["capabilities"]  # type: ignore[index]
    for kind in ("bounding", "effective", "permitted"):
        caps[kind] = [*caps.get(kind, []), "CAP_MKNOD"]


def smi_line(lab: Lab, index: int) -> str:
    return f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(index)})"


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("form", ["uuid", "place", "legacy"])
def test_one_mig_device_sees_its_parent_and_its_capabilities_only(
    lab: Lab, delivery: str, form: str
) -> None:
    target, sibling = lab.mig[2], lab.mig[3]  # the two 1g.10gb
    assert (target.profile, sibling.profile) == ("1g.10gb", "1g.10gb")
    visible = {"uuid": target.uuid, "place": target.place, "legacy": target.legacy_uuid}[form]
    bundle = make_bundle(
        lab, granted_env(lab, visible), delivery=delivery, script=sibling_script(sibling.gi_cap)
    )
    with_mknod(bundle.spec)
    bundle.save()
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["devices"] == ["nvidia-caps nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"]
    own = sorted(f"nvidia-cap{m}" for m in (target.gi_cap, target.ci_cap))
    assert seen["caps"] == [" ".join(own)]
    for name in own:
        path = f"/dev/nvidia-caps/{name}"
        assert seen[f"open {path}"] == [ENXIO.format(path)]
    assert seen["sibling"] == [EPERM]  # the cgroup allows its own capabilities only
    assert seen["smi"] == [
        smi_line(lab, 0),
        f"  MIG 1g.10gb     Device  0: (UUID: {target.uuid})",
    ]
    if delivery.startswith("shim"):  # named as NVML names it, however it was asked for
        assert seen["env"] == [target.uuid]
    assert any(f"MIG {target.place} (" in line for line in lab.log_lines())


def test_the_shim_allows_exactly_those_nodes_in_the_cgroup(lab: Lab) -> None:
    target = lab.mig[0]
    bundle = make_bundle(lab, granted_env(lab, target.uuid, "utility"), delivery="shim")
    assert run(bundle, "shim").returncode == 0
    spec = json.loads((bundle.path / "config.json").read_text())
    allowed = [
        (r["major"], r["minor"])
        for r in spec["linux"]["resources"]["devices"]
        if r.get("allow") and "major" in r
    ]
    assert allowed == [
        (195, 255),
        (195, 0),
        (CAPS_MAJOR, target.gi_cap),
        (CAPS_MAJOR, target.ci_cap),
    ]
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert paths == [
        "/dev/nvidiactl",
        "/dev/nvidia0",
        f"/dev/nvidia-caps/nvidia-cap{target.gi_cap}",
        f"/dev/nvidia-caps/nvidia-cap{target.ci_cap}",
    ]


@pytest.mark.parametrize("delivery", ["prestart", "shim"])
def test_a_whole_mig_gpu_comes_with_all_its_mig_devices(lab: Lab, delivery: str) -> None:
    out = run(make_bundle(lab, granted_env(lab, lab.uuid(0)), delivery=delivery), delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    minors = sorted(f"nvidia-cap{c}" for m in lab.mig for c in (m.gi_cap, m.ci_cap))
    assert seen["caps"] == [" ".join(minors)]
    assert seen["smi"][0] == smi_line(lab, 0)
    assert sorted(line.split("(UUID: ")[1] for line in seen["smi"][1:]) == sorted(
        f"{m.uuid})" for m in lab.mig
    )


def test_device_plugin_allocation_of_a_mig_device(lab: Lab) -> None:
    target = lab.mig[1]
    token = allocation.write(lab.allocations, "nvidia.com/mig-2g.20gb", [target.uuid], lab.keys)
    mount = {
        "destination": allocation.container_path(token.token),
        "type": "bind",
        "source": f"{lab.allocations}/{token.token}",
        "options": ["rbind", "ro"],
    }
    bundle = make_bundle(
        lab, {"NVIDIA_VISIBLE_DEVICES": target.uuid}, delivery="shim", mounts=[mount]
    )
    out = run(bundle, "shim")
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["smi"] == [
        smi_line(lab, 0),
        f"  MIG 2g.20gb     Device  0: (UUID: {target.uuid})",
    ]
    (record,) = [json.loads(p.read_text()) for p in lab.records.iterdir()]
    assert record["gpus"] == [target.uuid]


def test_a_map_older_than_the_mig_layout_names_nothing_on_that_gpu(lab: Lab) -> None:
    """After a MIG change the node agent has not seen yet, MIG UUIDs on that GPU are refused
    with why, and procfs's names still work; once the agent has written the map again, the
    UUIDs work."""
    from gpuwire import sim

    kept = lab.mig[3]
    sim.write_node(lab.node, sim.destroy_mig(lab.machine, 0, lab.mig[2].gi))
    out = run(make_bundle(lab, granted_env(lab, kept.uuid), delivery="shim"), "shim")
    assert out.returncode != 0
    assert f"unknown device {kept.uuid!r}: the MIG map" in out.stderr
    out = run(make_bundle(lab, granted_env(lab, kept.place), delivery="shim"), "shim")
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["env"] == [kept.legacy_uuid]  # unnamed: procfs's name
    lab.write_mig_map()
    out = run(make_bundle(lab, granted_env(lab, kept.uuid), delivery="shim"), "shim")
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["env"] == [kept.uuid]


@pytest.mark.parametrize("delivery", ["prestart", "shim"])
def test_mig_config_is_for_privileged_containers_only(lab: Lab, delivery: str) -> None:
    env = granted_env(lab, lab.mig[0].uuid) | {"NVIDIA_MIG_CONFIG_DEVICES": "all"}
    out = run(make_bundle(lab, env, delivery=delivery), delivery)
    assert out.returncode != 0
    assert "cannot set MIG_CONFIG_DEVICES in non privileged container" in out.stderr
    privileged = make_bundle(
        lab,
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_CONFIG_DEVICES": "all"},
        cri_annotations(),
        delivery=delivery,
    )
    privileged.spec["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    privileged.save()
    out = run(privileged, delivery)
    assert out.returncode == 0, out.stderr
    assert "nvidia-cap1" in view(out.stdout)["caps"][0].split()  # mig/config's minor
