"""testbed/debian.py: a package from a Debian archive is used only after the chain of trust
held (signed InRelease → Packages.xz hash → .deb hash), against a local archive (file://)
signed by a throwaway key, so every link can be broken on purpose."""

from __future__ import annotations

import hashlib
import lzma
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed import debian
from testbed.containerds import Generation, host_suite
from tests.conftest import requires_binary

pytestmark = [requires_binary("gpg", "gpgv", "dpkg-deb")]

SUITE, ARCH = "testing-suite", "amd64"


def gpg(home: Path, *args: str, stdin: bytes = b"") -> bytes:
    out = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", *args],
                         input=stdin, capture_output=True, check=True)  # fmt: skip
    return out.stdout


@dataclass(frozen=True)
class Keys:
    """One GnuPG home holding the archive's key and a stranger's; `keyring` holds only the
    archive's public key, as debian-archive-keyring holds only Debian's."""

    home: Path
    keyring: Path

    def sign(self, text: str, *signers: str) -> bytes:
        """`text` as an InRelease file: clear-signed by each of `signers`."""
        users = [arg for signer in signers for arg in ("--local-user", signer)]
        return gpg(self.home, *users, "--clearsign", stdin=text.encode())


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keys]:
    home = tmp_path_factory.mktemp("gpg")
    home.chmod(0o700)
    for name in ("archive", "stranger"):
        gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.org>",
            "ed25519", "sign", "never")  # fmt: skip
    keyring = home / "keyring.gpg"
    keyring.write_bytes(gpg(home, "--export", "archive@example.org"))
    yield Keys(home, keyring)
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], check=False)


@dataclass
class Archive:
    """A one-package archive laid out as a mirror is (dists/, pool/)."""

    root: Path
    deb: Path
    index: bytes

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def release(self, index: bytes | None = None, suite: str = SUITE, until: str = "") -> str:
        data = self.index if index is None else index
        digest = hashlib.sha256(data).hexdigest()
        valid = f"Valid-Until: {until}\n" if until else ""
        return (
            f"Origin: Debian\nSuite: {suite}\nCodename: {suite}\n{valid}SHA256:\n"
            f" {digest} {len(data)} main/binary-{ARCH}/Packages.xz\n"
        )

    def publish(self, inrelease: bytes, index: bytes | None = None) -> None:
        dists = self.root / "dists" / SUITE
        (dists / f"main/binary-{ARCH}").mkdir(parents=True, exist_ok=True)
        (dists / "InRelease").write_bytes(inrelease)
        (dists / f"main/binary-{ARCH}/Packages.xz").write_bytes(self.index if index is None
                                                                 else index)  # fmt: skip


@pytest.fixture
def archive(tmp_path: Path) -> Archive:
    build = tmp_path / "build"
    (build / "DEBIAN").mkdir(parents=True)
    (build / "DEBIAN/control").write_text(
        f"Package: thing\nVersion: 2.1.9+ds1-5\nArchitecture: {ARCH}\n"
        "Maintainer: nobody <nobody@example.org>\nDescription: a test package\n"
    )
    (build / "usr/bin").mkdir(parents=True)
    (build / "usr/bin/thing").write_text("#!/bin/sh\necho thing\n")
    (build / "usr/bin/thing").chmod(0o755)
    root = tmp_path / "mirror"
    pool = root / "pool/main/t/thing"
    pool.mkdir(parents=True)
    deb = pool / "thing_2.1.9+ds1-5_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(build), str(deb)],
                   check=True, capture_output=True)  # fmt: skip
    data = deb.read_bytes()
    stanza = (
        f"Package: other\nVersion: 1\nFilename: pool/x.deb\nSHA256: {'0' * 64}\nSize: 1\n\n"
        f"Package: thing\nVersion: 2.1.9+ds1-5\nDescription: a test package\n"
        f" continued\nFilename: pool/main/t/thing/{deb.name}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\nSize: {len(data)}\n"
    )
    return Archive(root, deb, lzma.compress(stanza.encode()))


def resolve(archive: Archive, keyring: Path, cache: Path) -> tuple[debian.Package, list[str]]:
    return debian.resolve(SUITE, "thing", ARCH, cache, archive.url, keyring)


def test_a_verified_package_is_unpacked(archive: Archive, keys: Keys, tmp_path: Path) -> None:
    archive.publish(keys.sign(archive.release(), "archive"))
    package, warnings = resolve(archive, keys.keyring, tmp_path / "cache")
    assert (package.version, package.filename) == (
        "2.1.9+ds1-5",
        f"pool/main/t/thing/{archive.deb.name}",
    )
    assert warnings == []
    dest = debian.unpack(package, tmp_path / "out/thing", archive.url)
    assert (dest / "usr/bin/thing").read_text() == "#!/bin/sh\necho thing\n"
    assert os.access(dest / "usr/bin/thing", os.X_OK)
    # the same index again: answered from the cache, without reading Packages.xz
    archive.publish(keys.sign(archive.release(), "archive"), index=b"not xz")
    assert resolve(archive, keys.keyring, tmp_path / "cache")[0] == package


