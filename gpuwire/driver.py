"""What the NVIDIA driver on this node offers a container, read from procfs and files.

No NVML at container start: the kernel module's procfs entries name the GPUs
(`/proc/driver/nvidia/gpus/<bus>/information`), their minors and the driver version;
`/proc/devices` gives the majors (`nvidia-uvm`'s is dynamic); the driver's libraries are
`<name>.so.<version>` files (tables in `gpuwire.nvidia`), found in the distro's library
directories under the driver root, with their SONAME read from the ELF header.

Three roots, as NVIDIA's `--driver-root` and `--dev-root`: `driver` holds libraries,
binaries and firmware (`/` on a host install, `/run/nvidia/driver` with a driver
container), `dev` the device nodes, `proc` the procfs. Each is a root directory, so the
same code reads a real node and `gpuwire sim node DIR`. Files under the driver root are
resolved inside it (a driver container's absolute links point into the driver container)
and reported by their real host path, which is what a bind mount needs.

`discover(Roots(...), capabilities)` → `Driver`. Only the files of the capabilities asked
for are looked up, because this runs on every GPU container start. MIG devices and their
capability device nodes come from procfs too (`gpuwire.mig`).
"""

from __future__ import annotations

import os
import stat
import time

from gpuwire import elf, ldsocache, mig, nvidia, resolve
from gpuwire.devices import CharDevice, Device, MigDevice, normalise_bus_id
from gpuwire.roots import Roots


class DiscoveryError(RuntimeError):
    """The driver is missing or its procfs entries cannot be read."""


class HostFile:
    """A driver file: the name a container gets it by, and its real path on the host."""

    __slots__ = ("host_path", "name")

    def __init__(self, name: str, host_path: str) -> None:
        self.name = name  # nvidia-smi, libcuda.so.550.54.15, gsp_ga10x.bin
        self.host_path = host_path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.host_path!r})"


class Library(HostFile):
    """A driver library, with the SONAME programs load it by (libcuda.so.1) and the flags
    ldconfig files it under in the ld cache (None: unknown to gpuwire)."""

    __slots__ = ("flags", "soname")

    def __init__(self, name: str, host_path: str, soname: str | None, flags: int | None) -> None:
        super().__init__(name, host_path)
        self.soname = soname
        self.flags = flags


class Driver:
    """Everything discovery found. File tables hold only the capabilities looked up."""

    __slots__ = (
        "binaries",
        "caps_major",
        "control_nodes",
        "devices",
        "firmware",
        "gpu_major",
        "libraries",
        "libraries32",
        "mig",
        "mig_controls",
        "roots",
        "version",
    )

    def __init__(
        self,
        roots: Roots,
        version: str,
        devices: tuple[Device, ...],
        gpu_major: int,
        control_nodes: dict[str, CharDevice],
        libraries: dict[str, tuple[Library, ...]],
        libraries32: dict[str, tuple[Library, ...]],
        binaries: dict[str, tuple[HostFile, ...]],
        firmware: tuple[HostFile, ...],
        mig: tuple[MigDevice, ...] = (),
        caps_major: int | None = None,
        mig_controls: dict[str, int] | None = None,
    ) -> None:
        self.roots = roots
        self.version = version
        self.devices = devices  # in PCI bus order, which is NVML's index order
        self.gpu_major = gpu_major
        self.control_nodes = control_nodes  # nvidiactl, nvidia-uvm, ... that exist
        self.libraries = libraries  # capability → 64-bit libraries found
        self.libraries32 = libraries32  # capability → 32-bit libraries found (compat32)
        self.binaries = binaries  # capability → binaries found
        self.firmware = firmware  # GSP firmware files
        self.mig = mig  # MIG devices, unnamed (procfs does not name them)
        self.caps_major = caps_major  # of /dev/nvidia-caps/*; None: no nvidia-caps
        self.mig_controls = mig_controls or {}  # config, monitor → capability minor

    def gpu_node(self, device: Device) -> CharDevice:
        name = f"nvidia{device.minor}"
        return CharDevice(name, self.gpu_major, device.minor, f"{self.roots.dev}/dev/{name}")

    def cap_node(self, minor: int) -> CharDevice:
        """A capability's device node (`discover` made sure the major is known)."""
        name = mig.cap_name(minor)
        major = self.caps_major if self.caps_major is not None else -1
        return CharDevice(name, major, minor, f"{self.roots.dev}/dev/{name}")

    def mig_of(self, device: Device) -> tuple[MigDevice, ...]:
        return tuple(m for m in self.mig if m.parent_uuid == device.uuid)


