"""MIG in the contract: procfs as the driver writes it, NVIDIA_VISIBLE_DEVICES' MIG forms,
the MIG map, profile names, and the edits a MIG device gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import mig, migprofiles, sim
from gpuwire.devices import MigDevice, UnknownDevice, parse_request, select
from gpuwire.driver import DiscoveryError, Driver, discover
from gpuwire.edits import Layout, container_edits
from gpuwire.roots import Roots


@pytest.fixture
def mig_node(tmp_path: Path) -> tuple[Path, sim.Machine]:
    """GPU 0 all-balanced, GPU 1 in MIG mode without instances, GPUs 2 and 3 without MIG."""
    machine = sim.make_machine(gpus=4)
    machine = sim.with_mig(sim.with_mig(machine, 0, ("balanced",)), 1, ())
    sim.write_node(tmp_path / "node", machine)
    return tmp_path / "node", machine


@pytest.fixture
def driver(mig_node: tuple[Path, sim.Machine]) -> Driver:
    return discover(Roots(str(mig_node[0])), ("utility",))


def test_procfs_lists_what_exists_with_the_drivers_minors(
    mig_node: tuple[Path, sim.Machine], driver: Driver
) -> None:
    root, machine = mig_node
    gpu0 = machine.devices[0]
    layout = [(m.gi, m.ci, m.profile) for m in machine.gpus[0].mig or ()]
    assert sorted(p for _, _, p in layout) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert [(m.gi, m.ci) for m in driver.mig] == sorted((gi, ci) for gi, ci, _ in layout)
    assert {m.parent_uuid for m in driver.mig} == {gpu0.uuid}
    minors = (root / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    table = dict(line.rsplit(" ", 1) for line in minors)
    for m in driver.mig:  # discovery reads the capability files; mig-minors agrees
        assert int(table[f"gpu0/gi{m.gi}/access"]) == m.gi_cap
        assert int(table[f"gpu0/gi{m.gi}/ci{m.ci}/access"]) == m.ci_cap
    assert table["gpu0/gi0/access"] == "3"
    assert table["gpu1/gi1/ci0/access"] == "148"
    assert driver.mig_controls == {"config": 1, "monitor": 2}
    assert driver.caps_major == sim.CAPS_MAJOR
    assert driver.cap_node(12).host_path == f"{root}/dev/nvidia-caps/nvidia-cap12"


def test_capability_file_format() -> None:
    text = "DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    assert mig.parse_capability(text) == 13
    with pytest.raises(mig.MigError, match="no DeviceFileMinor"):
        mig.parse_capability("DeviceFileMode: 292\n", "gi1/access")


def test_mig_capabilities_without_the_caps_major_is_a_clear_error(
    mig_node: tuple[Path, sim.Machine],
) -> None:
    root, _ = mig_node
    devices = root / "proc/devices"
    devices.write_text(devices.read_text().replace("nvidia-caps", "other"))
    with pytest.raises(DiscoveryError, match="no nvidia-caps"):
        discover(Roots(str(root)), ("utility",))


def named(driver: Driver, machine: sim.Machine) -> tuple[MigDevice, ...]:
    """The MIG devices named as the machine names them (what the node agent's map says)."""
    uuids = {(m.gi, m.ci): (m.uuid, m.profile) for m in machine.gpus[0].mig or ()}
    return tuple(m.identified(*uuids[(m.gi, m.ci)], 0, 0) for m in driver.mig)


def test_map_names_a_gpu_only_while_its_instances_are_the_maps(
    tmp_path: Path, driver: Driver, mig_node: tuple[Path, sim.Machine]
) -> None:
    path = str(tmp_path / "run/mig-devices")
    devices = named(driver, mig_node[1])
    assert mig.write_map(path, devices) is True
    assert mig.write_map(path, devices) is False  # unchanged: not rewritten
    assert mig.identify(driver.mig, mig.read_map(path)) == devices
    assert mig.identify(driver.mig[1:], mig.read_map(path)) == driver.mig[1:]  # one gone
    assert mig.read_map(str(tmp_path / "missing")) == {}
    Path(path).write_text('{"v": 2}')
    with pytest.raises(mig.MigError, match="not a version 1 MIG map"):
        mig.read_map(path)


def test_visible_devices_mig_forms(driver: Driver, mig_node: tuple[Path, sim.Machine]) -> None:
    devices = named(driver, mig_node[1])
    target = devices[2]
    for form in (target.uuid, target.uuid.upper(), target.legacy_uuid, target.place):
        chosen = select(parse_request(f"3,{form}"), driver.devices, devices)
        assert chosen.gpus == (driver.devices[3],)
        assert chosen.mig == (target,)
        assert chosen.names() == (driver.devices[3].uuid, target.uuid)
    whole = select(parse_request(f"0,{target.uuid}"), driver.devices, devices)
    assert whole.mig == ()  # the whole GPU already has it
    assert select(parse_request("all"), driver.devices, devices).gpus == driver.devices


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("0:1", "<gpu>:<mig index> counts MIG devices in NVML's enumeration order"),
        ("0:9:0", "this node has 0:2:0"),
        ("1:1:0", "this node has 0:2:0"),
        ("MIG-" + "a" * 36, "this node has 0:2:0"),
    ],
)
def test_unknown_mig_device_says_what_exists(driver: Driver, entry: str, says: str) -> None:
    with pytest.raises(UnknownDevice, match=says) as err:
        select(parse_request(entry), driver.devices, driver.mig)
    assert repr(entry) in str(err.value)


