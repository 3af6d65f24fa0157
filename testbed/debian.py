"""One binary package from a Debian archive, verified the way apt verifies it, unpacked into
a private directory instead of installed.

The chain of trust is apt's (Debian wiki "SecureApt"; `apt-secure(8)`): the suite's
`InRelease` is checked with `gpgv` against `debian-archive-keyring`, and only its signed
text is read; that text lists the SHA256 of `main/binary-<arch>/Packages.xz`; the Packages
index gives the SHA256 of each `.deb`. Nothing is used before its hash matched. One
difference: an `InRelease` past its `Valid-Until` is used with a warning (apt refuses it),
since a mirror frozen in time (as in a CI sandbox) still serves a correctly signed, older
archive, and the worst such a replay does here is select an older package to test against.

Standard library only, plus `gpgv` and `dpkg-deb` (on every Debian system): it runs from
`scripts/install-system-deps`, before any virtual environment exists.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class ArchiveError(RuntimeError):
    """A download that did not verify, or an index without what was asked for."""


@dataclass(frozen=True)
class Package:
    """One stanza of a Packages index: what the archive says the `.deb` is."""

    name: str
    version: str
    filename: str  # path below the mirror, e.g. pool/main/c/containerd/containerd_..._amd64.deb
    sha256: str
    size: int


def verified_text(inrelease: bytes, keyring: Path = KEYRING) -> str:
    """The signed text of an InRelease file, if at least one signature on it is good and made
    by a key in `keyring` (as apt accepts it: another signature by a key the keyring lacks
    does not count against it; a bad one does). ArchiveError otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        signed, text = Path(tmp, "InRelease"), Path(tmp, "Release")
        signed.write_bytes(inrelease)
        out = subprocess.run(
            ["gpgv", "--keyring", str(keyring), "--status-fd", "1", "--output", str(text),
             str(signed)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        status = [
            line.split()[1] for line in out.stdout.splitlines() if line.startswith("[GNUPG:]")
        ]
        if "VALIDSIG" not in status or {"BADSIG", "EXPKEYSIG", "REVKEYSIG"} & set(status):
            raise ArchiveError(f"InRelease: no good signature by {keyring}: {out.stderr.strip()}")
        return text.read_text()


def fields(stanza: str) -> dict[str, str]:
    """A deb822 stanza as field → value; a continued field keeps its lines, joined by
    newlines (the first line may be empty, as in Release's hash lists)."""
    out: dict[str, str] = {}
    key = ""
    for line in stanza.splitlines():
        if line[:1] in (" ", "\t") and key:
            out[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def release_hash(release: str, path: str) -> tuple[str, int]:
    """The SHA256 and size that a Release text lists for `path` (relative to the suite)."""
    for line in fields(release).get("SHA256", "").splitlines():
        words = line.split()
        if len(words) == 3 and words[2] == path:
            return words[0], int(words[1])
    raise ArchiveError(f"Release lists no SHA256 for {path}")


def check_release(release: str, suite: str, now: float | None = None) -> list[str]:
    """The Release text is the suite's own (its `Suite` or `Codename` is `suite`); warnings
    for what apt would refuse but this use can accept (an expired `Valid-Until`)."""
    header = fields(release.split("\n\n", 1)[0])
    if suite not in (header.get("Suite"), header.get("Codename")):
        raise ArchiveError(
            f"Release is for suite {header.get('Suite')!r} ({header.get('Codename')!r}), "
            f"not {suite!r}"
        )
    until = header.get("Valid-Until")
    if until and email.utils.parsedate_to_datetime(until).timestamp() < (now or time.time()):
        return [f"{suite}: Release expired on {until} (a frozen mirror?); used anyway"]
    return []


def find_package(index: str, name: str) -> Package:
    """The stanza of binary package `name` in a Packages index (an archive suite holds one
    version per package and architecture)."""
    found = [f for f in map(fields, index.split("\n\n")) if f.get("Package") == name]
    if len(found) != 1:
        raise ArchiveError(f"Packages index has {len(found)} stanzas for {name!r}, not 1")
    f = found[0]
    return Package(name, f["Version"], f["Filename"], f["SHA256"], int(f["Size"]))


def checked(data: bytes, sha256: str, size: int, what: str) -> bytes:
    """`data` if it has the size and SHA256 the signed index gave; ArchiveError if not."""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != size or digest != sha256:
        raise ArchiveError(
            f"{what}: got {len(data)} bytes with SHA256 {digest}, the index says {size} "
            f"bytes with {sha256}"
        )
    return data


def download(url: str, timeout: float = 30) -> bytes:
    """`url`'s bytes; `timeout` bounds each wait on the socket, not the whole download."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 (http(s) mirror)
        data: bytes = answer.read()
        return data


def resolve(
    suite: str, name: str, arch: str, cache: Path, mirror: str = MIRROR, keyring: Path = KEYRING
) -> tuple[Package, list[str]]:
    """The package `name` that `suite` holds today, from its verified index, and warnings.
    What an index said is kept in `cache` under the index's hash, so a suite that has not
    changed costs one InRelease."""
    base = f"{mirror}/dists/{suite}"
    release = verified_text(download(f"{base}/InRelease"), keyring)
    warnings = check_release(release, suite)
    path = f"main/binary-{arch}/Packages.xz"
    sha256, size = release_hash(release, path)
    kept = cache / f"{suite}-{arch}-{sha256}-{name}.json"
    if kept.exists():
        return Package(**json.loads(kept.read_text())), warnings
    index = checked(download(f"{base}/{path}"), sha256, size, f"{suite} {path}")
    package = find_package(lzma.decompress(index).decode(), name)
    cache.mkdir(parents=True, exist_ok=True)
    for old in cache.glob(f"{suite}-{arch}-*-{name}.json"):
        old.unlink()  # what the suite's previous index said
    kept.write_text(json.dumps(dataclasses.asdict(package)))
    return package, warnings


def unpack(package: Package, dest: Path, mirror: str = MIRROR) -> Path:
    """Download the `.deb`, check it against the index, and unpack its files (`dpkg-deb -x`:
    no maintainer scripts run) into `dest`, which appears whole or not at all."""
    data = checked(download(f"{mirror}/{package.filename}"), package.sha256, package.size,
                   package.filename)  # fmt: skip
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        deb = Path(tmp, "package.deb")
        deb.write_bytes(data)
        files = Path(tmp, "files")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(files)], check=True)
        shutil.rmtree(dest, ignore_errors=True)
        files.rename(dest)
    return dest


def host_arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


def warn(message: str) -> None:
    print(message, file=sys.stderr)
