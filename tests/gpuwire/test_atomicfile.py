"""Files replaced whole: the mode asked for, and nothing left behind by a failed write."""

from __future__ import annotations

import os
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
    (tmp_path / f".record.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):  # ELOOP
        atomicfile.replace(str(tmp_path / "record"), b"data", 0o600)
    assert victim.read_text() == "untouched"
