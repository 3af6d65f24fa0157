"""Applying container edits to a container runc has created but not started (prestart).

The hook runs in the host's namespaces while the container's `/dev` is a tmpfs that exists
only in the container's mount namespace. So:

1. on the host: the device cgroup allow rules (v1; v2 refused, see `runtime_hook.cgroup`),
   a sealed copy of ldconfig, and each mount source opened and cloned into a detached,
   read-only, nosuid, nodev mount (`open_tree`), resolved here, where the host is trusted;
2. in a forked child that enters `/proc/<pid>/ns/mnt`: the rootfs opened, every path in it
   resolved inside it (`runtime_hook.inroot`), device nodes made, the detached mounts moved
   onto their targets (`move_mount`, no path string in between), links and ld cache made;
3. any failure undoes everything, in both processes, and fails the container start.
"""

from __future__ import annotations

import os
import stat

from runtime_hook import cgroup, inroot, ldcache, syscalls

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime_hook.edits import Edits

MOUNT_ATTRS = syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV


class InjectionError(RuntimeError):
    """The edits could not be applied; nothing of them is left behind."""


def detached_mount(host_path: str) -> int:
    """A read-only, nosuid, nodev clone of the regular file at `host_path`, not yet attached."""
    fd = os.open(host_path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InjectionError(f"mount source {host_path} is not a regular file")
        tree = syscalls.open_tree_clone(fd)
    finally:
        os.close(fd)
    try:
        syscalls.mount_setattr(tree, MOUNT_ATTRS)
    except OSError:
        os.close(tree)
        raise
    return tree


def apply(pid: int, rootfs: str, edits: Edits, ldconfig: str) -> None:
    """Apply `edits` to the created container whose init process is `pid`."""
    journal = inroot.Journal()
    try:
        directory = cgroup.container_dir(pid)
        ldconfig_fd = journal.keep(ldcache.open_ldconfig(ldconfig))
        trees = [journal.keep(detached_mount(m["hostPath"])) for m in edits.mounts]
        mnt_ns = journal.keep(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        cgroup.allow(directory, edits.device_nodes, journal)
        _in_child(lambda: _inside(mnt_ns, rootfs, edits, trees, ldconfig_fd))
    except (OSError, RuntimeError) as exc:
        leftover = journal.undo()
        message = str(exc)
        if leftover:
            message += f" (and undoing failed: {'; '.join(leftover)})"
        raise InjectionError(message) from None
    finally:
        journal.close()


def _in_child(work: Callable[[], None]) -> None:
    """Run `work` in a forked child (setns must not change this process); raise its error."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - ends in _exit
        os.close(read_end)
        status = 0
        try:
            work()
        except BaseException as exc:
            os.write(write_end, str(exc).encode())
            status = 1
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        error = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise InjectionError(error or f"injection child failed with status {status}")


def _inside(mnt_ns: int, rootfs: str, edits: Edits, trees: list[int], ldconfig_fd: int) -> None:
    """In the container's mount namespace: nodes, mounts, links, ld cache; all or nothing."""
    syscalls.setns(mnt_ns, syscalls.CLONE_NEWNS)
    os.umask(0)
    journal = inroot.Journal()
    try:
        root_fd = journal.keep(inroot.open_root(rootfs))
        for node in edits.device_nodes:
            parent, _, name = node["path"].rpartition("/")
            dir_fd = inroot.make_dirs(root_fd, parent, journal)
            inroot.make_char_device(dir_fd, name, node["major"], node["minor"], journal)
        os.umask(0o022)
        for mount, tree in zip(edits.mounts, trees, strict=True):
            parent, _, name = mount["containerPath"].rpartition("/")
            target = inroot.mount_target(inroot.make_dirs(root_fd, parent, journal), name, journal)
            syscalls.move_mount(tree, target)
            journal.record(syscalls.umount, f"/proc/self/fd/{tree}")
        ldcache.make_links(root_fd, edits.links, journal)
        if edits.ldcache_folders:
            ldcache.update(rootfs, edits.ldcache_folders, ldconfig_fd)
    except BaseException as exc:
        leftover = journal.undo()
        if leftover:
            raise InjectionError(f"{exc} (and undoing failed: {'; '.join(leftover)})") from None
        raise
    finally:
        journal.close()
