"""The lab runs real containers: a busybox rootfs under runc, as the injection tests need."""

from __future__ import annotations

from pathlib import Path

from gpuwire.lab.rootfs import Bundle, busybox_rootfs
from tests.conftest import requires_binary, requires_root


def test_busybox_rootfs_layouts(tmp_path: Path) -> None:
    deb = busybox_rootfs(tmp_path / "deb")
    assert (deb / "bin/sh").resolve() == (deb / "bin/busybox").resolve()
    assert (deb / "usr/lib/x86_64-linux-gnu").is_dir()
    assert (deb / "etc/debian_version").exists()
    rhel = busybox_rootfs(tmp_path / "rhel", debian=False)
    assert (rhel / "usr/lib64").is_dir()
    assert not (rhel / "etc/debian_version").exists()


@requires_root()
@requires_binary("runc")
def test_runc_runs_a_bundle(tmp_path: Path) -> None:
    bundle = Bundle.create(tmp_path / "b", ["sh", "-c", "echo hello $WHO; ls /dev"], {"WHO": "gpu"})
    out = bundle.run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello gpu\n")
    assert "nvidia0" not in out.stdout
