"""Claim tokens: what the DRA plugin writes at prepare and the runtime reads on every start."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwire import claimtoken
from gpuwire.claimtoken import ClaimDevice, ClaimToken, ClaimTokenError
from testbed.lab import write_keys

UID = "5e1f3d2c-1111-4222-8333-944455566677"
TOKEN = ClaimToken(
    UID,
    "team-a",
    "gpus",
    None,
    (ClaimDevice("gpu-3", "GPU-c", True), ClaimDevice("gpu-1", "GPU-a")),
)


def test_written_into_a_root_only_directory_and_read_back(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys")
    path = claimtoken.write(str(tmp_path / "alloc"), TOKEN, keys)
    assert path == f"{tmp_path}/alloc/claims/{UID}"
    assert stat.S_IMODE(os.stat(tmp_path / "alloc/claims").st_mode) == 0o700
    assert os.listdir(tmp_path / "alloc/claims") == [UID]  # no temporary file left behind
    read = claimtoken.read(str(tmp_path / "alloc"), UID, keys)
    assert read == TOKEN
    assert [d.name for d in read.devices] == ["gpu-1", "gpu-3"]


def test_a_link_in_place_of_the_token_proves_nothing(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys")
    real = claimtoken.write(str(tmp_path / "elsewhere"), TOKEN, keys)
    (tmp_path / "alloc/claims").mkdir(parents=True)
    os.symlink(real, claimtoken.path(str(tmp_path / "alloc"), UID))
    with pytest.raises(ClaimTokenError, match="no token on this node"):
        claimtoken.read(str(tmp_path / "alloc"), UID, keys)


@pytest.mark.parametrize(
    ("destination", "found"),
    [
        (f"/run/gpuwire/allocations/claims/{UID}/gpu-1", (UID, "gpu-1")),
        (f"/run/gpuwire/allocations/claims/{UID}/gpu-1/", (UID, "gpu-1")),
        (f"/run/gpuwire/allocations/claims/{UID}/..", None),
        ("/run/gpuwire/allocations/claims/../gpu-1", None),
        (f"/run/gpuwire/allocations/{UID}/gpu-1", None),
        (f"/run/gpuwire/allocations/claims/{UID.upper()}/gpu-1", None),
        (f"/tmp/run/gpuwire/allocations/claims/{UID}/gpu-1", None),
    ],
)
def test_only_claim_mounts_name_a_claim(destination: str, found: tuple[str, str] | None) -> None:
    assert claimtoken.mount_of(destination) == found


def test_names_no_file_may_be_made_from_are_refused(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys")
    for bad in (
        ClaimToken("../x", "team-a", "gpus", None, ()),
        ClaimToken(UID, "team-a", "gpus", None, (ClaimDevice("../gpu", "GPU-a"),)),
    ):
        with pytest.raises(ClaimTokenError, match="not one gpuwire names a file by"):
            claimtoken.write(str(tmp_path / "alloc"), bad, keys)
    assert not (tmp_path / "alloc").exists()


def test_reading_imports_nothing_heavy() -> None:
    """The runtime reads tokens on every container start (runtime_hook.start.MODULES)."""
    heavy = "{'json', 're', 'hashlib'}"
    code = f"import sys, gpuwire.claimtoken; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
