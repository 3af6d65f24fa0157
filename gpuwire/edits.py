"""Container edits: what a GPU container gets, as data, computed by one pure function.

`container_edits(driver, devices, capabilities, layout)` → `Edits`: device nodes (with the
numbers a cgroup allow rule needs), read-only nosuid nodev bind mounts of the driver's
libraries, binaries and firmware, the links programs load libraries by, the library
folders whose ld cache must be rebuilt and the entries ldconfig would give them, and the
final environment. No file, process or
socket is touched here, so every delivery shares it and tests read it directly:

- the shim writes it into `config.json` (`runtime_hook.start.spec.apply`),
- the prestart hook applies it to a created container (`runtime_hook.injection.inject`),
- `gpuwire cdi generate` renders it with `to_cdi` (`deviceNodes`, `mounts`, `env`, `hooks`
  are CDI's `containerEdits` fields, spelled as CDI spells them).

Links and the ld cache are not mounts: they are made inside the container root (see
`runtime_hook.injection.ldcache`); for CDI by `gpuwire-hook ldcache`, which `hooks()` renders as a
`createRuntime` hook with an explicit environment. Its arguments are written by
`ldcache_args` and read back by `parse_ldcache_args`, here, so the format lives once.
"""

from __future__ import annotations

from gpuwire import ldsocache, nvidia

TYPE_CHECKING = False  # typing costs milliseconds on every container start; mypy sees this
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TypedDict

    from gpuwire.devices import CharDevice, Device, MigDevice
    from gpuwire.driver import Driver, Library

    class DeviceNode(TypedDict):
        path: str
        hostPath: str
        type: str
        major: int
        minor: int
        fileMode: int
        permissions: str
        uid: int
        gid: int

    class Mount(TypedDict):
        hostPath: str
        containerPath: str
        options: list[str]
        type: str


MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
SHARED_OPTIONS = ("rw", "nosuid", "nodev", "noexec", "bind")  # a directory shared with a daemon
# The whole environment of every hook gpuwire adds. An absent env would make runc pass
# its own, and runc before 1.3 passes the *image's* env to createContainer hooks
# (CVE-2025-23266: LD_PRELOAD from the image in a privileged hook).
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)


class Layout:
    """Where a container's distro keeps libraries and binaries."""

    __slots__ = ("bindir", "libdir", "libdir32")

    def __init__(self, libdir: str, libdir32: str, bindir: str) -> None:
        self.libdir = libdir
        self.libdir32 = libdir32
        self.bindir = bindir

    @classmethod
    def of(cls, debian: bool) -> Layout:
        """Debian and Ubuntu (`/etc/debian_version`) use multiarch dirs; the rest lib64."""
        if debian:
            return cls(
                "/" + nvidia.LIBDIR_DEBIAN, "/" + nvidia.LIBDIR_DEBIAN_32, "/" + nvidia.BINDIR
            )
        return cls("/" + nvidia.LIBDIR_OTHER, "/" + nvidia.LIBDIR_OTHER_32, "/" + nvidia.BINDIR)


def _host_dir(libraries: dict[str, tuple[Library, ...]], root: str, default: str) -> str:
    """Where the host keeps these libraries, as a path inside the driver root."""
    import os

    for lib in (lib for libs in libraries.values() for lib in libs):
        relative = os.path.relpath(os.path.dirname(lib.host_path), root)
        if not relative.startswith(".."):
            return "/" + relative
    return default


def host_layout(driver: Driver) -> Layout:
    """The host's own layout: where a CDI spec, which cannot know the image's distro, puts
    the driver's files (as NVIDIA's specs do), and so where a prepared claim's are."""
    import os

    default = Layout.of(debian=True)
    root = os.path.realpath(driver.roots.driver)
    return Layout(
        _host_dir(driver.libraries, root, default.libdir),
        _host_dir(driver.libraries32, root, default.libdir32),
        default.bindir,
    )


