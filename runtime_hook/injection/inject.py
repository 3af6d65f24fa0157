"""Applying container edits to a container's root: all of them (prestart), or the links and
the ld cache before runc creates it (the shim).

`apply`, for the prestart hook: the hook runs in the host's namespaces while the
container's `/dev` is a tmpfs that exists only in the container's mount namespace. So:

1. on the host: the device cgroup allow rules (v1; v2 refused, see `runtime_hook.injection.cgroup`),
   the host's ldconfig checked and opened, and each mount source opened and cloned into a
   detached, read-only, nosuid, nodev mount (`open_tree`), resolved here, where the host is
   trusted;
2. in a forked child that enters `/proc/<pid>/ns/mnt`: the rootfs opened, every path in it
   resolved inside it (`runtime_hook.injection.inroot`), device nodes made, the detached
   mounts moved onto their targets (`move_mount`, no path string in between), links and
   ld cache made;
3. any failure undoes everything, in both processes, and fails the container start.

`prepare`, for the shim: runc makes the device nodes and mounts that config.json lists,
but the links and the ld cache need code of gpuwire's in the container root. Rather than a
`createContainer` hook (a second Python process on every GPU container start), the shim
makes them itself before it execs runc, in its own process: both are files written through
descriptors resolved in the root (`runtime_hook.injection.ldcache`). Only where the cache is left to
ldconfig, which reads the libraries, does a child enter a private mount namespace in which
the libraries are bound onto their places for ldconfig alone; their mount points (empty
files) stay for runc to mount onto.
"""

from __future__ import annotations

import os
import stat

from gpuwire import resolve
from gpuwire.edits import MOUNT_OPTIONS, Edits
from runtime_hook.injection import child, inroot, ldcache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# `syscalls` (mounts, namespaces) is imported where it is used: the prestart hook and the
# confined ldconfig need it, the shim's usual start (links and a cache written) does not.


class InjectionError(RuntimeError):
    """The edits could not be applied; nothing of them is left behind."""


