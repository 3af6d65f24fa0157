"""What lab instances do on the host: run the real tools, and remove what they made (their
cgroups and home directory) by path only."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

CGROUP_ROOT = Path("/sys/fs/cgroup")


class LabError(RuntimeError):
    """A lab component that did not start or answer."""


def run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a tool to completion (no stdin); with `check`, a failure raises with its stderr."""
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and out.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out


def stop(process: subprocess.Popen[Any], timeout: float = 10) -> None:
    """End a process this lab started, by its pid: SIGTERM, then SIGKILL after `timeout`."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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


class Closing:
    """A lab instance used as a context manager: leaving the block calls `close`."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
