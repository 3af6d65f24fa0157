"""The three containerd generations the system tests run: 1.6, 1.7 and 2.x, each as Debian
builds it, named by the suite it comes from (bookworm, trixie, sid).

The host's own suite is served by the system's containerd (apt installed it; on Debian 12
that is 1.6, on Debian 13 1.7). Every other suite's containerd is fetched by `fetch`
(`python3 -m testbed.containerds fetch`, run by `scripts/install-system-deps`): resolved
from the suite's signed index at the time it runs (sid moves), verified and unpacked by
`testbed.debian` into `.cache/containerd/<suite>/` (ignored by git), never installed over
the system's. The binaries need glibc 2.34 and nothing else (checked on Debian 12's 2.36).
containerd finds its shim on `PATH`, so each generation runs with its own bin directory first
(`Generation.env`), and the system's runc.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import urllib.error
from dataclasses import dataclass
from pathlib import Path

from testbed import debian

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache/containerd"
MANIFEST = CACHE / "generations.json"
SUITES = ("bookworm", "trixie", "sid")  # containerd 1.6, 1.7, 2.x
SYSTEM_BIN = Path("/usr/bin")
PACKAGE = "containerd"


@dataclass(frozen=True)
class Generation:
    suite: str
    version: str  # the Debian package version, e.g. 2.1.9+ds1-5
    bin: Path  # containerd, ctr and containerd-shim-runc-v2
    system: bool  # the host's own containerd

    @property
    def series(self) -> tuple[int, int]:
        """(major, minor); (0, 0) for a version that does not start with them."""
        parts = self.version.split(".")[:2]
        return (int(parts[0]), int(parts[1])) if all(p.isdigit() for p in parts) else (0, 0)

    @property
    def config_version(self) -> int:
        """The config version this containerd writes (`config default`): 3 from 2.0 on."""
        return 3 if self.series >= (2, 0) else 2

    @property
    def cdi(self) -> bool:
        """CDI devices through CRI (`CDI_devices`): containerd 1.7.2 and later."""
        return self.series >= (1, 7)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's) with this generation's binaries first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def describe(self) -> str:
        where = "the system's" if self.system else f"Debian {self.suite}'s, in {self.bin}"
        return f"containerd {self.version} ({where})"


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The Debian suite this host runs (VERSION_CODENAME), "" elsewhere."""
    if not os_release.exists():
        return ""
    for line in os_release.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME":
            return value.strip().strip('"')
    return ""


def system_version(bin_dir: Path = SYSTEM_BIN) -> str:
    """The system containerd's Debian version (`containerd --version`'s last word), or ""."""
    binary = bin_dir / "containerd"
    if not binary.exists():
        return ""
    words = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    return words.split()[-1] if words.split() else ""


@functools.cache
def system() -> Generation:
    """The system's containerd, which serves the host's own suite."""
    return Generation(host_suite() or "system", system_version(), SYSTEM_BIN, system=True)


def fetched(manifest: Path = MANIFEST) -> dict[str, dict[str, str]]:
    """suite → {"version", "bin"} of what `fetch` unpacked."""
    kept: dict[str, dict[str, str]] = json.loads(manifest.read_text()) if manifest.exists() else {}
    return kept


def generations() -> dict[str, Generation]:
    """suite → the generation that serves it here (only those that are present)."""
    out: dict[str, Generation] = {}
    own, kept = host_suite(), fetched()
    for suite in SUITES:
        if suite == own and system().version:
            out[suite] = system()
        elif suite in kept and (CACHE / kept[suite]["bin"] / "containerd").exists():
            out[suite] = Generation(suite, kept[suite]["version"], CACHE / kept[suite]["bin"],
                                    system=False)  # fmt: skip
    return out


def fetch_suite(suite: str, arch: str, kept: dict[str, dict[str, str]]) -> dict[str, str]:
    """The suite's containerd as the manifest records it: the one already unpacked when the
    suite still holds that version, else downloaded now."""
    package, warnings = debian.resolve(suite, PACKAGE, arch, CACHE / "indexes")
    for warning in warnings:
        debian.warn(f"fetch containerd: {warning}")
    entry = {"version": package.version, "bin": f"{suite}/usr/bin"}
    if kept.get(suite) == entry and (CACHE / entry["bin"] / "containerd").exists():
        return entry
    debian.unpack(package, CACHE / suite)
    print(f"fetch containerd: {suite}: {package.version} unpacked into {CACHE / suite}")
    return entry


def fetch() -> int:
    """Bring every suite but the host's own up to date in the cache. A suite that cannot be
    reached keeps what is cached (its tests skip if nothing is); one that fails to verify
    stops everything."""
    kept = fetched()
    arch = debian.host_arch()
    for suite in (s for s in SUITES if s != host_suite()):
        try:
            kept[suite] = fetch_suite(suite, arch, kept)
        except (urllib.error.URLError, TimeoutError) as exc:
            have = f"keeping {kept[suite]['version']}" if suite in kept else "its tests will skip"
            debian.warn(f"fetch containerd: {suite}: {debian.MIRROR} unreachable ({exc}); {have}")
    CACHE.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return 0


def main(argv: list[str]) -> int:
    if argv == ["fetch"]:
        try:
            return fetch()
        except debian.ArchiveError as exc:
            debian.warn(f"fetch containerd: {exc}")
            return 1
    if argv == ["list"]:
        for suite, generation in generations().items():
            print(f"{suite}: {generation.describe()}")
        return 0
    debian.warn("usage: python3 -m testbed.containerds fetch|list")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
