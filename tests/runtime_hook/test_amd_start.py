"""The start path on an AMD node: the same trust, AMD's request env, AMD's devices and edits."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import allocation, amd, amdsim
from gpuwire.vendor import AMD
from runtime_hook.start import config as cfg
from runtime_hook.start import plan
from runtime_hook.start.trust import GRANTED, NOT_GPU, REFUSED, evaluate
from testbed.lab import AmdLab, container_spec, grant_for


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> AmdLab:
    """Four MI300X in SPX. Each holds eight DRM minors (its own and seven for partitions, made
    in every mode), so GPU N's render node is renderD<128 + 8N>, its card card<1 + 8N>."""
    return AmdLab(tmp_path_factory.mktemp("amd"), amdsim.make_machine(4, "MI300X"))


def settings(lab: AmdLab, **extra: str) -> cfg.Config:
    lab.configure(**extra)
    return cfg.load(str(lab.config))


def made(lab: AmdLab, env: dict[str, str], **extra: str) -> plan.Plan:
    bundle = lab.root / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    return plan.make(container_spec(env), str(bundle), settings(lab, **extra))


def paths(p: plan.Plan) -> list[str]:
    assert p.edits is not None
    return [n["path"] for n in p.edits.device_nodes]


def test_a_granted_container_gets_kfd_and_exactly_its_render_nodes(lab: AmdLab) -> None:
    p = made(lab, lab.grant("1,3"))
    assert p.outcome.verdict.status == GRANTED
    assert paths(p) == ["/dev/kfd", "/dev/dri/renderD136", "/dev/dri/renderD152"]
    assert p.edits is not None
    nodes = {n["path"]: (n["major"], n["minor"]) for n in p.edits.device_nodes}
    assert nodes["/dev/kfd"] == (amdsim.KFD_MAJOR, 0)  # the dynamic major, from /proc/devices
    assert nodes["/dev/dri/renderD152"] == (amd.DRM_MAJOR, 152)
    assert (p.edits.mounts, p.edits.links, p.edits.ldcache_folders) == ([], [], [])
    assert p.edits.env == {"AMD_VISIBLE_DEVICES": f"{lab.uuid(1)},{lab.uuid(3)}"}
    assert plan.summary(p) == (f"team-a/trainer: GPUs 1 ({lab.uuid(1)}), 3 ({lab.uuid(3)}): grant")


def test_card_nodes_only_where_the_node_config_asks(lab: AmdLab) -> None:
    p = made(lab, lab.grant("1"), **{"amd-cards": "true"})  # card0 is the BMC's
    assert paths(p) == ["/dev/kfd", "/dev/dri/renderD136", "/dev/dri/card9"]
    assert paths(made(lab, lab.grant("1"))) == ["/dev/kfd", "/dev/dri/renderD136"]


@pytest.mark.parametrize(
    "visible", ["0-1", "GPU-{0},GPU-{1}", "0x{0h},{1h}", "0000:05:00.0,0000:15:00.0"]
)
def test_every_spelling_of_amds_toolkit_names_the_same_devices(lab: AmdLab, visible: str) -> None:
    value = visible.format(
        lab.uuid(0)[4:], lab.uuid(1)[4:], **{"0h": lab.uuid(0)[4:], "1h": lab.uuid(1)[4:]}
    )
    p = made(lab, lab.grant(value))
    assert [d.index for d in p.outcome.devices] == [0, 1]


def test_an_image_that_bakes_in_all_gets_nothing(lab: AmdLab) -> None:
    outcome = evaluate(container_spec({"AMD_VISIBLE_DEVICES": "all"}), settings(lab), claim=True)
    assert outcome.verdict.status == REFUSED
    assert outcome.verdict.reason == (
        "AMD_VISIBLE_DEVICES=all not honoured: no GPUWIRE_GRANT, no device-plugin allocation, "
        'and the container is not privileged (trust = "granted")'
    )


def test_an_nvidia_grant_is_no_amd_grant(lab: AmdLab) -> None:
    """The same devices value, signed for NVIDIA_VISIBLE_DEVICES: refused on an AMD node."""
    env = {"AMD_VISIBLE_DEVICES": "all", "GPUWIRE_GRANT": grant_for(lab.keys, "all")}
    outcome = evaluate(container_spec(env), settings(lab), claim=True)
    assert outcome.verdict.status == REFUSED
    assert "does not sign namespace=team-a container=trainer devices=all" in outcome.verdict.reason


def test_a_grant_per_vendor_holds_on_either(lab: AmdLab) -> None:
    """A pod that may land on NVIDIA or AMD nodes carries both grants in GPUWIRE_GRANT."""
    both = f"{grant_for(lab.keys, 'all')},{grant_for(lab.keys, 'all', vendor=AMD)}"
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "AMD_VISIBLE_DEVICES": "all", "GPUWIRE_GRANT": both}
    outcome = evaluate(container_spec(env), settings(lab), claim=True)
    assert outcome.verdict.status == GRANTED
    assert len(outcome.devices) == 4


def test_nvidia_env_means_nothing_on_an_amd_node(lab: AmdLab) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "GPUWIRE_GRANT": grant_for(lab.keys, "all")}
    assert evaluate(container_spec(env), settings(lab), claim=True).verdict.status == NOT_GPU


def test_an_unknown_device_fails_the_start_naming_what_the_node_has(lab: AmdLab) -> None:
    outcome = evaluate(container_spec(lab.grant("7")), settings(lab), claim=True)
    assert outcome.error is not None
    assert outcome.error.startswith(f"unknown device '7': this node has 0 ({lab.uuid(0)}), 1 (")


def test_an_allocation_token_gives_its_devices_and_no_others(lab: AmdLab) -> None:
    token = allocation.write(lab.allocations, AMD.resource, [lab.uuid(2)], lab.keys).token
    mount = {
        "destination": allocation.container_path(token),
        "source": f"{lab.allocations}/{token}",
        "type": "bind",
        "options": ["ro", "bind"],
    }
    spec = container_spec({"AMD_VISIBLE_DEVICES": "all"}, mounts=[mount])
    bundle = lab.root / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    p = plan.make(spec, str(bundle), settings(lab))
    assert p.outcome.verdict.basis == "allocation"
    assert paths(p) == ["/dev/kfd", "/dev/dri/renderD144"]


def test_partitions_are_devices_of_their_own(tmp_path: Path) -> None:
    lab = AmdLab(tmp_path, amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS4"))
    p = made(lab, lab.grant("0000:15:00.0"))  # a GPU by bus id: all eight of its partitions
    assert [d.index for d in p.outcome.devices] == list(range(8, 16))
    p = made(lab, lab.grant(lab.uuid(9)))
    assert paths(p) == ["/dev/kfd", "/dev/dri/renderD137"]


def test_the_node_config_names_the_vendor(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('vendor = "intel"\n')
    with pytest.raises(cfg.ConfigError, match="vendor = 'intel' is not accepted: expected 'nv"):
        cfg.load(str(tmp_path / "config.toml"))