def test_a_signature_by_a_key_outside_the_keyring_is_refused(
    archive: Archive, keys: Keys, tmp_path: Path
) -> None:
    archive.publish(keys.sign(archive.release(), "stranger"))
    with pytest.raises(debian.ArchiveError, match="no good signature"):
        resolve(archive, keys.keyring, tmp_path / "cache")


def test_a_second_signature_by_an_unknown_key_does_not_count_against_it(
    archive: Archive, keys: Keys, tmp_path: Path
) -> None:
    """As apt takes it: the archive signs with its old and its new key, and an older
    keyring knows only the old one (bookworm's keyring and a future sid)."""
    archive.publish(keys.sign(archive.release(), "archive", "stranger"))
    assert resolve(archive, keys.keyring, tmp_path / "cache")[0].version == "2.1.9+ds1-5"


def test_a_changed_release_is_refused(archive: Archive, keys: Keys, tmp_path: Path) -> None:
    signed = keys.sign(archive.release(), "archive")
    archive.publish(signed.replace(b"Origin: Debian", b"Origin: Debiam"))
    with pytest.raises(debian.ArchiveError, match="no good signature"):
        resolve(archive, keys.keyring, tmp_path / "cache")


def test_only_the_signed_text_is_read(keys: Keys) -> None:
    """Text outside the signed block (here after it) never reaches the parser."""
    signed = keys.sign("Suite: a\n", "archive") + b"\nSuite: b\n"
    assert debian.verified_text(signed, keys.keyring) == "Suite: a\n"


def test_an_index_that_does_not_match_its_hash_is_refused(
    archive: Archive, keys: Keys, tmp_path: Path
) -> None:
    archive.publish(keys.sign(archive.release(), "archive"), index=archive.index + b"\0")
    with pytest.raises(debian.ArchiveError, match=r"Packages\.xz: got"):
        resolve(archive, keys.keyring, tmp_path / "cache")


def test_a_deb_that_does_not_match_its_hash_is_refused_and_nothing_is_unpacked(
    archive: Archive, keys: Keys, tmp_path: Path
) -> None:
    archive.publish(keys.sign(archive.release(), "archive"))
    package, _ = resolve(archive, keys.keyring, tmp_path / "cache")
    archive.deb.write_bytes(archive.deb.read_bytes()[:-1] + b"\0")
    with pytest.raises(debian.ArchiveError, match=r"\.deb: got"):
        debian.unpack(package, tmp_path / "out/thing", archive.url)
    assert not (tmp_path / "out/thing").exists()


def test_another_suites_release_is_refused(archive: Archive, keys: Keys, tmp_path: Path) -> None:
    """A correctly signed Release of another suite (a mirror serving stable for sid)."""
    archive.publish(keys.sign(archive.release(suite="stable"), "archive"))
    with pytest.raises(debian.ArchiveError, match="not 'testing-suite'"):
        resolve(archive, keys.keyring, tmp_path / "cache")


def test_an_expired_release_is_used_with_a_warning(
    archive: Archive, keys: Keys, tmp_path: Path
) -> None:
    archive.publish(keys.sign(archive.release(until="Fri, 06 Nov 2020 08:08:01 UTC"), "archive"))
    package, warnings = resolve(archive, keys.keyring, tmp_path / "cache")
    assert package.version == "2.1.9+ds1-5"
    assert warnings == [f"{SUITE}: Release expired on Fri, 06 Nov 2020 08:08:01 UTC "
                        "(a frozen mirror?); used anyway"]  # fmt: skip


def test_deb822_fields() -> None:
    stanza = "Package: a\nDescription: one\n two\n .\nSHA256:\n x 1 p\n"
    assert debian.fields(stanza) == {
        "Package": "a",
        "Description": "one\ntwo\n.",
        "SHA256": "\nx 1 p",
    }
    with pytest.raises(debian.ArchiveError, match="no SHA256 for q"):
        debian.release_hash(stanza, "q")
    with pytest.raises(debian.ArchiveError, match="0 stanzas for 'b'"):
        debian.find_package(stanza, "b")


def test_generations_by_version(tmp_path: Path) -> None:
    def of(version: str) -> Generation:
        return Generation("sid", version, tmp_path, system=False)

    assert (of("1.6.20~ds1-1+deb12u3").config_version, of("1.6.20~ds1-1").cdi) == (2, False)
    assert (of("1.7.24~ds1-6+deb13u1").config_version, of("1.7.24~ds1-6").cdi) == (2, True)
    assert (of("2.1.9+ds1-5").config_version, of("2.1.9+ds1-5").cdi) == (3, True)
    release = tmp_path / "os-release"
    release.write_text('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_CODENAME=trixie\n')
    assert host_suite(release) == "trixie"
    assert host_suite(tmp_path / "missing") == ""
