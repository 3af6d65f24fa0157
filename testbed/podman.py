"""A private podman for CDI: its own storage, run root, network config and cgroup parent.

Podman 4.3 reads CDI specs only from `/etc/cdi` and `/var/run/cdi` (no `--cdi-spec-dir`,
no `cdi_spec_dirs` setting yet). Writing test specs there would let two runs, or a host's
real spec, see each other's `nvidia.com/gpu` devices (a conflict drops the device). So every
`podman run` goes into a private mount namespace in which this instance's spec directory is
bound over both CDI directories: the host's contents never change; the only trace is an
empty `/var/run/cdi` made as a mount point where the host has none. The settings are those
a sandboxed CI machine accepts: vfs storage (overlay where asked), runc (crun refuses hybrid
cgroups), cgroupfs, no network, rlimits podman need not raise.
"""

from __future__ import annotations

import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.host import Closing, remove_cgroups, remove_home, run

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")

# `sh -c _PRIVATE_CDI sh SRC DIR... -- COMMAND...`: bind SRC over each DIR that exists, then
# exec COMMAND (inside `unshare --mount`, so only COMMAND sees the binds).
_PRIVATE_CDI = """src=$1; shift
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then mount --bind "$src" "$1" || exit 125; fi
  shift
done
shift; exec "$@"
"""


@dataclass
class Podman(Closing):
    home: Path
    cgroup_parent: str = field(default_factory=lambda: f"gpuwire-{uuid.uuid4().hex[:8]}")
    storage: tuple[str, ...] = ("--storage-driver", "vfs")

    @classmethod
    def create(cls, *, overlay: bool = False) -> Podman:
        """`overlay`: overlay storage (no private mount of its home left behind), for a
        large image (vfs copies each layer whole: the gpuwire image's load takes minutes)."""
        home = Path(tempfile.mkdtemp(prefix="gwpod-", dir="/tmp"))
        (home / "cdi").mkdir()
        # The bind needs a mount point: the (empty) dynamic CDI dir, as a CDI host has.
        CDI_DIRS[-1].mkdir(parents=True, exist_ok=True)
        if overlay:
            options = ("--storage-opt", "overlay.skip_mount_home=true")
            return cls(home, storage=("--storage-driver", "overlay", *options))
        return cls(home)

    @property
    def cdi_dir(self) -> Path:
        """Where to put CDI specs: podman sees this directory's, and only these."""
        return self.home / "cdi"

    def command(self, *args: str) -> list[str]:
        h = self.home
        return [
            "podman",
            *("--root", f"{h}/root", "--runroot", f"{h}/run", "--tmpdir", f"{h}/tmp"),
            *self.storage,
            *("--runtime", "runc", "--cgroup-manager", "cgroupfs"),
            *("--events-backend", "file", "--network-config-dir", f"{h}/net"),
            *args,
        ]

    def podman(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return run(self.command(*args), check=check, timeout=timeout)

    def load(self, layout_tar: Path) -> None:
        self.podman("load", "--quiet", "--input", str(layout_tar))

    def run_argv(
        self,
        image: str,
        name: str,
        args: Sequence[str],
        *,
        devices: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """`podman run` in a private mount namespace with this instance's CDI specs."""
        flags = ["--rm", "--name", name, "--network", "none", *ULIMITS]
        flags += ["--cgroup-parent", f"/{self.cgroup_parent}"]
        for device in devices:
            flags += ["--device", device]
        for key, value in (env or {}).items():
            flags += ["--env", f"{key}={value}"]
        podman = self.command("run", *flags, image, *args)
        dirs = [str(d) for d in CDI_DIRS]
        return [
            *("unshare", "--mount", "--propagation", "private"),
            *("sh", "-c", _PRIVATE_CDI, "sh", str(self.cdi_dir), *dirs, "--", *podman),
        ]

    def run(
        self,
        image: str,
        args: Sequence[str],
        *,
        devices: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run a container to completion under a fresh name; it is removed either way."""
        name = f"gpuwire-{uuid.uuid4().hex[:12]}"
        argv = self.run_argv(image, name, args, devices=devices, env=env)
        try:
            return run(argv, check=False, timeout=timeout)
        finally:
            self.podman("rm", "--force", "--ignore", name, check=False)

    def close(self) -> None:
        """Remove this instance's cgroups and its home (storage, run root, specs)."""
        remove_cgroups(self.cgroup_parent)
        remove_home(self.home)
