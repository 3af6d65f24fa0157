"""Where a node's GPU files are read: `Roots`, one root directory per kind of file.

Each defaults to the host root, so the same code reads a real node and `gpuwire sim node DIR`
(as NVIDIA's `--driver-root` and `--dev-root`): `driver` holds a driver's libraries, binaries
and firmware (`/` on a host install, `/run/nvidia/driver` for the files of NVIDIA's driver
container), `dev` the device nodes, `proc` the procfs, `sys` the sysfs (AMD's KFD topology
and DRM devices). The node's config sets them; each vendor's discovery reads there.
"""

from __future__ import annotations


class Roots:
    __slots__ = ("dev", "driver", "proc", "sys")

    def __init__(
        self,
        root: str = "/",
        *,
        driver: str | None = None,
        dev: str | None = None,
        proc: str | None = None,
        sys: str | None = None,
    ) -> None:
        self.driver = driver or root
        self.dev = dev or root
        self.proc = proc or root
        self.sys = sys or root

    def __repr__(self) -> str:
        return (
            f"Roots(driver={self.driver!r}, dev={self.dev!r}, proc={self.proc!r}, sys={self.sys!r})"
        )
