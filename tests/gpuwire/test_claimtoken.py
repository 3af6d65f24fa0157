"""Claim tokens: what the DRA plugin writes at prepare and the runtime reads on every start."""

from __future__ import annotations

import json
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
    ("pod-b", "pod-a"),
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
        ClaimToken("../x", "team-a", "gpus", (), ()),
        ClaimToken(UID, "team-a", "gpus", (), (ClaimDevice("../gpu", "GPU-a"),)),
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


@pytest.mark.parametrize(
    ("pods", "pod", "why"),
    [
        (("pod-a", "pod-b"), "pod-b", None),
        (("pod-a", "pod-b"), "pod-c", "is reserved for pods pod-a, pod-b, not pod-c"),
        (("pod-a",), "pod-c", "is reserved for pod pod-a, not pod-c"),
        ((), "pod-c", "is reserved for pod (none), not pod-c"),
        (("pod-a",), None, "is reserved for pod pod-a; the spec names no pod UID"),
    ],
)  # fmt: skip
def test_it_serves_only_the_pods_it_binds(
    pods: tuple[str, ...], pod: str | None, why: str | None
) -> None:
    """A pod of the claim's namespace that it is not reserved for is refused as well."""
    token = ClaimToken(UID, "team-a", "gpus", pods, TOKEN.devices)
    assert token.refusal("team-a", pod) == (why and f"claim team-a/gpus {why}")
    assert (
        token.refusal("team-b", "pod-a") == "claim team-a/gpus is in namespace team-a, not team-b"
    )


def test_a_pod_added_to_the_file_by_hand_breaks_its_mac(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys")
    path = Path(claimtoken.write(str(tmp_path / "alloc"), TOKEN, keys))
    body = json.loads(path.read_text())
    assert body["pods"] == ["pod-a", "pod-b"]
    body["pods"].append("pod-c")
    path.write_text(json.dumps(body))
    with pytest.raises(ClaimTokenError, match="has an invalid MAC"):
        claimtoken.read(str(tmp_path / "alloc"), UID, keys)
