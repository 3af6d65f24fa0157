"""Paths inside a container root: links resolve as the container sees them, never outside."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpuwire import resolve
from runtime_hook.injection import inject, inroot
from runtime_hook.injection.inroot import Journal
from runtime_hook.start import spec as ocispec


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "usr/lib").mkdir(parents=True)
    return root


def made(rootfs: Path, path: str) -> tuple[int, Journal]:
    journal = Journal()
    root_fd = journal.keep(resolve.open_root(str(rootfs)))
    return inroot.make_dirs(root_fd, path, journal), journal


def real(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.parametrize(
    "link",
    ["/elsewhere/lib", "../../elsewhere/lib", "../../../../../../../elsewhere/lib"],
)
def test_dangling_links_are_followed_inside_the_root(
    rootfs: Path, tmp_path: Path, link: str
) -> None:
    """The image's `usr/lib/x86_64-linux-gnu -> <link>` is created where the container sees it."""
    (tmp_path / "elsewhere").mkdir()  # a host directory a naive resolution would use
    (rootfs / "usr/lib/x86_64-linux-gnu").symlink_to(link)
    fd, journal = made(rootfs, "/usr/lib/x86_64-linux-gnu")
    assert real(fd) == str(rootfs / "elsewhere/lib")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert journal.undo() == []
    journal.close()
    assert not (rootfs / "elsewhere").exists()  # undo removed what it created


def test_link_loops_end_in_an_error(rootfs: Path) -> None:
    (rootfs / "a").symlink_to("b")
    (rootfs / "b").symlink_to("a")
    with pytest.raises(OSError, match="symbolic links") as err:
        made(rootfs, "/a/x")
    assert err.value.errno == errno.ELOOP


def test_a_file_in_the_way_is_an_error(rootfs: Path) -> None:
    (rootfs / "etc").write_text("not a dir")
    with pytest.raises(NotADirectoryError):
        made(rootfs, "/etc")


def test_mount_targets_refuse_links_and_directories(rootfs: Path, tmp_path: Path) -> None:
    host_file = tmp_path / "host-file"
    host_file.write_text("host")
    (rootfs / "usr/lib/libx.so").symlink_to(host_file)
    (rootfs / "usr/lib/dir.so").mkdir()
    dir_fd, journal = made(rootfs, "/usr/lib")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        inroot.mount_target(dir_fd, "libx.so", journal)
    with pytest.raises(OSError, match="something other than a file"):
        inroot.mount_target(dir_fd, "dir.so", journal)
    inroot.mount_target(dir_fd, "new.so", journal)
    assert (rootfs / "usr/lib/new.so").is_file()
    journal.undo()
    assert not (rootfs / "usr/lib/new.so").exists()
    assert host_file.read_text() == "host"


def test_symlinks_replace_the_images_links_and_restore_them_on_undo(rootfs: Path) -> None:
    lib = rootfs / "usr/lib"
    (lib / "libcuda.so.1").symlink_to("libcuda.so.1.image")
    (lib / "libcuda.so").write_text("the image's own file")
    dir_fd, journal = made(rootfs, "/usr/lib")
    inroot.make_symlink(dir_fd, "libcuda.so.1", "libcuda.so.550", journal)
    inroot.make_symlink(dir_fd, "libcuda.so", "libcuda.so.1", journal)
    inroot.make_symlink(dir_fd, "libnew.so.1", "libnew.so.550", journal)
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.550"
    assert (lib / "libcuda.so").read_text() == "the image's own file"  # left alone
    journal.undo()
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.1.image"
    assert not (lib / "libnew.so.1").is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
def test_device_nodes_keep_an_identical_one_and_refuse_a_different_one(rootfs: Path) -> None:
    (rootfs / "dev").mkdir()
    os.mknod(rootfs / "dev/nvidia0", 0o666 | 0o020000, os.makedev(195, 0))
    os.mknod(rootfs / "dev/nvidia1", 0o666 | 0o020000, os.makedev(1, 3))
    dev_fd, journal = made(rootfs, "/dev")
    inroot.make_char_device(dev_fd, "nvidia0", 195, 0, journal)
    with pytest.raises(OSError, match="is not device 195:1"):
        inroot.make_char_device(dev_fd, "nvidia1", 195, 1, journal)
    inroot.make_char_device(dev_fd, "nvidiactl", 195, 255, journal)
    assert os.stat(rootfs / "dev/nvidiactl").st_rdev == os.makedev(195, 255)
    journal.undo()
    assert not (rootfs / "dev/nvidiactl").exists()
    assert (rootfs / "dev/nvidia0").exists()  # it was there before


def test_a_limits_mount_is_refused_where_runc_would_pass_a_link_of_the_pods(
    rootfs: Path, tmp_path: Path
) -> None:
    """runc reaches a mount's destination through the spec's earlier mounts: a link in a
    volume over HAMi-core's path (the pod's files, as the image's are) is refused, naming the
    volume; under a new filesystem (runc's /dev tmpfs) only the way to its mount point
    counts; a mount at the path itself (a claim's, the engine's) is reached through what lies
    under it. Before: anything under a mount of the spec's was not checked."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "vgpu").symlink_to("/tmp")
    (rootfs / "etc").mkdir()
    (rootfs / "etc/ld.so.preload").symlink_to("/elsewhere")
    spec = {
        "mounts": [
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "dev/shm", "type": "bind", "source": "/x", "options": ["rbind"]},
            {"destination": "/usr/local", "type": "none", "source": str(volume),
             "options": ["rbind", "rw"]},
            {"destination": "/etc/ld.so.preload", "type": "bind", "source": "/p"},
        ]
    }  # fmt: skip
    library, preload = "/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"
    passed = ocispec.passed_through(spec, [library, "/dev/shm", preload])
    assert passed == [
        (str(volume), "/vgpu/libvgpu.so", "/usr/local"),
        (None, "/usr/local", ""),
        (None, "/dev", ""),
        (None, preload, ""),
    ]
    with pytest.raises(inject.InjectionError) as caught:
        inject.refuse_links(str(rootfs), passed[:2])
    assert str(caught.value) == (
        "cannot mount over '/usr/local/vgpu/libvgpu.so': the volume at /usr/local has a link "
        "on the way there, which the container could take away, and what is mounted with it"
    )
    inject.refuse_links(str(rootfs), passed[2:3])  # the image's /dev: not there, made by runc
    with pytest.raises(inject.InjectionError, match=r"preload': the image has a link"):
        inject.refuse_links(str(rootfs), passed[3:])
