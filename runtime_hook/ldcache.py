"""Rebuilding a container's ld cache without running anything of the container's as root.

The container needs `/etc/ld.so.cache` to name the injected libraries, but busybox-like
images have no ldconfig, and running the image's own would execute container code with
host privileges. So the host's ldconfig runs, confined (nvidia-runtime.md 2.4 and 6.1):

- it must be static (no PT_INTERP): a dynamic one would load the container's ld.so;
- it is copied into a sealed memfd on the host and executed from that fd, so nothing in
  the container can replace the binary between check and exec (CVE-2024-0135 class);
- it runs in new mount, PID, network, IPC and UTS namespaces, in which every procfs and
  sysfs under the root is detached (no `/proc/<pid>/root` magic link back to the host),
  chrooted into the container root, with an empty environment, no_new_privs, a bounding
  set cut to file-ownership capabilities (no CAP_SYS_ADMIN, no CAP_SYS_CHROOT to undo
  the chroot), and rlimits (CPU 10 s, 64 files, 64 MiB per file, 2 GiB address space).

The links a library is loaded by are made before, by `make_links`, through descriptors
resolved inside the root (`runtime_hook.inroot`), and recorded for undo; ldconfig runs with
`-X`, so the cache is the one file it writes.
"""

from __future__ import annotations

import fcntl
import os
import resource

from runtime_hook import child, elf, inroot, syscalls

# Capabilities ldconfig keeps: write the cache and links whatever the image's permissions.
KEEP_CAPABILITIES = (0, 1, 2, 3)  # CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER
RLIMITS = (
    (resource.RLIMIT_CPU, 10),
    (resource.RLIMIT_NOFILE, 64),
    (resource.RLIMIT_FSIZE, 64 << 20),
    (resource.RLIMIT_AS, 2 << 30),
)
DETACHED_FILESYSTEMS = ("proc", "sysfs")
ISOLATION = (
    syscalls.CLONE_NEWNS
    | syscalls.CLONE_NEWPID
    | syscalls.CLONE_NEWNET
    | syscalls.CLONE_NEWIPC
    | syscalls.CLONE_NEWUTS
)


class LdcacheError(RuntimeError):
    """The ld cache could not be rebuilt."""


def open_ldconfig(path: str) -> int:
    """A sealed in-memory copy of the host's static ldconfig, as an executable fd."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LdcacheError(f"cannot open ldconfig {path}: {exc.strerror}") from None
    try:
        try:
            info = elf.read(fd)
        except elf.ElfError as exc:
            raise LdcacheError(f"ldconfig {path} is not an ELF executable: {exc}") from None
        if info.interpreter:
            raise LdcacheError(
                f"ldconfig {path} is dynamically linked (interpreter {info.interpreter}): "
                "inside a container root it would run the container's loader; "
                "set `ldconfig` to a static one"
            )
        memfd = os.memfd_create("gpuwire-ldconfig", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        size, offset = os.fstat(fd).st_size, 0
        while offset < size:
            sent = os.sendfile(memfd, fd, offset, size - offset)
            if sent == 0:
                break
            offset += sent
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
        return memfd
    finally:
        os.close(fd)


def make_links(dirs: inroot.Dirs, links: list[tuple[str, str]]) -> None:
    """Create each (target, link) inside the root, plus /etc for the cache to land in."""
    for target, link in links:
        parent, _, name = link.rpartition("/")
        inroot.make_symlink(dirs.make(parent), name, target, dirs.journal)
    dirs.make("/etc")


def isolate() -> None:
    """New mount, network, IPC and UTS namespaces for this process and a new PID namespace
    for its children, with no mount propagating out: where `run` runs ldconfig."""
    syscalls.unshare(ISOLATION)
    syscalls.make_private("/")


def update(rootfs: str, folders: list[str], ldconfig_fd: int) -> None:
    """Run the sealed ldconfig on `folders` inside `rootfs`, from a child that `isolate`s."""

    def isolated() -> None:
        isolate()
        run(rootfs, folders, ldconfig_fd)

    child.run(isolated)


def run(rootfs: str, folders: list[str], ldconfig_fd: int) -> None:
    """Run the sealed ldconfig as PID 1 of the namespaces `isolate` made; raise if it fails."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child ends in exec or _exit
        os.close(read_end)
        try:
            _exec(rootfs, folders, ldconfig_fd, write_end)
        except BaseException as exc:
            os.write(write_end, f"{exc}\n".encode())
        os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        output = pipe.read().decode(errors="replace").strip()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise LdcacheError(f"ldconfig in {rootfs} failed: {output or 'no output'}")


def _exec(rootfs: str, folders: list[str], ldconfig_fd: int, out: int) -> None:
    for mountpoint in magic_mounts(_read("/proc/self/mountinfo"), rootfs):
        syscalls.umount(mountpoint, syscalls.MNT_DETACH | syscalls.UMOUNT_NOFOLLOW)
    last_cap = int(_read("/proc/sys/kernel/cap_last_cap"))
    root_fd = inroot.open_root(rootfs)
    os.fchdir(root_fd)
    os.chroot(".")
    os.chdir("/")
    for limit, value in RLIMITS:
        resource.setrlimit(limit, (value, value))
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(last_cap + 1):
        if cap not in KEEP_CAPABILITIES:
            syscalls.prctl(syscalls.PR_CAPBSET_DROP, cap)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.execve(ldconfig_fd, ["ldconfig", "-X", *folders], {})  # noqa: S606 - the sealed host binary


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def magic_mounts(mountinfo: str, rootfs: str) -> list[str]:
    """procfs and sysfs mount points at or under `rootfs`, deepest first."""
    prefix = rootfs.rstrip("/") + "/"
    found = []
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        mountpoint = _unescape(parts[4])
        if rest.split()[0] in DETACHED_FILESYSTEMS and (mountpoint + "/").startswith(prefix):
            found.append(mountpoint)
    return sorted(found, key=len, reverse=True)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