def detached_mount(host_path: str, options: Sequence[str] = MOUNT_OPTIONS) -> int:
    """A nosuid, nodev clone of the regular file or directory at `host_path`, read-only and
    noexec where `options` say so, not yet attached."""
    from gpuwire import syscalls

    attributes = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV
    attributes |= syscalls.MOUNT_ATTR_RDONLY if "ro" in options else 0
    attributes |= syscalls.MOUNT_ATTR_NOEXEC if "noexec" in options else 0
    fd = os.open(host_path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InjectionError(f"mount source {host_path} is neither a file nor a directory")
        tree = syscalls.open_tree_clone(fd)
    finally:
        os.close(fd)
    try:
        syscalls.mount_setattr(tree, attributes)
    except OSError:
        os.close(tree)
        raise
    return tree


def apply(pid: int, rootfs: str, edits: Edits, ldconfig: str) -> None:
    """Apply `edits` to the created container whose init process is `pid`."""

    from gpuwire import syscalls  # the prestart hook's alone
    from runtime_hook.injection import cgroup

    def steps(journal: inroot.Journal) -> None:
        directory = cgroup.container_dir(pid)
        ldconfig_fd = journal.keep(ldcache.open_ldconfig(ldconfig))  # opened on the host
        trees = [journal.keep(detached_mount(m["hostPath"], m["options"])) for m in edits.mounts]
        mnt_ns = journal.keep(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        cgroup.allow(directory, edits.device_nodes, journal)

        def enter() -> None:
            syscalls.setns(mnt_ns, syscalls.CLONE_NEWNS)

        child.run(lambda: _inside(enter, rootfs, edits, trees, ldconfig_fd, ldcache.update))

    _all_or_nothing(steps)


def refuse_links(rootfs: str, passed: Sequence[tuple[str | None, str, str]]) -> None:
    """Refuse a container where runc, mounting what holds its limits, would pass a link
    (`passed`: `spec.passed_through`, the image's paths and its volumes'): the mount would
    go onto the link's target, and the container could take the link away, and the limit
    with it."""
    try:
        for directory, path, volume in passed:
            root_fd = resolve.open_root(directory or rootfs)
            try:
                inroot.refuse_links_to(root_fd, path, volume)
            finally:
                os.close(root_fd)
    except OSError as exc:
        raise InjectionError(str(exc)) from None


def prepare(rootfs: str, edits: Edits, ldconfig: str) -> None:
    """Make the links and the ld cache of `edits` in `rootfs`, before runc creates it."""

    def steps(journal: inroot.Journal) -> None:
        root_fd = journal.keep(resolve.open_root(rootfs))
        ldconfig_fd = journal.keep(ldcache.open_ldconfig(ldconfig))
        dirs = inroot.Dirs(root_fd, journal)
        folders = edits.ldcache_folders
        if ldcache.make(dirs, edits.links, folders, edits.ldcache_entries):
            return
        libraries = [m for m in edits.mounts if _folder(m["containerPath"]) in folders]
        cache = Edits(edits.env, [], libraries, edits.links, folders, None)
        trees = [journal.keep(detached_mount(m["hostPath"])) for m in libraries]
        # The child isolates itself at once (as ldconfig needs), so it runs ldconfig directly.
        child.run(lambda: _inside(ldcache.isolate, rootfs, cache, trees, ldconfig_fd, ldcache.run))

    if edits.links or edits.ldcache_folders:
        _all_or_nothing(steps)


def _folder(path: str) -> str:
    return path.rpartition("/")[0]


def _all_or_nothing(steps: Callable[[inroot.Journal], None]) -> None:
    """Run `steps`; if they fail, undo what they recorded and raise InjectionError."""
    journal = inroot.Journal()
    try:
        steps(journal)
    except (OSError, RuntimeError) as exc:
        leftover = journal.undo()
        message = str(exc)
        if leftover:
            message += f" (and undoing failed: {'; '.join(leftover)})"
        raise InjectionError(message) from None
    finally:
        journal.close()


def _inside(
    enter: Callable[[], None],
    rootfs: str,
    edits: Edits,
    trees: list[int],
    ldconfig_fd: int,
    make_cache: Callable[[str, list[str], int], None],
) -> None:
    """In the namespaces `enter` enters: nodes, mounts, links and the cache, which is left
    to `make_cache` (`ldcache.update`, or `ldcache.run` where `enter` already isolated)
    where gpuwire cannot write it; all or nothing."""
    from gpuwire import syscalls

    enter()
    os.umask(0)
    journal = inroot.Journal()
    try:
        root_fd = journal.keep(resolve.open_root(rootfs))
        dirs = inroot.Dirs(root_fd, journal)
        for node in edits.device_nodes:
            parent, _, name = node["path"].rpartition("/")
            inroot.make_char_device(dirs.make(parent), name, node["major"], node["minor"], journal)
        os.umask(0o022)
        for mount, tree in zip(edits.mounts, trees, strict=True):
            target = mount["containerPath"]
            if stat.S_ISDIR(os.fstat(tree).st_mode):  # a directory onto a directory
                syscalls.move_mount(tree, dirs.make(target))
            else:
                parent, _, name = target.rpartition("/")
                syscalls.move_mount(tree, inroot.mount_target(dirs.make(parent), name, journal))
            journal.record(syscalls.umount, f"/proc/self/fd/{tree}")
        folders = edits.ldcache_folders
        if not ldcache.make(dirs, edits.links, folders, edits.ldcache_entries):
            make_cache(rootfs, folders, ldconfig_fd)
    except BaseException as exc:
        leftover = journal.undo()
        if leftover:
            raise InjectionError(f"{exc} (and undoing failed: {'; '.join(leftover)})") from None
        raise
    finally:
        journal.close()
