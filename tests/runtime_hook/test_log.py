"""The decision log: one line per GPU container, never a reason for a failed start."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_hook.start import log


def test_one_line_appended_per_event(tmp_path: Path) -> None:
    path = tmp_path / "gpuwire.log"
    log.write(str(path), "gpuwire-hook", "ctr-1", "team-a/trainer: no GPU: because")
    log.write(str(path), "gpuwire-runtime", "ctr-2", "team-a/x: GPUs 0 (GPU-a)")
    first, second = path.read_text().splitlines()
    assert first.endswith(" gpuwire-hook ctr-1: team-a/trainer: no GPU: because")
    assert second.endswith(" gpuwire-runtime ctr-2: team-a/x: GPUs 0 (GPU-a)")
    assert first[:4].isdigit()
    assert first[19] == "Z"


def test_unwritable_log_goes_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log.write(str(tmp_path / "missing-dir" / "gpuwire.log"), "gpuwire-hook", "ctr", "why")
    err = capsys.readouterr().err
    assert "gpuwire-hook ctr: why (cannot write " in err
    assert "No such file or directory" in err