class Edits:
    """The changes one container gets. Links are (target, link path) pairs; ld cache
    entries (path, flags) pairs, None where ldconfig must work them out."""

    __slots__ = ("device_nodes", "env", "ldcache_entries", "ldcache_folders", "links", "mounts")

    def __init__(
        self,
        env: dict[str, str],
        device_nodes: list[DeviceNode],
        mounts: list[Mount],
        links: list[tuple[str, str]],
        ldcache_folders: list[str],
        ldcache_entries: list[tuple[str, int]] | None,
    ) -> None:
        self.env = env
        self.device_nodes = device_nodes
        self.mounts = mounts
        self.links = links
        self.ldcache_folders = ldcache_folders
        self.ldcache_entries = ldcache_entries


def device_node(node: CharDevice) -> DeviceNode:
    return {
        "path": f"/dev/{node.name}",
        "hostPath": node.host_path,
        "type": "c",
        "major": node.major,
        "minor": node.minor,
        "fileMode": 0o666,
        "permissions": "rwm",
        "uid": 0,
        "gid": 0,
    }


def bind_mount(
    host_path: str, container_path: str, options: tuple[str, ...] = MOUNT_OPTIONS
) -> Mount:
    return {
        "hostPath": host_path,
        "containerPath": container_path,
        "options": list(options),
        "type": "bind",
    }


def shared_mount(host_path: str, container_path: str) -> Mount:
    """A writable directory the container shares with a host daemon (MPS's pipes and shm)."""
    return bind_mount(host_path, container_path, SHARED_OPTIONS)


def visible_devices(devices: tuple[Device, ...], mig: tuple[MigDevice, ...] = ()) -> str:
    """NVIDIA_VISIBLE_DEVICES as granted: UUIDs (stable, unambiguous), or `none`."""
    return ",".join([d.uuid for d in devices] + [m.name for m in mig]) or "none"


def gpu_nodes(
    driver: Driver,
    devices: tuple[Device, ...],
    mig: tuple[MigDevice, ...] = (),
    mig_controls: tuple[str, ...] = (),
) -> list[CharDevice]:
    """The device nodes of GPUs and MIG devices: each GPU's `/dev/nvidiaN` (a MIG device's
    parent's too, once), then the capabilities of each MIG device (its GPU instance's and
    its compute instance's; a whole GPU's are those of every MIG device it has), then
    `mig/config` and `mig/monitor` where asked for: what CDI and the device plugin give a
    MIG device (nvidia-container-toolkit `pkg/nvcdi`, k8s-device-plugin `GetPaths`)."""
    by_uuid = {d.uuid: d for d in driver.devices}
    parents = [*devices, *(by_uuid[m.parent_uuid] for m in mig if m.parent_uuid in by_uuid)]
    gpus = list({d.minor: d for d in parents}.values())
    instances = [*(m for d in devices for m in driver.mig_of(d)), *mig]
    minors = [minor for m in instances for minor in (m.gi_cap, m.ci_cap)]
    minors += [driver.mig_controls[c] for c in mig_controls if c in driver.mig_controls]
    caps = [driver.cap_node(minor) for minor in dict.fromkeys(minors)]
    return [*(driver.gpu_node(d) for d in gpus), *caps]


