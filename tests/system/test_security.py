"""The rootfs and the image env are hostile: nothing gpuwire does as root may follow them out.

Each test builds the attack into a real runc bundle and checks what would show a bug: a
file created, changed or mounted over outside the rootfs, code from the image run by a
hook, or leftovers after a failed start.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuwire.cdi import hook_program, to_cdi
from gpuwire.driver import discover
from gpuwire.edits import Layout, container_edits
from gpuwire.roots import Roots
from runtime_hook.injection import cgroup, ldcache
from runtime_hook.injection.cgroup import CgroupError
from runtime_hook.setup import launcher
from runtime_hook.start import spec as ocispec
from testbed.lab import Lab, served_launchers
from testbed.rootfs import Bundle
from testbed.view import view
from tests.conftest import requires_binary, requires_root
from tests.runtime_hook.test_ldcache import NODES, watched_opens
from tests.system.test_runc import DELIVERIES, HOOK, granted_env, make_bundle, run

pytestmark = [requires_root(), requires_binary("runc")]


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))
    return lab


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every path under `root`: (type, size, link target) — what a stray write would change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            kind = "l" if path.is_symlink() else "d" if path.is_dir() else "f"
            target = os.readlink(path) if kind == "l" else ""
            out[str(path.relative_to(root))] = (kind, st.st_size if kind == "f" else 0, target)
    return out


def host_mounts(scope: Path) -> set[str]:
    """Host mounts at or under `scope`: the test's own tree, where any escape would land.
    (The rest of the host's table changes with whatever else runs on the machine.)"""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        root, mountpoint = line.split()[3:5]
        if mountpoint == str(scope) or mountpoint.startswith(f"{scope}/"):
            found.add(f"{root} {mountpoint}")
    return found


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A host directory an attacker would like gpuwire to write into."""
    victim = tmp_path / "host-victim"
    victim.mkdir()
    (victim / "sentinel").write_text("host data\n")
    return victim


def swap_for_link(rootfs: Path, inside: str, target: str) -> None:
    path = rootfs / inside
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.symlink_to(target)


ATTACKS = {
    "absolute": lambda victim: str(victim),
    "dotdot": lambda victim: "../" * 12 + str(victim).lstrip("/"),
}


@pytest.mark.parametrize("delivery", DELIVERIES)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("inside", ["usr/lib/x86_64-linux-gnu", "usr/bin", "etc"])
def test_symlinked_rootfs_dirs_never_reach_the_host(
    lab: Lab, host_dir: Path, delivery: str, attack: str, inside: str
) -> None:
    bundle = make_bundle(lab, granted_env(lab, "0"), delivery=delivery)
    swap_for_link(bundle.path / "rootfs", inside, ATTACKS[attack](host_dir))
    before, mounts, node = snapshot(host_dir), host_mounts(lab.root.parent), snapshot(lab.node)
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    assert snapshot(host_dir) == before
    assert host_mounts(lab.root.parent) == mounts
    assert snapshot(lab.node) == node
    seen = view(out.stdout)  # inside, the link resolves in the rootfs, and works
    assert seen["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(0)})"]
    assert (bundle.path / "rootfs" / str(host_dir).lstrip("/")).is_dir()


# runc 1.1.5 itself writes its /dev symlinks (fd, ptmx, stdin, ...) through a symlinked
# /dev into the host directory, with or without gpuwire; only those may appear there.
RUNC_DEV_LINKS = {"fd", "ptmx", "stdin", "stdout", "stderr"}


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_symlinked_dev_never_reaches_the_host(lab: Lab, host_dir: Path, delivery: str) -> None:
    bundle = make_bundle(lab, granted_env(lab, "2"), delivery=delivery)
    swap_for_link(bundle.path / "rootfs", "dev", str(host_dir))
    before, mounts = snapshot(host_dir), host_mounts(lab.root.parent)
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    after = snapshot(host_dir)
    assert set(after) - set(before) <= RUNC_DEV_LINKS
    assert all(after[name][0] == "l" for name in set(after) - set(before))
    assert host_mounts(lab.root.parent) == mounts
    seen = view(out.stdout)  # the nodes went to the container's /dev, inside the rootfs
    assert seen["devices"] == ["nvidia-uvm nvidia-uvm-tools nvidia2 nvidiactl"]
    assert seen["open /dev/nvidia2"] == [
        "cat: can't open '/dev/nvidia2': No such device or address"
    ]


def cdi_hook_bundle(lab: Lab, env: dict[str, str], program: str = HOOK) -> Bundle:
    """A bundle as a CDI engine writes it from gpuwire's spec: devices, mounts and the
    `gpuwire-hook ldcache` createRuntime hook (`cdi.to_cdi`, running `program`), for plain
    runc."""
    bundle = make_bundle(lab, env, delivery="cdi")
    driver = discover(Roots(str(lab.node)), ("compute", "utility"))
    edits = container_edits(
        driver, driver.devices[:1], ("compute", "utility"), Layout.of(debian=True)
    )
    bundle.spec = ocispec.apply(bundle.spec, edits)
    (hook,) = to_cdi(edits, program, "/sbin/ldconfig")["hooks"]
    bundle.spec["hooks"] = {hook["hookName"]: [{k: v for k, v in hook.items() if k != "hookName"}]}
    bundle.save()
    return bundle


@pytest.mark.parametrize("delivery", ["shim", "cdi"])
def test_image_env_never_reaches_what_gpuwire_runs(lab: Lab, tmp_path: Path, delivery: str) -> None:
    """runc < 1.3 hands the image env to createContainer hooks without an env of their own
    (CVE-2025-23266). The CDI ld-cache hook is Python: PYTHONPATH would run the image's
    code. The shim runs no hook; its ldconfig runs with an empty env."""
    marker = tmp_path / "pwned"
    evil = lab.root / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    env = granted_env(lab, "0") | {
        "PYTHONPATH": str(evil),
        "LD_PRELOAD": str(evil / "preload.so"),
        "PYTHONHOME": "/nonexistent",
    }
    if delivery == "shim":
        out = run(make_bundle(lab, env, delivery="shim"), "shim")
    else:
        out = cdi_hook_bundle(lab, env).run()
    assert out.returncode == 0, out.stderr
    assert not marker.exists()
    assert view(out.stdout)["ldcache"] == ["libcuda.so.1"]  # the cache was made, unaffected


@pytest.mark.parametrize("cache", ["gpuwire's", "ldconfig's"])
@pytest.mark.parametrize("resident", ["down", "serving"])
def test_the_cdi_hook_runs_gpuwire_call_itself_served_or_not(
    lab: Lab, tmp_path: Path, resident: str, cache: str
) -> None:
    """The spec's hook is gpuwire-call, no shell launcher in front. It writes the links and
    cache itself (runtime_hook/setup/ldcache.c); where it declines (an image cache in a
    format only ldconfig writes), the Python hook does it, with the OCI state handed on: run
    by gpuwire-call where no resident is on its socket, or served, needing no Python of its
    own (its fallback does not exist). The image's env reaches none of them."""
    if resident == "down":
        launcher.install(str(tmp_path / "libexec"), socket=str(tmp_path / "nobody.sock"))
        libexec = tmp_path / "libexec"
    else:
        libexec = served_launchers()
    program = hook_program(str(libexec / launcher.HOOK))
    assert program == str(libexec / launcher.CALL)
    marker = tmp_path / "pwned"
    evil = lab.root / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    env = granted_env(lab, "0") | {"PYTHONPATH": str(evil), "LD_PRELOAD": str(evil / "x.so")}
    bundle = cdi_hook_bundle(lab, env, program)
    if cache == "ldconfig's":
        (bundle.path / "rootfs/etc/ld.so.cache").write_bytes(OLD_FORMAT_CACHE)
    out = bundle.run()
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["ldcache"] == ["libcuda.so.1"]
    written = (bundle.path / "rootfs/etc/ld.so.cache").read_bytes()
    assert written.endswith(ldcache.GENERATOR) == (cache == "gpuwire's")
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["a character device", "a FIFO"])
@pytest.mark.parametrize("delivery", ["prestart", "shim", "shim-resident", "cdi"])
def test_a_device_or_fifo_for_the_ld_cache_is_refused_unopened(
    lab: Lab, delivery: str, kind: str
) -> None:
    """The image's /etc/ld.so.cache is a device node (a watchdog's open starts its countdown)
    or a FIFO (whose open waits): every delivery reads the cache as host root, outside the
    container's device cgroup, and refuses it by its type without opening it. CDI: the
    spec's hook is gpuwire-call, whose C declines it to the served Python, which refuses."""
    if delivery == "cdi":
        bundle = cdi_hook_bundle(
            lab, granted_env(lab, "0"), hook_program(str(served_launchers() / launcher.HOOK))
        )
    else:
        bundle = make_bundle(lab, granted_env(lab, "0"), delivery=delivery)
    cache = bundle.path / "rootfs/etc/ld.so.cache"
    NODES[kind](cache)
    with watched_opens(cache) as opened:
        out = bundle.run() if delivery == "cdi" else run(bundle, delivery)
    assert not opened()
    assert out.returncode != 0
    assert f"/etc/ld.so.cache in the container is {kind}, not a regular file" in out.stderr


