"""Device access for a created container: the cgroup v1 `devices` controller.

runc denies every device not in the spec; a prestart hook that adds device nodes must also
allow them, in the container's cgroup (`/proc/<pid>/cgroup`). On cgroup v1, and on hybrid
hosts whose `devices` controller is still on v1, that is a line in `devices.allow`.
On pure cgroup v2 device access is an eBPF program attached by the runtime; replacing it
from a hook behind runc's back is what makes NVIDIA's legacy hook lose access on
`systemctl daemon-reload`. gpuwire does not do that: the hook refuses (fails closed) and
points to the shim, with which runc programs the filter itself from `config.json`.
"""

from __future__ import annotations

import os

from runtime_hook.injection.inroot import Journal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.edits import DeviceNode


class CgroupError(RuntimeError):
    """The container's device cgroup cannot be found or changed."""


V2_REFUSAL = (
    "cgroup v2 controls device access with an eBPF program that runc attaches; "
    "gpuwire-hook does not replace it from outside. Use the gpuwire-runtime shim (set it "
    "as containerd's BinaryName), with which runc allows the GPU devices itself"
)


def devices_path(cgroup_text: str) -> str | None:
    """The `devices` controller's cgroup path in /proc/<pid>/cgroup, or None (no v1)."""
    for line in cgroup_text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "devices" in controllers.split(","):
            return path
    return None


def devices_mount(mountinfo: str) -> tuple[str, str] | None:
    """(mount point, cgroup root it shows) of the v1 `devices` hierarchy in mountinfo."""
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts, tail = fields.split(), rest.split()
        cgroup_v1 = len(parts) >= 5 and len(tail) >= 3 and tail[0] == "cgroup"
        if cgroup_v1 and "devices" in tail[2].split(","):
            return parts[4], parts[3]
    return None


def container_dir(pid: int) -> str:
    """The container's directory in the v1 devices hierarchy; CgroupError on pure v2."""
    with open(f"/proc/{pid}/cgroup") as f:
        path = devices_path(f.read())
    if path is None:
        raise CgroupError(V2_REFUSAL)
    with open("/proc/self/mountinfo") as f:
        mount = devices_mount(f.read())
    if mount is None:
        raise CgroupError("the devices cgroup controller is not mounted on this host")
    mountpoint, shown = mount
    if shown != "/" and path.startswith(shown):
        path = path[len(shown) :]
    directory = os.path.join(mountpoint, path.lstrip("/"))
    if not os.path.isfile(os.path.join(directory, "devices.allow")):
        raise CgroupError(f"no devices.allow in the container's cgroup {directory}")
    return directory


def rule(node: DeviceNode) -> str:
    return f"{node['type']} {node['major']}:{node['minor']} {node['permissions']}"


def _write(directory: str, name: str, line: str) -> None:
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def allow(directory: str, nodes: list[DeviceNode], journal: Journal) -> None:
    """Allow each node in the container's cgroup; the journal denies it again on undo."""
    for node in nodes:
        line = rule(node)
        try:
            _write(directory, "devices.allow", line)
        except OSError as exc:
            raise CgroupError(f"cannot allow {line} in {directory}: {exc.strerror}") from None
        journal.record(_write, directory, "devices.deny", line)
