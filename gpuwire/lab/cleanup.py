"""Removing what a lab instance made, by path only: its cgroups and its home directory."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def remove_cgroups(relative: str) -> None:
    """rmdir `<controller>/<relative>` on every hierarchy (v1 controllers, a v2 beside them, or
    a pure v2 host), children first. Busy ones stay: a process still in them is a bug to see."""
    for top in (CGROUP_ROOT / relative, *CGROUP_ROOT.glob(f"*/{relative.lstrip('/')}")):
        if not top.is_dir():
            continue
        for cgroup in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` (from /proc/self/mountinfo), deepest first."""
    prefix = str(path.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def remove_home(home: Path) -> None:
    """Detach anything still mounted below `home` (so removal cannot reach through a mount
    into another tree), then remove it."""
    for point in mounts_under(home):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    shutil.rmtree(home, ignore_errors=True)
