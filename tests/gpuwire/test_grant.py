"""Grants: what they bind, key rotation, and the allocation proof's replay protection."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwire import allocation, cli
from gpuwire.grant import GrantError, KeyRing, Subject, hmac_sha256, subject_names
from testbed.lab import ADMISSION as POD
from testbed.lab import OTHER_POD, POD_UID


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    d = tmp_path / "keys"
    d.mkdir()
    (d / "2026-01").write_text("old-secret\n")
    (d / "2026-06").write_text("new-secret\n")
    return d


def test_newest_named_key_signs_and_every_key_verifies(keydir: Path) -> None:
    subject = Subject.of("team-a", "trainer", "0,1", "compute,utility", pod=POD)
    ring = KeyRing.load(keydir)
    value = ring.sign(subject)
    assert value.startswith("2026-06:")
    old = "2026-01:" + ring.mac("2026-01", subject)
    assert ring.verify(old, subject)
    (keydir / "2026-01").unlink()
    assert not KeyRing.load(keydir).verify(old, subject)


@pytest.mark.parametrize(
    "other",
    [
        Subject.of("team-b", "trainer", "0,1", "compute,utility", pod=POD),
        Subject.of("team-a", "sidecar", "0,1", "compute,utility", pod=POD),
        Subject.of("team-a", "trainer", "all", "compute,utility", pod=POD),
        Subject.of("team-a", "trainer", "0,1", "all", pod=POD),
    ],
)
def test_grant_does_not_carry_over(keydir: Path, other: Subject) -> None:
    ring = KeyRing.load(keydir)
    value = ring.sign(Subject.of("team-a", "trainer", "0,1", "compute,utility", pod=POD))
    assert not ring.verify(value, other)
    assert "invalid" in ring.explain(value, other)


def test_canonical_forms_verify(keydir: Path) -> None:
    ring = KeyRing.load(keydir)
    value = ring.sign(Subject.of("ns", "c", "1, 0", "utility,compute", pod=POD))
    assert ring.verify(value, Subject.of("ns", "c", "0,1", None, pod=POD))


def test_secret_volume_layout_is_read(tmp_path: Path) -> None:
    data = tmp_path / "..2026_11_29_data"
    data.mkdir()
    (data / "k1").write_text("s")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "k1").symlink_to("..data/k1")
    assert list(KeyRing.load(tmp_path).keys) == ["k1"]


def test_no_key_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GrantError, match="no grant key"):
        KeyRing.load(tmp_path / "missing").sign(Subject.of("a", "b", "all", "", pod=POD))


def test_explain_unknown_key_and_malformed(keydir: Path) -> None:
    ring = KeyRing.load(keydir)
    s = Subject.of("a", "b", "all", "", pod=POD)
    assert "does not hold" in ring.explain("k9:00", s)
    assert "malformed" in ring.explain("nocolon", s)


def test_subject_names_containerd_and_crio() -> None:
    assert subject_names(
        {"io.kubernetes.cri.sandbox-namespace": "ns", "io.kubernetes.cri.container-name": "c"}
    ) == ("ns", "c")
    assert subject_names(
        {"io.kubernetes.pod.namespace": "ns", "io.kubernetes.container.name": "c"}
    ) == ("ns", "c")
    assert subject_names({"io.kubernetes.cri.container-name": "c"}) is None


def test_grant_cli_prints_env_line(keydir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["grant", "--grant-key-dir", str(keydir), "--namespace", "ns", "--container", "c"]
    limit = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"
    given = ["--devices", "all", "--capabilities", "compute", "--pod", POD, "--env", limit]
    assert cli.main([*argv, *given]) == 0
    line = capsys.readouterr().out.strip()
    name, _, value = line.partition("=")
    assert name == "GPUWIRE_GRANT"
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    subject = Subject.of("ns", "c", "all", "compute", pod=POD, env=env)
    assert KeyRing.load(keydir).verify(value, subject)


def test_allocation_round_trip_and_tamper(keydir: Path, tmp_path: Path) -> None:
    ring = KeyRing.load(keydir)
    d = tmp_path / "alloc"
    a = allocation.write(d, "nvidia.com/gpu", ["GPU-b", "GPU-a"], ring)
    assert allocation.token_of(allocation.container_path(a.token)) == a.token
    assert allocation.read(d, a.token, ring) == a
    assert a.devices == ("GPU-a", "GPU-b")
    assert os.stat(d).st_mode & 0o777 == 0o700
    body = (d / a.token).read_text().replace("GPU-a", "GPU-z")
    (d / a.token).write_text(body)
    with pytest.raises(allocation.AllocationError, match="invalid MAC"):
        allocation.read(d, a.token, ring)


@pytest.mark.parametrize("body", ["[]", '"x"', "{", '{"resource": "r"}', "\xff"])
def test_unreadable_allocation_is_refused_with_the_reason(
    keydir: Path, tmp_path: Path, body: str
) -> None:
    d = tmp_path / "alloc"
    token = allocation.write(d, "nvidia.com/gpu", ["GPU-a"], KeyRing.load(keydir)).token
    (d / token).write_bytes(body.encode("latin-1"))
    with pytest.raises(allocation.AllocationError, match=f"allocation {token} is unreadable"):
        allocation.read(d, token, KeyRing.load(keydir))


@pytest.fixture
def token(keydir: Path, tmp_path: Path) -> tuple[Path, str]:
    d = tmp_path / "alloc"
    return d, allocation.write(d, "nvidia.com/gpu", ["GPU-a"], KeyRing.load(keydir)).token


def test_allocation_is_bound_to_the_pod_uid_not_the_sandbox(token: tuple[Path, str]) -> None:
    d, t = token
    assert allocation.claim(d, t, "sandbox-1", POD_UID) == allocation.Owner("sandbox-1", POD_UID)
    allocation.claim(d, t, "sandbox-1", POD_UID)  # a restart, another container of the pod
    allocation.claim(d, t, "sandbox-2", POD_UID)  # the pod's sandbox recreated
    refusal = f"belongs to pod {POD_UID}, not {OTHER_POD}"
    with pytest.raises(allocation.AllocationError, match=refusal):
        allocation.claim(d, t, "sandbox-3", OTHER_POD)
    with pytest.raises(allocation.AllocationError, match=f"belongs to pod {POD_UID}"):
        allocation.claim(d, t, "sandbox-1", OTHER_POD)  # a sandbox id does not stand for the pod


def test_without_a_pod_uid_the_sandbox_is_bound(token: tuple[Path, str]) -> None:
    """containerd before 1.6.11 names no pod UID: the binding is the sandbox, as before."""
    d, t = token
    allocation.claim(d, t, "sandbox-1")
    allocation.claim(d, t, "sandbox-1")
    with pytest.raises(allocation.AllocationError, match="belongs to sandbox sandbox-1, not"):
        allocation.claim(d, t, "sandbox-2")
    assert (d / f"{t}.claim").read_text() == "sandbox=sandbox-1\n"


def test_a_claim_from_before_pod_uids_learns_the_uid_from_its_own_sandbox(
    token: tuple[Path, str],
) -> None:
    d, t = token
    (d / f"{t}.claim").write_text("sandbox-1")  # as gpuwire wrote claims before
    # another sandbox: nothing ties it to the pod the claim was made for
    with pytest.raises(allocation.AllocationError, match="belongs to sandbox sandbox-1"):
        allocation.claim(d, t, "sandbox-2", OTHER_POD)
    assert allocation.claim(d, t, "sandbox-1", POD_UID, write=False).pod == POD_UID
    assert (d / f"{t}.claim").read_text() == "sandbox-1"  # a dry run writes nothing
    allocation.claim(d, t, "sandbox-1", POD_UID)  # a container of that sandbox: now the pod's
    allocation.claim(d, t, "sandbox-2", POD_UID)
    with pytest.raises(allocation.AllocationError, match=f"belongs to pod {POD_UID}"):
        allocation.claim(d, t, "sandbox-1", OTHER_POD)
    assert sorted(p.name for p in d.iterdir()) == [t, f"{t}.claim"]  # no temporary files left


@pytest.mark.parametrize(
    "body", [b"", b"pod=1234", b"pod=1234\n", b"pod=1234\nsandbox=sa", b"\xff"]
)
def test_a_torn_or_corrupt_claim_is_refused_naming_it(token: tuple[Path, str], body: bytes) -> None:
    """A claim cut short (a crash mid-write) or not text: whom the token belongs to cannot
    be told, so no pod gets it, and the refusal says so (before: "belongs to sandbox , not
    …", "belongs to pod 1234, not …", or a UnicodeDecodeError's traceback)."""
    d, t = token
    (d / f"{t}.claim").write_bytes(body)
    with pytest.raises(allocation.AllocationError) as refused:
        allocation.claim(d, t, "sandbox-1", POD_UID)
    assert str(refused.value).startswith(f"allocation {t}'s claim {d / t}.claim is unreadable (")
    assert "whom it belongs to cannot be told" in str(refused.value)


def test_a_dry_run_claims_nothing(token: tuple[Path, str]) -> None:
    d, t = token
    assert allocation.claim(d, t, "sandbox-1", POD_UID, write=False).pod == POD_UID
    assert not (d / f"{t}.claim").exists()
    allocation.claim(d, t, "sandbox-2", OTHER_POD)  # the first real start still owns it


@pytest.mark.parametrize(("sandbox", "pod"), [("s\nandbox", None), ("s", "pod=x"), ("", None)])
def test_an_identity_the_claim_file_cannot_hold_is_refused(
    token: tuple[Path, str], sandbox: str, pod: str | None
) -> None:
    d, t = token
    with pytest.raises(allocation.AllocationError, match="is not one gpuwire can bind a token to"):
        allocation.claim(d, t, sandbox, pod)
    assert not (d / f"{t}.claim").exists()


@pytest.mark.parametrize(
    ("annotations", "owner"),
    [
        (  # containerd >= 1.6.11
            {"io.kubernetes.cri.sandbox-id": "s1", "io.kubernetes.cri.sandbox-uid": POD_UID},
            allocation.Owner("s1", POD_UID),
        ),
        ({"io.kubernetes.cri.sandbox-id": "s1"}, allocation.Owner("s1")),  # older containerd
        (  # CRI-O: the kubelet's pod UID label, copied into the annotations
            {"io.kubernetes.cri-o.SandboxID": "s2", "io.kubernetes.pod.uid": OTHER_POD},
            allocation.Owner("s2", OTHER_POD),
        ),
        (  # containerd never writes CRI-O's key: it proves nothing there
            {"io.kubernetes.cri.sandbox-id": "s1", "io.kubernetes.pod.uid": OTHER_POD},
            allocation.Owner("s1"),
        ),
        ({"io.kubernetes.cri.sandbox-uid": POD_UID}, None),  # no sandbox: not a CRI container
    ],
)
def test_owner_comes_from_the_runtimes_own_annotations(
    annotations: dict[str, str], owner: allocation.Owner | None
) -> None:
    assert allocation.owner_of(annotations) == owner


def test_allocation_symlink_is_not_followed(keydir: Path, tmp_path: Path) -> None:
    d = tmp_path / "alloc"
    ring = KeyRing.load(keydir)
    real = allocation.write(d, "nvidia.com/gpu", ["GPU-a"], ring)
    fake = "f" * 32
    (d / fake).symlink_to(d / real.token)
    with pytest.raises(allocation.AllocationError, match="not found"):
        allocation.read(d, fake, ring)


@pytest.mark.parametrize(
    "dest", ["/run/gpuwire/allocations/../x", "/tmp/" + "a" * 32, "/run/gpuwire/allocations/XYZ"]
)
def test_token_of_rejects_other_paths(dest: str) -> None:
    assert allocation.token_of(dest) is None


# RFC 4231 section 4: the HMAC-SHA-256 results of test cases 1-4, 6 and 7 (5 is truncated).
LONG_KEY = b"\xaa" * 131  # longer than SHA-256's block: hashed first
RFC_4231 = [
    (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (
        b"Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    (
        b"\xaa" * 20,
        b"\xdd" * 50,
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
    ),
    (
        bytes(range(1, 26)),
        b"\xcd" * 50,
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
    ),
    (
        LONG_KEY,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
    (
        LONG_KEY,
        b"This is a test using a larger than block-size key and a larger than block-size data. "
        b"The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ),
]


@pytest.mark.parametrize(("key", "message", "mac"), RFC_4231)
def test_mac_is_rfc_4231_hmac_sha256(key: bytes, message: bytes, mac: str) -> None:
    assert hmac_sha256(key, message) == mac


@given(st.binary(max_size=200), st.binary(max_size=300))
def test_mac_is_what_the_hmac_module_computes(key: bytes, message: bytes) -> None:
    assert hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()


def test_a_keys_padded_hashes_are_kept_and_each_mac_starts_from_a_copy() -> None:
    """The hashes after a key's pads are made once per key (the webhook signs every grant
    with one key): a message never changes what the next one under that key starts from, and
    more keys than are kept start the memo over, with the same MACs."""
    key = b"k" * 70  # longer than a block: hashed first
    macs = [hmac_sha256(key, m) for m in (b"pod-1", b"pod-2", b"pod-1")]
    assert macs[0] == macs[2] != macs[1]
    for i in range(40):
        assert hmac_sha256(bytes([i]), b"x") == hmac.new(bytes([i]), b"x", "sha256").hexdigest()
    assert hmac_sha256(key, b"pod-1") == macs[0]
    assert macs[0] == hmac.new(key, b"pod-1", hashlib.sha256).hexdigest()


@pytest.mark.parametrize("mac", ["é" * 64, "", "0" * 63, "\udc80"])
def test_a_mac_that_cannot_match_is_refused_not_an_error(keydir: Path, mac: str) -> None:
    subject = Subject.of("team-a", "trainer", "0", "", pod=POD)
    assert not KeyRing.load(keydir).verify(f"2026-06:{mac}", subject)
