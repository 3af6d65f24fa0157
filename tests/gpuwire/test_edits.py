"""The container edits: the pure function every delivery shares, and its CDI rendering."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpuwire import sim
from gpuwire.cdi import hooks, to_cdi
from gpuwire.driver import Driver, discover
from gpuwire.edits import HOOK_ENV, Edits, Layout, container_edits, ldcache_args, parse_ldcache_args
from gpuwire.roots import Roots
from runtime_hook.start import spec as ocispec
from testbed.lab import container_spec

VERSION = sim.DEFAULT_DRIVER
DEB = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def driver(sim_node: tuple[Path, sim.Machine]) -> Driver:
    return discover(Roots(str(sim_node[0])))


def nodes(edits: Edits) -> dict[str, tuple[int, int]]:
    return {n["path"]: (n["major"], n["minor"]) for n in edits.device_nodes}


def targets(edits: Edits) -> set[str]:
    return {m["containerPath"] for m in edits.mounts}


def test_compute_utility_on_two_gpus(driver: Driver) -> None:
    picked = driver.devices[1:3]
    edits = container_edits(driver, picked, ("compute", "utility"), Layout.of(debian=True))
    assert nodes(edits) == {
        "/dev/nvidiactl": (195, 255),
        "/dev/nvidia-uvm": (sim.UVM_MAJOR, 0),
        "/dev/nvidia-uvm-tools": (sim.UVM_MAJOR, 1),
        "/dev/nvidia1": (195, 1),
        "/dev/nvidia2": (195, 2),
    }
    assert all(n["permissions"] == "rwm" and n["type"] == "c" for n in edits.device_nodes)
    assert f"{DEB}/libcuda.so.{VERSION}" in targets(edits)
    assert f"{DEB}/libnvidia-ml.so.{VERSION}" in targets(edits)
    assert "/usr/bin/nvidia-smi" in targets(edits)
    assert f"{DEB}/libnvidia-encode.so.{VERSION}" not in targets(edits)  # video not asked
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in targets(edits)
    for mount in edits.mounts:
        assert mount["options"] == ["ro", "nosuid", "nodev", "bind"]
        assert Path(mount["hostPath"]).is_file()
    assert (f"libcuda.so.{VERSION}", f"{DEB}/libcuda.so.1") in edits.links
    assert ("libcuda.so.1", f"{DEB}/libcuda.so") in edits.links
    assert edits.ldcache_folders == [DEB]
    assert edits.env == {
        "NVIDIA_VISIBLE_DEVICES": f"{picked[0].uuid},{picked[1].uuid}",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }


def test_video_brings_compute_libraries_and_uvm_but_not_compute_binaries(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices[:1], ("video",), Layout.of(debian=True))
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(nodes(edits))
    assert f"{DEB}/libcuda.so.{VERSION}" in targets(edits)
    assert f"{DEB}/libnvcuvid.so.{VERSION}" in targets(edits)
    assert "/usr/bin/nvidia-cuda-mps-control" not in targets(edits)
    assert "/dev/nvidia-modeset" not in nodes(edits)


def test_display_brings_modeset_and_graphics_libraries(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices[:1], ("display",), Layout.of(debian=True))
    assert "/dev/nvidia-modeset" in nodes(edits)
    assert "/dev/nvidia-uvm" not in nodes(edits)
    assert f"{DEB}/libGLX_nvidia.so.{VERSION}" in targets(edits)
    assert (f"libGLX_nvidia.so.{VERSION}", f"{DEB}/libGLX_indirect.so.0") in edits.links
    assert (f"libGLX_nvidia.so.{VERSION}", f"{DEB}/libGLX_nvidia.so.0") in edits.links


def test_none_gets_driver_files_and_control_nodes_but_no_gpu(driver: Driver) -> None:
    edits = container_edits(driver, (), ("utility",), Layout.of(debian=True))
    assert set(nodes(edits)) == {"/dev/nvidiactl"}
    assert "/usr/bin/nvidia-smi" in targets(edits)
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == "none"


def test_non_debian_rootfs_gets_lib64(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices, ("compute",), Layout.of(debian=False))
    assert f"/usr/lib64/libcuda.so.{VERSION}" in targets(edits)
    assert edits.ldcache_folders == ["/usr/lib64"]
    assert ("libcuda.so.1", "/usr/lib64/libcuda.so") in edits.links


def test_every_capability_is_canonical_in_the_env(driver: Driver) -> None:
    caps = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")
    edits = container_edits(driver, (), caps, Layout.of(debian=True))
    assert edits.env["NVIDIA_DRIVER_CAPABILITIES"] == "all"


def test_ldcache_arguments_round_trip(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices, ("compute",), Layout.of(debian=True))
    assert edits.ldcache_entries is not None
    assert (f"{DEB}/libcuda.so.1", 0x303) in edits.ldcache_entries
    parsed = parse_ldcache_args(ldcache_args(edits, "/sbin/ldconfig")[1:])
    assert parsed == (
        "/sbin/ldconfig",
        edits.ldcache_folders,
        edits.links,
        edits.ldcache_entries,
    )


def test_ldcache_arguments_without_entries_leave_the_cache_to_ldconfig(driver: Driver) -> None:
    """A spec written before gpuwire wrote caches itself has no --entry: ldconfig builds it."""
    edits = container_edits(driver, driver.devices, ("compute",), Layout.of(debian=True))
    args = [a for a in ldcache_args(edits, "/sbin/ldconfig")[1:] if not a.startswith("0x")]
    assert "--entry" in args
    _, folders, _, entries = parse_ldcache_args([a for a in args if a != "--entry"])
    assert (folders, entries) == ([DEB], None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--folder", "relative/dir", "--ldconfig", "/sbin/ldconfig"], "bad argument --folder"),
        (["--link", "a::b", "--ldconfig", "/sbin/ldconfig"], "bad argument --link"),
        (["--entry", "771::/lib/libx.so.1", "--ldconfig", "/x"], "bad argument --entry"),
        (["--entry", "0x303::lib/libx.so.1", "--ldconfig", "/x"], "bad argument --entry"),
        (["--entry", "0xzz::/lib/libx.so.1", "--ldconfig", "/x"], "bad argument --entry"),
        (["--ldconfig"], "--ldconfig needs a value"),
        (["--folder", "/x"], "--ldconfig must name the host's ldconfig by absolute path"),
        (["--ldconfig", "ldconfig"], "absolute path"),
    ],
)
def test_ldcache_arguments_refuse_what_they_do_not_understand(
    args: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ldcache_args(args)


def test_every_hook_has_an_explicit_environment(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices, ("compute",), Layout.of(debian=True))
    (hook,) = hooks(edits, "/usr/bin/gpuwire-hook", "/sbin/ldconfig")
    assert hook["hookName"] == "createRuntime"  # runtime namespaces: the resident serves it
    assert hook["env"] == list(HOOK_ENV)
    assert hook["args"][:2] == ["gpuwire-hook", "ldcache"]


def test_cdi_rendering_has_cdi_field_names(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices[:1], ("utility",), Layout.of(debian=True))
    cdi = to_cdi(edits, "/usr/bin/gpuwire-hook", "/sbin/ldconfig")
    assert set(cdi) == {"env", "deviceNodes", "mounts", "hooks"}
    assert "NVIDIA_VISIBLE_DEVICES=" + driver.devices[0].uuid in cdi["env"]
    assert {"path", "hostPath", "major", "minor", "permissions"} <= set(cdi["deviceNodes"][0])
    assert {"hostPath", "containerPath", "options"} <= set(cdi["mounts"][0])


def test_apply_puts_edits_into_a_spec_without_touching_the_input(driver: Driver) -> None:
    edits = container_edits(driver, driver.devices[:1], ("compute",), Layout.of(debian=True))
    spec = container_spec(["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=0", "KEEP=1"])
    spec["linux"] = {
        "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}],
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    }
    original = copy.deepcopy(spec)
    out = ocispec.apply(spec, edits)
    assert spec == original
    env = out["process"]["env"]
    assert [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == [
        f"NVIDIA_VISIBLE_DEVICES={driver.devices[0].uuid}"
    ]
    assert "KEEP=1" in env
    devices = {d["path"]: (d["major"], d["minor"]) for d in out["linux"]["devices"]}
    assert devices["/dev/nvidia0"] == (195, 0)  # the spec's stale entry replaced
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # runc's deny-all stays first
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in rules
    lib = next(m for m in out["mounts"] if m["destination"].endswith(f"libcuda.so.{VERSION}"))
    assert lib["type"] == "bind"
    assert {"ro", "nosuid", "nodev"} <= set(lib["options"])
    assert "hooks" not in out  # the shim makes links and ld cache itself: no hook to run


def test_apply_is_idempotent(driver: Driver) -> None:
    """The same edits again (an engine applied them from a CDI spec, then the shim): no
    device node, allow rule or mount twice; the env set once."""
    edits = container_edits(driver, driver.devices[:2], ("compute",), Layout.of(debian=True))
    once = ocispec.apply(container_spec(), edits)
    assert ocispec.apply(once, edits) == once
    assert len(once["mounts"]) == len(edits.mounts)
    assert len(once["linux"]["resources"]["devices"]) == len(edits.device_nodes)