def test_failed_injection_leaves_nothing_behind(lab: Lab) -> None:
    """A failure late in the prestart hook undoes nodes, mounts and files already made."""
    bundle = make_bundle(lab, granted_env(lab, "0,1"), delivery="prestart")
    rootfs = bundle.path / "rootfs"
    (rootfs / "usr/bin/nvidia-smi").mkdir(parents=True)  # binaries are mounted after libs
    before, mounts, node = snapshot(rootfs), host_mounts(lab.root.parent), snapshot(lab.node)
    out = run(bundle, "prestart")
    assert out.returncode != 0
    assert "cannot mount over 'nvidia-smi'" in out.stderr
    assert snapshot(rootfs) == before
    assert host_mounts(lab.root.parent) == mounts
    assert snapshot(lab.node) == node
    assert "injection failed: cannot mount over 'nvidia-smi'" in lab.log_lines()[-1]


OLD_FORMAT_CACHE = b"ld.so-1.7.0\0" + bytes(4)  # libc5's format: left to ldconfig


def test_failed_ld_cache_fails_the_create_and_leaves_the_bundle_as_it_was(lab: Lab) -> None:
    """The shim makes links and ld cache before runc: a failure there (late: after the
    links and mount points are made) undoes them and leaves config.json unedited."""
    lab.configure(ldconfig="/bin/busybox")  # static, but exits 127 as "ldconfig": fails late
    bundle = make_bundle(lab, granted_env(lab, "0"), delivery="shim")
    (bundle.path / "rootfs/etc/ld.so.cache").write_bytes(OLD_FORMAT_CACHE)
    before, spec = snapshot(bundle.path), (bundle.path / "config.json").read_text()
    mounts, node = host_mounts(lab.root.parent), snapshot(lab.node)
    out = run(bundle, "shim")
    assert out.returncode != 0
    assert "gpuwire-runtime: ldconfig in" in out.stderr
    assert snapshot(bundle.path) == before
    assert (bundle.path / "config.json").read_text() == spec
    assert host_mounts(lab.root.parent) == mounts
    assert snapshot(lab.node) == node
    assert "injection failed: ldconfig in" in lab.log_lines()[-1]


def test_dynamic_ldconfig_is_refused_before_anything_runs(lab: Lab) -> None:
    lab.configure(ldconfig="/bin/ls")  # a dynamic binary would load the container's ld.so
    bundle = make_bundle(lab, granted_env(lab, "0"), delivery="prestart")
    before = snapshot(bundle.path / "rootfs")
    out = run(bundle, "prestart")
    assert out.returncode != 0
    assert "ldconfig /bin/ls is dynamically linked" in out.stderr
    assert snapshot(bundle.path / "rootfs") == before


def test_cgroup_v2_device_control_is_refused_not_faked() -> None:
    assert cgroup.devices_path("0::/kubepods/pod1/ctr\n") is None
    assert cgroup.devices_path("5:devices:/ctr\n0::/ctr\n") == "/ctr"
    with pytest.raises(CgroupError, match="Use the gpuwire-runtime shim"):
        raise CgroupError(cgroup.V2_REFUSAL)
