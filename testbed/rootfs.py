"""Container root filesystems from Debian's static busybox, and runc bundles around them."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSYBOX = "/bin/busybox"


def busybox_rootfs(root: Path, *, debian: bool = True) -> Path:
    """A minimal rootfs: busybox and its applets, /etc/passwd, and the distro's lib dirs.

    `debian` decides whether `/etc/debian_version` exists, which is how injection picks
    `/usr/lib/x86_64-linux-gnu` over `/usr/lib64`.
    """
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, bindir / "busybox")
    applets = subprocess.run(
        [BUSYBOX, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        link = bindir / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    for d in ("dev", "proc", "sys", "tmp", "etc", "usr/bin", "sbin", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/x86_64-linux-gnu" if debian else root / "usr/lib64").mkdir(
        parents=True, exist_ok=True
    )
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    if debian:
        (root / "etc/debian_version").write_text("12.0\n")
    return root


def runc_spec() -> dict[str, Any]:
    """runc's own default config.json (`runc spec`), not a hand-written imitation."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["runc", "spec", "--bundle", tmp], check=True)
        spec: dict[str, Any] = json.loads(Path(tmp, "config.json").read_text())
        return spec


@dataclass
class Bundle:
    """An OCI bundle directory: `config.json` beside `rootfs/`."""

    path: Path
    spec: dict[str, Any]

    @classmethod
    def create(
        cls,
        path: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        *,
        debian: bool = True,
    ) -> Bundle:
        busybox_rootfs(path / "rootfs", debian=debian)
        spec = runc_spec()
        spec["process"]["terminal"] = False
        spec["process"]["args"] = args
        spec["process"]["env"] = [
            "PATH=/usr/bin:/bin:/sbin",
            *(f"{k}={v}" for k, v in (env or {}).items()),
        ]
        spec["root"]["readonly"] = False
        spec["annotations"] = dict(annotations or {})
        bundle = cls(path, spec)
        bundle.save()
        return bundle

    def save(self) -> None:
        (self.path / "config.json").write_text(json.dumps(self.spec, indent=2))

    def run(
        self, *, runtime: str = "runc", timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`runc run` to completion under a fresh container id, deleted afterwards."""
        cid = f"gpuwire-{uuid.uuid4().hex[:12]}"
        try:
            return subprocess.run(
                [runtime, "run", "--bundle", str(self.path), cid],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        finally:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