def test_unnamed_uuid_blames_the_map(driver: Driver) -> None:
    with pytest.raises(UnknownDevice, match=r"the MIG map .* does not name 4"):
        select(parse_request("MIG-" + "b" * 36), driver.devices, driver.mig)


def test_edits_of_one_mig_device_and_of_a_whole_mig_gpu(driver: Driver) -> None:
    target = driver.mig[2]
    edits = container_edits(driver, (), ("utility",), Layout.of(debian=True), (target,))
    nodes = [(n["path"], n["major"], n["minor"]) for n in edits.device_nodes]
    caps = sim.CAPS_MAJOR
    assert nodes == [
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia0", 195, 0),
        (f"/dev/nvidia-caps/nvidia-cap{target.gi_cap}", caps, target.gi_cap),
        (f"/dev/nvidia-caps/nvidia-cap{target.ci_cap}", caps, target.ci_cap),
    ]
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == target.legacy_uuid  # unnamed here
    whole = container_edits(driver, driver.devices[:1], ("utility",), Layout.of(debian=True))
    minors = [n["minor"] for n in whole.device_nodes if n["major"] == caps]
    assert minors == [c for m in driver.mig for c in (m.gi_cap, m.ci_cap)]
    config = container_edits(
        driver, driver.devices[2:3], ("utility",), Layout.of(debian=True), (), ("config",)
    )
    assert [n["minor"] for n in config.device_nodes if n["major"] == caps] == [1]


@pytest.mark.parametrize(
    ("product", "profile"),
    [(product, p) for product, profiles in migprofiles.PROFILES.items() for p in profiles],
    ids=lambda x: x if isinstance(x, str) else x.name,
)
def test_nvidias_naming_gives_every_profiles_documented_name(
    product: str, profile: migprofiles.Profile
) -> None:
    total = sim.product_memory(product)[0]
    gb = mig.memory_gb(total, profile.memory_mib)
    suffix = mig.SUFFIXES.get(profile.enum, "")
    assert mig.profile_name(profile.slices, profile.slices, gb, suffix) == profile.name


def test_profile_name_of_a_split_gpu_instance_and_half_up_rounding() -> None:
    assert mig.profile_name(3, 1, 40) == "1c.3g.40gb"
    assert mig.memory_gb(143771, 71424) == 71  # 70.5 GB: go-nvlib rounds half away from zero


def test_cdi_spec_lists_mig_devices_with_their_own_nodes(
    driver: Driver, mig_node: tuple[Path, sim.Machine]
) -> None:
    from gpuwire import cdi

    driver.mig = named(driver, mig_node[1])
    spec = cdi.generate(driver, "/usr/bin/gpuwire-hook", "/sbin/ldconfig", ("utility",))
    by_name = {
        d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]
    }
    target = driver.mig[2]
    own = [
        "/dev/nvidia0",
        *(f"/dev/nvidia-caps/nvidia-cap{c}" for c in (target.gi_cap, target.ci_cap)),
    ]
    assert by_name[target.place] == by_name[target.uuid] == own
    assert len(by_name["0"]) == 1 + 2 * len(driver.mig)  # the whole GPU: all its MIG devices
    assert by_name["3"] == ["/dev/nvidia3"]
    assert set(by_name["all"]) == {p for paths in by_name.values() for p in paths}