def container_edits(
    driver: Driver,
    devices: tuple[Device, ...],
    capabilities: tuple[str, ...],
    layout: Layout,
    mig: tuple[MigDevice, ...] = (),
    mig_controls: tuple[str, ...] = (),
) -> Edits:
    """The edits for a container granted `devices` and MIG devices `mig` with driver
    `capabilities` (and MIG's `mig_controls`, for a privileged container).

    Control nodes as libnvidia-container injects them: `nvidiactl` always, `nvidia-uvm*`
    with the compute libraries (compute or video), `nvidia-modeset` with display; then the
    GPUs' and MIG devices' own (`gpu_nodes`). Libraries follow the capabilities and those
    they imply (video needs compute's), binaries only the capabilities named.
    """
    libcaps = nvidia.with_implied(capabilities)
    control = ["nvidiactl"]
    if "compute" in libcaps:
        control += ["nvidia-uvm", "nvidia-uvm-tools"]
    if "display" in capabilities:
        control.append("nvidia-modeset")
    nodes = [driver.control_nodes[n] for n in control if n in driver.control_nodes]
    nodes += gpu_nodes(driver, devices, mig, mig_controls)

    mounts: list[Mount] = []
    links: list[tuple[str, str]] = []
    folders: list[str] = []
    entries: list[tuple[str, int]] | None = []
    for libs, libdir in (
        (driver.libraries, layout.libdir),
        (driver.libraries32, layout.libdir32),
    ):
        chosen = _unique(lib for cap in libcaps for lib in libs.get(cap, ()))
        if not chosen:
            continue
        folders.append(libdir)
        mounts += [bind_mount(lib.host_path, f"{libdir}/{lib.name}") for lib in chosen]
        here = [
            (lib.name, f"{libdir}/{lib.soname}")
            for lib in chosen
            if lib.soname and lib.soname != lib.name
        ]
        here += _extra_links(chosen, libdir, driver.version)
        links += here
        found = ldsocache.folder_entries(
            libdir,
            [(lib.name, lib.soname, lib.flags) for lib in chosen],
            [(target, link.rpartition("/")[2]) for target, link in here],
        )
        entries = None if found is None or entries is None else entries + found
    for cap in capabilities:
        mounts += [
            bind_mount(b.host_path, f"{layout.bindir}/{b.name}")
            for b in driver.binaries.get(cap, ())
        ]
    firmware_dir = f"/{nvidia.FIRMWARE_DIR}/{driver.version}"
    mounts += [bind_mount(f.host_path, f"{firmware_dir}/{f.name}") for f in driver.firmware]

    env = {
        nvidia.VISIBLE_DEVICES_ENV: visible_devices(devices, mig),
        nvidia.CAPABILITIES_ENV: nvidia.canonical_capabilities(",".join(capabilities)),
    }
    return Edits(env, [device_node(n) for n in nodes], mounts, links, folders, entries)


def _unique(libs: Iterable[Library]) -> list[Library]:
    seen: dict[str, Library] = {}
    for lib in libs:
        seen.setdefault(lib.name, lib)
    return list(seen.values())


def _extra_links(libs: list[Library], libdir: str, version: str) -> list[tuple[str, str]]:
    present = {lib.name for lib in libs} | {lib.soname for lib in libs if lib.soname}
    out = []
    for link, target in nvidia.EXTRA_LINKS:
        target = target.format(version=version)
        if target in present:
            out.append((target, f"{libdir}/{link}"))
    return out


# -- the ld-cache hook ------------------------------------------------------------------


def ldcache_args(edits: Edits, ldconfig: str) -> list[str]:
    """`gpuwire-hook` arguments that make the links and the ld cache (`--entry`: what
    gpuwire writes into it; without, the host's ldconfig builds it)."""
    args = ["ldcache", "--ldconfig", ldconfig]
    for folder in edits.ldcache_folders:
        args += ["--folder", folder]
    for target, link in edits.links:
        args += ["--link", f"{target}::{link}"]
    for path, flags in edits.ldcache_entries or ():
        args += ["--entry", f"{flags:#x}::{path}"]
    return args


LdcacheArgs = tuple[str, list[str], list[tuple[str, str]], list[tuple[str, int]] | None]


def parse_ldcache_args(args: list[str]) -> LdcacheArgs:
    """(ldconfig, folders, links, entries or None) from `ldcache_args` output; ValueError
    names a bad one."""
    ldconfig, folders, links, entries = "", [], [], []
    pairs = iter(args)
    for flag in pairs:
        value = next(pairs, None)
        if value is None:
            raise ValueError(f"{flag} needs a value")
        first, sep, path = value.partition("::")
        if flag == "--ldconfig":
            ldconfig = value
        elif flag == "--folder" and value.startswith("/"):
            folders.append(value)
        elif flag == "--link" and sep and path.startswith("/"):
            links.append((first, path))
        elif flag == "--entry" and sep and path.startswith("/") and _is_flags(first):
            entries.append((path, int(first, 16)))
        else:
            raise ValueError(
                f"bad argument {flag} {value!r}: accepted are --ldconfig PATH, "
                "--folder /DIR, --link TARGET::/LINK, --entry 0xFLAGS::/PATH"
            )
    if not ldconfig.startswith("/"):
        raise ValueError("--ldconfig must name the host's ldconfig by absolute path")
    return ldconfig, folders, links, entries or None


def _is_flags(text: str) -> bool:
    return (
        text.startswith("0x") and len(text) > 2 and all(c in "0123456789abcdef" for c in text[2:])
    )