# -- procfs: pure parsers of the driver's formats ---------------------------------------


def parse_version(text: str) -> str:
    """`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ...` → 550.54.15."""
    first = text.split("\n", 1)[0]
    for token in first.split():
        parts = token.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return token
    raise DiscoveryError(f"no driver version in {first!r}")


def parse_proc_devices(text: str) -> dict[str, int]:
    """The character-device section of /proc/devices as name → major."""
    majors: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("Block devices"):
            break
        number, _, name = line.strip().partition(" ")
        if number.isdigit() and name:
            majors[name.strip()] = int(number)
    return majors


def parse_information(text: str) -> dict[str, str]:
    """`Key: \\t value` lines of /proc/driver/nvidia/gpus/<bus>/information."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def device_from_information(fields: dict[str, str], index: int, source: str) -> Device:
    try:
        bus = normalise_bus_id(fields["Bus Location"])
        minor = int(fields["Device Minor"])
        uuid, product = fields["GPU UUID"], fields["Model"]
    except (KeyError, ValueError) as exc:
        raise DiscoveryError(f"{source}: missing or malformed field {exc}") from None
    if bus is None:
        raise DiscoveryError(f"{source}: malformed Bus Location {fields['Bus Location']!r}")
    return Device(index=index, minor=minor, uuid=uuid, pci_bus_id=bus, product=product)


# -- the filesystem ---------------------------------------------------------------------


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def read_devices(proc_root: str) -> tuple[Device, ...]:
    """The GPUs the driver lists, in PCI bus order (NVML's index order)."""
    gpus_dir = f"{proc_root}/{nvidia.PROC_DRIVER}/gpus"
    try:
        buses = os.listdir(gpus_dir)
    except FileNotFoundError:
        return ()
    found = []
    for bus in buses:
        source = f"{gpus_dir}/{bus}/information"
        try:
            fields = parse_information(_read(source))
        except OSError as exc:
            raise DiscoveryError(f"cannot read {source}: {exc.strerror}") from None
        found.append(device_from_information(fields, 0, source))
    found.sort(key=lambda d: d.pci_bus_id)
    return tuple(
        Device(index=i, minor=d.minor, uuid=d.uuid, pci_bus_id=d.pci_bus_id, product=d.product)
        for i, d in enumerate(found)
    )


def _host_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


# A file's identity → its ELF class, SONAME and ld cache flags. The DRA plugin discovers
# the driver on every prepare, and the headers were a fifth of that; a file replaced or
# rewritten (an upgrade, `cp` over it) has a new inode, size, mtime or ctime, so a new key.
# Timestamps are kernel ticks, not nanoseconds: a file changed within the last second could
# change again with the same key (git's "racy clean" files), so it is read, not remembered.
_FileKey = tuple[int, int, int, int, int]
_facts: dict[_FileKey, tuple[int, str | None, int | None]] = {}
_FACTS_KEPT = 1024  # files; past it (many upgrades in one process) start again
_SETTLED_NS = 1_000_000_000  # since its last change, for a file's facts to be remembered


def _library_facts(fd: int, st: os.stat_result) -> tuple[int, str | None, int | None]:
    """`(bits, soname, flags)` of the ELF file open on `fd` (elf.ElfError: not one)."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    facts = _facts.get(key)
    if facts is None:
        info = elf.read(fd)
        facts = (info.bits, info.soname, ldsocache.library_flags(info))
        if st.st_ctime_ns + _SETTLED_NS < time.time_ns():
            if len(_facts) >= _FACTS_KEPT:
                _facts.clear()
            _facts[key] = facts
    return facts


def find_library(root_fd: int, dirs: tuple[str, ...], name: str, bits: int) -> Library | None:
    """The first `dirs/name` under the root that is an ELF library of `bits` bits."""
    for libdir in dirs:
        try:
            fd = resolve.lookup(root_fd, f"{libdir}/{name}", os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            found_bits, soname, flags = _library_facts(fd, st)
            if found_bits == bits:
                return Library(name, _host_path(fd), soname, flags)
        except elf.ElfError:
            continue
        finally:
            os.close(fd)
    return None


def find_binary(root_fd: int, name: str) -> HostFile | None:
    for bindir in nvidia.HOST_BINDIRS:
        try:
            fd = resolve.lookup(root_fd, f"{bindir}/{name}")
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return HostFile(name, _host_path(fd))
        finally:
            os.close(fd)
    return None


def find_firmware(root_fd: int, version: str) -> tuple[HostFile, ...]:
    """GSP firmware `lib/firmware/nvidia/<version>/gsp*.bin`, as NVIDIA mounts it."""
    try:
        fd = resolve.lookup(
            root_fd, f"{nvidia.FIRMWARE_DIR}/{version}", os.O_RDONLY | os.O_DIRECTORY
        )
    except (FileNotFoundError, NotADirectoryError):
        return ()
    try:
        base = _host_path(fd)
        names = sorted(n for n in os.listdir(fd) if n.startswith("gsp") and n.endswith(".bin"))
    finally:
        os.close(fd)
    return tuple(HostFile(n, f"{base}/{n}") for n in names)


def discover(roots: Roots, capabilities: tuple[str, ...] = nvidia.CAPABILITIES) -> Driver:
    """The driver's version, GPUs, device nodes and the files of `capabilities`."""
    version_file = f"{roots.proc}/{nvidia.PROC_DRIVER}/version"
    try:
        version = parse_version(_read(version_file))
        majors = parse_proc_devices(_read(f"{roots.proc}/proc/devices"))
    except FileNotFoundError as exc:
        raise DiscoveryError(
            f"no NVIDIA driver: {exc.filename} is missing (is the nvidia module loaded?)"
        ) from None
    gpu_major = majors.get("nvidia", majors.get("nvidia-frontend", nvidia.GPU_MAJOR))
    control = {}
    for name, major_name, minor in (nvidia.CTL_NODE, nvidia.MODESET_NODE, *nvidia.UVM_NODES):
        major = gpu_major if major_name is None else majors.get(major_name)
        host_path = f"{roots.dev}/dev/{name}"
        if major is not None and os.path.exists(host_path):
            control[name] = CharDevice(name, major, minor, host_path)

    wanted = nvidia.with_implied(capabilities)
    root_fd = resolve.open_root(roots.driver)
    try:
        libraries, libraries32 = {}, {}
        for cap in wanted:
            names = [f"{n}.{version}" for n in nvidia.LIBRARIES[cap]]
            libraries[cap] = tuple(
                lib for n in names if (lib := find_library(root_fd, nvidia.HOST_LIBDIRS, n, 64))
            )
            if "compat32" in wanted:
                libraries32[cap] = tuple(
                    lib
                    for n in names
                    if (lib := find_library(root_fd, nvidia.HOST_LIBDIRS_32, n, 32))
                )
        binaries = {
            cap: tuple(b for n in nvidia.BINARIES.get(cap, ()) if (b := find_binary(root_fd, n)))
            for cap in capabilities
        }
        firmware = find_firmware(root_fd, version)
    finally:
        os.close(root_fd)
    devices = read_devices(roots.proc)
    try:
        instances = mig.read_instances(roots.proc, devices)
        controls = mig.read_controls(roots.proc)
    except mig.MigError as exc:
        raise DiscoveryError(str(exc)) from None
    caps_major = majors.get(mig.CAPS_MAJOR_NAME)
    if (instances or controls) and caps_major is None:
        raise DiscoveryError(
            f"the driver lists MIG capabilities, but /proc/devices has no {mig.CAPS_MAJOR_NAME}"
        )
    return Driver(
        roots,
        version,
        devices,
        gpu_major,
        control,
        libraries,
        libraries32,
        binaries,
        firmware,
        instances,
        caps_major,
        controls,
    )
