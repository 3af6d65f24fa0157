"""Replace a set of files at once, the way the kubelet updates a Secret volume.

A server that reloads its certificate must never read a new `tls.crt` with an old `tls.key`.
Each version goes into a hidden directory; `..data` points at the current one and every
visible name is a symlink through `..data`, so one rename switches all files together. A
reader that opened the old files keeps them; the next open sees the new set.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path

DATA = "..data"


def publish(
    out: Path, contents: Mapping[str, bytes], private: Collection[str] = ("tls.key",)
) -> bool:
    """Write `contents` (name → bytes) under `out`; names in `private` are owner-only.

    Returns False, touching nothing, when `out` holds exactly these contents already.
    """
    for name in contents:
        if not name or name.startswith(".") or "/" in name:
            raise ValueError(f"file name {name!r}: a plain name not starting with '.' is required")
    if all(_holds(out / name, data) for name, data in contents.items()):
        return False
    out.mkdir(parents=True, exist_ok=True)
    version = Path(tempfile.mkdtemp(prefix="..", dir=out))
    version.chmod(0o755)
    for name, data in contents.items():
        fd = os.open(version / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if name not in private:
            os.chmod(version / name, 0o644)
    _swap_link(out / DATA, version.name)
    for name in contents:
        target = f"{DATA}/{name}"
        link = out / name
        if not (link.is_symlink() and os.readlink(link) == target):
            _swap_link(link, target)
    _remove_old_versions(out, keep=version.name)
    return True


def _holds(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def _swap_link(link: Path, target: str) -> None:
    tmp = link.with_name(f"{link.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _remove_old_versions(out: Path, keep: str) -> None:
    for entry in out.iterdir():
        stale = entry.name.startswith("..") and entry.name not in (keep, DATA)
        if stale and entry.is_dir() and not entry.is_symlink():
            for child in entry.iterdir():
                child.unlink()
            entry.rmdir()
