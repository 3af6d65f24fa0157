"""The lab runs real containers: a busybox rootfs under runc, as the injection tests need."""

from __future__ import annotations

from pathlib import Path

from testbed.rootfs import busybox_rootfs


def test_busybox_rootfs_layouts(tmp_path: Path) -> None:
    deb = busybox_rootfs(tmp_path / "deb")
    assert (deb / "bin/sh").resolve() == (deb / "bin/busybox").resolve()
    assert (deb / "usr/lib/x86_64-linux-gnu").is_dir()
    assert (deb / "etc/debian_version").exists()
    rhel = busybox_rootfs(tmp_path / "rhel", debian=False)
    assert (rhel / "usr/lib64").is_dir()
    assert not (rhel / "etc/debian_version").exists()
