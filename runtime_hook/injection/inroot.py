"""Paths inside a container's root filesystem, resolved without ever leaving it.

The rootfs belongs to whoever built the image: any component may be a symlink to a host
directory or a `..` chain. Every lookup goes through `gpuwire.resolve` (`openat2` with
`RESOLVE_IN_ROOT`), so such links resolve as they would inside the container, and every
change is made relative to a directory file descriptor obtained that way, never through a
path string the image could redirect between check and use. Each change is recorded in a
`Journal` so that a failed injection undoes what it did.
"""

from __future__ import annotations

import errno
import os
import stat

from gpuwire import resolve
from gpuwire.resolve import EXACT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Journal:
    """Undo steps for the changes made so far, and the descriptors they need."""

    def __init__(self) -> None:
        self._steps: list[tuple[Callable[..., object], tuple[object, ...], dict[str, int]]] = []
        self._fds: list[int] = []

    def record(self, step: Callable[..., object], *args: object, **fds: int) -> None:
        """Remember to call `step(*args, **fds)` on undo."""
        self._steps.append((step, args, fds))

    def keep(self, fd: int) -> int:
        """Hold `fd` open until `close`; returns it."""
        self._fds.append(fd)
        return fd

    def undo(self) -> list[str]:
        """Run the undo steps newest first; returns what could not be undone."""
        failed = []
        while self._steps:
            step, args, fds = self._steps.pop()
            try:
                step(*args, **fds)
            except OSError as exc:
                failed.append(str(exc))
        return failed

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.pop())


def exists(root_fd: int, path: str) -> bool:
    try:
        os.close(resolve.lookup(root_fd, path))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


MAX_LINKS = 40  # as the kernel's path walk


def make_dirs(root_fd: int, path: str, journal: Journal) -> int:
    """The directory `path` in the root, created (0755) where missing; an O_PATH fd.

    Missing directories are created where the container would see them: through the
    image's links (even dangling ones), with `..` stopping at the root. The walk goes one
    component at a time and opens each with no link allowed, so a link swapped in under
    it fails the call instead of leading out.
    """
    try:
        return journal.keep(resolve.lookup(root_fd, path, os.O_PATH | os.O_DIRECTORY))
    except FileNotFoundError:
        pass
    todo = [c for c in reversed(path.split("/")) if c not in ("", ".")]
    stack = [journal.keep(os.dup(root_fd))]
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            if len(stack) > 1:
                stack.pop()
            continue
        parent = stack[-1]
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            os.mkdir(name, 0o755, dir_fd=parent)
            journal.record(os.rmdir, name, dir_fd=parent)
        else:
            if stat.S_ISLNK(mode):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many links", path)
                target = os.readlink(name, dir_fd=parent)
                if target.startswith("/"):
                    del stack[1:]
                todo += [c for c in reversed(target.split("/")) if c not in ("", ".")]
                continue
        stack.append(journal.keep(resolve.openat2(parent, name, os.O_PATH | os.O_DIRECTORY, EXACT)))
    return stack[-1]


class Dirs:
    """`make_dirs` for one root, once per path: the files gpuwire puts into one directory
    (a dozen libraries, their links) all go through the same descriptor."""

    def __init__(self, root_fd: int, journal: Journal) -> None:
        self.root_fd = root_fd
        self.journal = journal
        self._fds: dict[str, int] = {}

    def make(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = make_dirs(self.root_fd, path, self.journal)
        return fd


def mount_target(dir_fd: int, name: str, journal: Journal) -> int:
    """An fd of the regular file `name` in `dir_fd`, created empty when missing.

    A symlink or a directory in its place is refused: a bind mount over either would land
    somewhere the image chose.
    """
    try:
        fd = journal.keep(resolve.openat2(dir_fd, name, os.O_PATH, EXACT))
    except FileNotFoundError:
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        fd = journal.keep(resolve.openat2(dir_fd, name, flags, EXACT, 0o644))
        journal.record(os.unlink, name, dir_fd=dir_fd)
        return fd  # made here: a regular file
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(
            f"cannot mount over {name!r}: the image has something other than a file there"
        )
    return fd


def refuse_links_to(root_fd: int, path: str, volume: str = "") -> None:
    """Refuse `path` in the root (the image's, or that of a volume mounted at `volume`) where
    a link is on its way there (any component): a mount that holds a limit (HAMi-core's
    preload list and library, MPS's pipes) would go onto the link's target, and the
    container could then take the link away, and the limit with it. What is not there yet
    is fine: it is made where the path says."""
    probe = path.rstrip("/")
    while probe:
        try:
            os.close(resolve.openat2(root_fd, probe.lstrip("/") or ".", os.O_PATH, EXACT))
            return
        except FileNotFoundError:
            probe = probe.rpartition("/")[0]
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            where = f"the volume at {volume}" if volume else "the image"
            raise OSError(
                f"cannot mount over {volume + path!r}: {where} has a link on the way there, "
                "which the container could take away, and what is mounted with it"
            ) from None


def make_char_device(dir_fd: int, name: str, major: int, minor: int, journal: Journal) -> None:
    """mknod `name` (mode 0666); an existing node with the same numbers is kept as it is."""
    rdev = os.makedev(major, minor)
    try:
        os.mknod(name, stat.S_IFCHR | 0o666, rdev, dir_fd=dir_fd)
    except FileExistsError:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev:
            return
        raise OSError(
            f"/dev/{name} exists in the container and is not device {major}:{minor}"
        ) from None
    journal.record(os.unlink, name, dir_fd=dir_fd)


def make_symlink(dir_fd: int, name: str, target: str, journal: Journal) -> bool:
    """Point `name` at `target`, replacing a symlink the image had (restored on undo).

    A real file (or directory) of that name is the image's own and is left alone: then
    the link is not in place, and False says so.
    """
    try:
        os.symlink(target, name, dir_fd=dir_fd)
    except FileExistsError:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            return False
        old = os.readlink(name, dir_fd=dir_fd)
        if old == target:
            return True
        os.unlink(name, dir_fd=dir_fd)
        os.symlink(target, name, dir_fd=dir_fd)
        journal.record(_relink, dir_fd, name, old)
        return True
    journal.record(os.unlink, name, dir_fd=dir_fd)
    return True


def _relink(dir_fd: int, name: str, target: str) -> None:
    os.unlink(name, dir_fd=dir_fd)
    os.symlink(target, name, dir_fd=dir_fd)
