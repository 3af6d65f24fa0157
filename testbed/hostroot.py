"""A host whose root filesystem is a directory (a Debian 11 root, a busybox one): a mount
namespace of its own whose root is that directory (pivot_root), with procfs, the host's
/dev and /sys, held open by one process.

What production does with the real host, the tests do with this one: the resident enters the
namespaces of its process (`--enter PID`, as the DaemonSet's resident enters pid 1's), and
`run` runs a command there as containerd runs a runtime or a hook on a host. Its other
namespaces (PID, cgroup, network, IPC, UTS) are this machine's. Nothing of it outlives
`close`: its mounts are private to its namespace, which goes with its process.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.host import Closing, LabError, stop

# sh -c _ENTER sh ROOT: the namespace's root becomes ROOT, then the process waits.
_ENTER = """set -e
mount --make-rprivate /
mount --rbind "$1" "$1"
mkdir -p "$1/proc" "$1/dev" "$1/sys" "$1/.old-root"
mount -t proc proc "$1/proc"
mount --rbind /dev "$1/dev"
mount --rbind /sys "$1/sys"
cd "$1"
pivot_root . .old-root
umount -l /.old-root
rmdir /.old-root
echo ready
exec sleep 2147483647
"""


class HostRoot(Closing):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ENTER, "sh", str(root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline() != "ready\n":
            stop(self.process)
            raise LabError(f"no host at {root}: {self.process.stderr.read()}")  # type: ignore[union-attr]

    @property
    def pid(self) -> int:
        """The process holding the host's namespaces (what the resident enters)."""
        return self.process.pid

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: str = "",
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` on this host, in its mount namespace (its root), with `env` alone."""
        return subprocess.run(
            ["nsenter", f"--target={self.pid}", "--mount", "--", "env", "-i", *_pairs(env), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def close(self) -> None:
        stop(self.process)


def _pairs(env: Mapping[str, str] | None) -> list[str]:
    return [f"{key}={value}" for key, value in (env or {}).items()]
