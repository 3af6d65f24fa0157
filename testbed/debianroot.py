"""Debian root filesystems made here by mmdebstrap, as tarballs cached by what made them.

`make image` makes the Containerfile's base from one (scripts/image.py), and the host-side
tests run gpuwire's host files in Debian 11, 12 and 13 roots.
A tarball lies in `.cache/debian/<suite>-<key>.tar`, the key a hash of every input that
shapes it (suite, mirror, variant, packages, options, mmdebstrap's version), so a change of
any of them makes a new one and an unchanged one is made once. The mirror is Debian's
(reachable from CI); the root holds what the suite's signed index held when it was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.debian import MIRROR

CACHE = Path(__file__).resolve().parents[1] / ".cache/debian"
# Debian's container images are this small (debuerreotype's "slim"): no documentation but the
# copyright files, no manual pages, no translations.
SLIM = (
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    '--aptopt=Acquire::Languages "none"',
)
HOOKS = Path("/usr/share/mmdebstrap/hooks")


@dataclass(frozen=True)
class Root:
    """A minbase root of `suite` with `packages` added; `options` are mmdebstrap's. `usr`:
    mmdebstrap's hook for /usr: `merged-usr`, merged by mmdebstrap itself as Debian 12 and
    later have it (the `usrmerge` package otherwise installed for it would bring perl), or
    `maybe-merged-usr` for a suite that may have no merged /usr (Debian 11). No device nodes
    (an engine makes /dev)."""

    suite: str
    packages: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    mirror: str = MIRROR
    usr: str = "merged-usr"

    def argv(self, output: Path) -> list[str]:
        include = [f"--include={','.join(self.packages)}"] if self.packages else []
        return [
            "mmdebstrap",
            "--quiet",
            "--mode=root",
            "--variant=minbase",
            "--format=tar",
            f"--hook-dir={HOOKS / self.usr}",
            "--skip=output/dev",
            *self.options,
            *include,
            self.suite,
            str(output),
            self.mirror,
        ]

    def key(self) -> str:
        """A hash of everything that makes the tarball what it is."""
        version = subprocess.run(
            ["mmdebstrap", "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        inputs = json.dumps([version, self.argv(Path("OUT"))])
        return hashlib.sha256(inputs.encode()).hexdigest()[:16]

    def tarball(self, cache: Path = CACHE) -> Path:
        """The root as a tar (entries `./…`), made unless one of the same key is cached."""
        path = cache / f"{self.suite}-{self.key()}.tar"
        if path.exists():
            return path
        cache.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            made = subprocess.run(self.argv(partial), capture_output=True, text=True)
            if made.returncode != 0:
                raise RuntimeError(f"mmdebstrap {self.suite}: {made.stderr.strip()[-2000:]}")
            partial.rename(path)
        finally:
            partial.unlink(missing_ok=True)
        return path
