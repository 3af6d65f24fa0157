"""The shim's argument handling, as containerd and NVIDIA's runtime call and parse it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hook.injection import cgroup, ldcache
from runtime_hook.start import shim
from testbed.lab import Lab, container_spec, grant_for
from testbed.rootfs import busybox_rootfs
from tests.conftest import requires_root

SHIM = str(Path(sys.executable).parent / "gpuwire-runtime")


@pytest.mark.parametrize(
    ("args", "create", "bundle"),
    [
        (["--root", "/run/r", "create", "--bundle", "/b", "id"], True, "/b"),
        (["create", "--bundle=/b", "id"], True, "/b"),
        (["create", "-b", "/b", "id"], True, "/b"),
        (["-bundle", "/b", "run", "id"], True, "/b"),
        (["start", "id"], False, None),
        (["delete", "--bundle", "create", "id"], False, "create"),  # a bundle named create
        (["state", "create"], True, None),  # NVIDIA's rule: only the bundle value is exempt
    ],
)
def test_create_and_bundle_are_found_like_nvidias_runtime(
    args: list[str], create: bool, bundle: str | None
) -> None:
    assert shim.is_create(args) is create
    assert shim.flag_value(args, shim.BUNDLE_FLAGS) == bundle


def test_every_other_subcommand_execs_the_runtime_untouched(tmp_path: Path) -> None:
    """`runc --version` through the shim: argv passes through, output is runc's own."""
    config = tmp_path / "c.toml"
    config.write_text('runtime = "runc"\n')
    direct = subprocess.run(["runc", "--version"], capture_output=True, text=True)
    via = subprocess.run(
        [SHIM, "--version"],
        capture_output=True,
        text=True,
        env={"GPUWIRE_CONFIG": str(config), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert via.returncode == direct.returncode == 0
    assert via.stdout == direct.stdout


def test_broken_config_does_not_block_delete(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('trust = "sometimes"\n')
    env = {"GPUWIRE_CONFIG": str(config), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    out = subprocess.run([SHIM, "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0
    assert "trust = 'sometimes' is not accepted" in out.stderr
    created = subprocess.run(
        [SHIM, "create", "--bundle", str(tmp_path), "x"], capture_output=True, text=True, env=env
    )
    assert created.returncode == 1  # ... but a create with a broken config fails
    assert "gpuwire-runtime: " in created.stderr


def test_the_shim_never_execs_itself(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="is gpuwire-runtime itself"):
        shim.runtime_path(SHIM)
    with pytest.raises(RuntimeError, match="not found"):
        shim.runtime_path("no-such-runtime-gpuwire")


def test_cgroup_v1_path_from_proc_and_mountinfo() -> None:
    proc = "12:pids:/ctr\n5:devices:/ctr-1\n0::/ctr\n"
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert cgroup.devices_path(proc) == "/ctr-1"
    assert cgroup.devices_mount(mountinfo) == ("/sys/fs/cgroup/devices", "/")


def test_magic_mounts_are_found_under_the_rootfs_only() -> None:
    mountinfo = (
        "40 30 0:5 / /proc rw - proc proc rw\n"
        "41 30 0:6 / /b/rootfs/proc rw - proc proc rw\n"
        "42 30 0:7 / /b/rootfs/sys rw - sysfs sysfs rw\n"
        "43 30 0:8 / /b/rootfs/dev rw - tmpfs tmpfs rw\n"
        "44 30 0:5 / /b/rootfs/proc/sys/x\\040y rw - proc proc rw\n"
        "45 30 0:5 / /b/rootfs2/proc rw - proc proc rw\n"
    )
    assert ldcache.magic_mounts(mountinfo, "/b/rootfs") == [
        "/b/rootfs/proc/sys/x y",
        "/b/rootfs/proc",
        "/b/rootfs/sys",
    ]


HEAVY = ("ctypes", "_hashlib", "json", "re", "typing", "dataclasses", "enum", "tomllib")


@requires_root()  # a granted start makes links and ld cache in the rootfs
@pytest.mark.parametrize(
    ("env", "logged"),
    [
        ({}, None),  # no GPU asked for: left alone
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, "no GPU"),  # refused
        ({"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": "granted"}, "GPUs 0"),  # injected
    ],
)
def test_container_start_imports_stay_light(
    tmp_path: Path, env: dict[str, str], logged: str | None
) -> None:
    """What the shim imports to decide and edit a bundle (the config cached, as on a node):
    `python -X importtime` shows each of HEAVY costing milliseconds on every start."""
    lab = Lab(tmp_path / "lab")
    if env.get("GPUWIRE_GRANT"):
        env = {**env, "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    bundle = tmp_path / "bundle"
    busybox_rootfs(bundle / "rootfs")
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r});"
        "from runtime_hook.start import config, shim;"
        f"shim.edit_bundle({str(bundle)!r}, 'x', config.load());"
        f"print(sorted(set({HEAVY!r}) & set(sys.modules)))"
    )
    for _ in range(2):  # the first run parses the config with tomllib and caches it
        (bundle / "config.json").write_text(json.dumps(container_spec(env)))
        out = subprocess.run(
            [sys.executable, "-IS", "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"GPUWIRE_CONFIG": str(lab.config)},
        )
    assert out.stdout.strip() == "[]"
    decisions = [line.split(": ", 2)[2] for line in lab.log_lines()[1:]]  # the second run's
    if logged is None:
        assert decisions == []
    else:
        assert [d[: len(logged)] for d in decisions] == [logged]
