"""Files replaced whole: the mode asked for, and nothing left behind by a failed write."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuwire import atomicfile


def test_replaces_the_file_with_the_mode_asked_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "record"
    path.write_text("old")
    old_umask = os.umask(0o077)
    try:
        atomicfile.replace(str(path), b"new", 0o755)
    finally:
        os.umask(old_umask)
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o7777 == 0o755
    assert os.listdir(tmp_path) == ["record"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()  # a rename over a directory fails after the write
    with pytest.raises(IsADirectoryError):
        atomicfile.replace(str(tmp_path / "target"), b"data", 0o644)
    assert os.listdir(tmp_path) == ["target"]
    assert (tmp_path / "target").is_dir()


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / f".record.{os.getpid()}.{threading.get_ident()}.tmp").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):  # ELOOP
        atomicfile.replace(str(tmp_path / "record"), b"data", 0o600)
    assert victim.read_text() == "untouched"


def test_the_data_reaches_the_disk_before_the_rename_and_the_rename_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes it crash-safe, in the order a power cut needs (a rename of a file whose
    data is not on the disk yet can leave an empty file; a rename not synced, the old one)."""
    calls: list[str] = []
    sync, rename = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        sync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append("rename")
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomicfile.replace(str(tmp_path / "checkpoint.json"), b"{}", 0o600)
    assert calls == [
        f"fsync .checkpoint.json.{os.getpid()}.{threading.get_ident()}.tmp",
        "rename",
        f"fsync {tmp_path.name}",
    ]
    calls.clear()
    atomicfile.replace(str(tmp_path / "spec.json"), b"{}", 0o644, entry=False)
    assert calls == [  # whole or absent after a crash: its caller finds it missing
        f"fsync .spec.json.{os.getpid()}.{threading.get_ident()}.tmp",
        "rename",
    ]
    calls.clear()
    atomicfile.replace(str(tmp_path / "config.json"), b"{}", 0o600, durable=False)
    assert calls == ["rename"]  # a container's own files: they go with it in a crash


def test_two_threads_replacing_one_file_at_once_both_succeed(tmp_path: Path) -> None:
    """As the node agent's MIG-change handler and its periodic rewrite may write the MIG map
    at the same moment: a temporary file per process alone had one rename the other's away."""
    path = str(tmp_path / "mig.json")
    failed: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(300):
                atomicfile.replace(path, data, 0o644, durable=False)
        except OSError as exc:
            failed.append(exc)

    threads = [threading.Thread(target=write, args=(b"%d" % i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    assert sorted(os.listdir(tmp_path)) == ["mig.json"]
