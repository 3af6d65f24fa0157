"""The DRA plugin's checkpoint: every prepared claim survives a restart exactly; an unreadable
checkpoint stops the plugin with the reason rather than forget (and leak) its claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.dra import checkpoint
from deviceplugin.dra.checkpoint import PreparedClaim, PreparedDevice
from deviceplugin.statefile import StateError

CLAIM = PreparedClaim(
    "team-a",
    "trainer-gpu",
    "6f0d0f8e-8a57-4a5f-8d0a-4c5bbf3b7f21",
    (
        PreparedDevice(("gpu",), "node-1", "gpu-0", ("k8s.gpu.gpuwire.io/claim=6f0d-gpu-0",)),
        PreparedDevice(
            ("shared",),
            "node-1",
            "gpu-1",
            ("k8s.gpu.gpuwire.io/claim=6f0d-gpu-1",),
            "1e0b3e4c-6d6a-4a59-9bb2-3f1c1a8f0c55",
        ),
    ),
    ("/var/run/cdi/k8s.gpu.gpuwire.io-claim_6f0d.json",),
    ("GPU-a", "GPU-b"),
)


def test_no_checkpoint_is_no_claim(tmp_path: Path) -> None:
    assert checkpoint.load(tmp_path) == {}


def test_claims_read_back_as_written(tmp_path: Path) -> None:
    checkpoint.save(tmp_path / "plugin", {CLAIM.uid: CLAIM})
    assert checkpoint.load(tmp_path / "plugin") == {CLAIM.uid: CLAIM}
    assert (tmp_path / "plugin" / checkpoint.NAME).stat().st_mode & 0o777 == 0o600
    checkpoint.save(tmp_path / "plugin", {})
    assert checkpoint.load(tmp_path / "plugin") == {}


@pytest.mark.parametrize(
    "text", ["{not json", '{"version": 2, "claims": {}}', '{"version": 1, "claims": {"u": {}}}']
)
def test_an_unreadable_checkpoint_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / checkpoint.NAME).write_text(text)
    with pytest.raises(StateError, match=r"checkpoint .*checkpoint\.json is unreadable"):
        checkpoint.load(tmp_path)
