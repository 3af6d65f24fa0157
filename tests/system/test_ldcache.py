"""The ld cache in real containers: the host's loader finds the driver through the cache
gpuwire writes, and a container started by the shim or the prestart hook under runc has
ldconfig's entries (the cache format itself: tests/runtime_hook/test_ldcache.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwire import sim
from runtime_hook.injection import ldcache
from testbed.lab import Lab
from testbed.view import view
from tests.conftest import requires_binary, requires_root
from tests.runtime_hook.test_ldcache import (
    CAPABILITIES,
    DEB,
    NODES,
    debian,
    driver_edits,
    generator,
    inject,
    ldconfig,
    lib,
    listing,
    make,
    put,
    reference,
    watched_opens,
    with_32bit_libraries,
)
from tests.system.test_runc import DELIVERIES, granted_env, make_bundle, run
from tests.system.test_security import OLD_FORMAT_CACHE

pytestmark = requires_binary("ldconfig")


@requires_root()  # chroot
def test_the_loader_finds_the_drivers_libraries_through_the_cache(
    tmp_path: Path, sim_node: tuple[Path, sim.Machine]
) -> None:
    """The host's ld.so, in the image's root, resolves libcuda.so.1 and libnvidia-ml.so.1
    to the driver's: the image's cache lists copies of both in other directories, which
    the loader would take if gpuwire's entries were missing or out of order."""
    root = tmp_path / "rootfs"
    edits = driver_edits(with_32bit_libraries(sim_node[0]), debian(root))
    inject(root, edits)
    assert make(root, edits)
    loader = "/lib64/ld-linux-x86-64.so.2"
    put(root, loader, Path(loader).read_bytes())
    os.chmod(root / loader.lstrip("/"), 0o755)
    lib(root, "/probe.so", "libprobe.so", needed=("libcuda.so.1", "libnvidia-ml.so.1"))
    out = subprocess.run(
        [str(shutil.which("chroot")), str(root), loader, "--list", "/probe.so"],
        capture_output=True,
        text=True,
        check=True,
        env={},
    ).stdout
    resolved = dict(line.split()[:3:2] for line in out.splitlines() if " => " in line)
    assert resolved == {
        "libcuda.so.1": f"{DEB}/libcuda.so.1",
        "libnvidia-ml.so.1": f"{DEB}/libnvidia-ml.so.1",
    }


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it
    return lab


def image_libraries(rootfs: Path) -> None:
    """An image's own libraries and the cache its build made."""
    lib(rootfs, "/usr/local/lib/libcuda.so.1", "libcuda.so.1")
    lib(rootfs, f"{DEB}/libz.so.1", "libz.so.1")
    put(rootfs, "/etc/ld.so.conf", b"/usr/local/lib\n")
    ldconfig(rootfs)


@requires_root()
@requires_binary("runc")
@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_started_container_has_ldconfigs_entries(lab: Lab, delivery: str) -> None:
    env = granted_env(lab, "0", ",".join(CAPABILITIES))
    bundle = make_bundle(lab, env, delivery=delivery)
    rootfs = bundle.path / "rootfs"
    image_libraries(rootfs)
    edits = driver_edits(with_32bit_libraries(lab.node), debian=True)
    copy = lab.root / "reference"  # the same files, the libraries copied where runc mounts them
    shutil.copytree(rootfs, copy, symlinks=True)
    inject(copy, edits)
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["ldcache"] == ["libcuda.so.1"]
    written = (rootfs / "etc/ld.so.cache").read_bytes()
    assert written.endswith(ldcache.GENERATOR)  # gpuwire wrote it: no ldconfig ran
    assert listing(written) == listing(reference(copy, edits.ldcache_folders))


@requires_root()
@requires_binary("runc")
@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_cache_in_a_format_gpuwire_does_not_write_is_rebuilt_by_ldconfig(
    lab: Lab, delivery: str
) -> None:
    """The host's ldconfig, confined: among what it cannot do is open a device node the
    image put where it reads (its root is nodev)."""
    bundle = make_bundle(lab, granted_env(lab, "0"), delivery=delivery)
    cache = bundle.path / "rootfs/etc/ld.so.cache"
    cache.write_bytes(OLD_FORMAT_CACHE)
    conf = bundle.path / "rootfs/etc/ld.so.conf"
    NODES["a character device"](conf)
    with watched_opens(conf) as opened:
        out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["ldcache"] == ["libcuda.so.1"]
    assert generator(cache.read_bytes()).startswith(b"ldconfig (")  # the host's ran
    assert not opened()
