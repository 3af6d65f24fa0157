"""The simulated GPU node: a host root that looks, to every component, like a node with GPUs.

`gpuwire sim node DIR` writes what the driver puts on a real node, in the driver's formats:
`/dev/nvidia*` (character devices with the driver's majors when run as root; opening one in a
container then gives ENXIO where the cgroup allows it and EPERM where it does not),
`/proc/devices`, `/proc/driver/nvidia/{version,params,gpus/<bus>/information}`, the driver's
libraries (real ELF shared objects with the driver's SONAMEs, so ldconfig treats them as it
would the real ones) and binaries (a `nvidia-smi` that lists the GPUs and MIG devices a
container can open), GSP firmware, and a machine file (the simulated GPUs) the simulated NVML
backend reads, with an event file for injected faults (XIDs).

MIG (`--mig`, `gpuwire sim mig`): GPUs of the models in `gpuwire.migprofiles` run MIG
instances of their real profiles. The driver's side of it is laid out as the kernel module
and nvidia-modprobe do: `/proc/driver/nvidia/capabilities/{mig/config,mig/monitor,
gpu<N>/mig/gi<G>/access,gpu<N>/mig/gi<G>/ci<C>/access}` for what exists,
`/proc/driver/nvidia-caps/mig-minors` for every possible capability (minors in the driver's
table order), and `/dev/nvidia-caps/nvidia-cap<minor>` with the `nvidia-caps` major of
/proc/devices. A MIG change rewrites all of it, and the machine file, at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import uuid as uuidlib
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwire import amdsim, atomicfile, exits, migprofiles, nvidia
from gpuwire.devices import Device
from gpuwire.elfstub import shared_object

MACHINE = "var/lib/gpuwire-sim/machine.json"
HAMI_LIBRARY = "usr/local/vgpu/libvgpu.so"
EVENTS = "var/lib/gpuwire-sim/events.jsonl"
UVM_MAJOR = 510  # dynamic on a real node: readers must take it from /proc/devices
CAPS_MAJOR = UVM_MAJOR - 1  # nvidia-caps: dynamic too
MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"
# The driver's capability table: 32 GPUs × 15 GPU instances × 8 compute instances.
CAP_GPUS, CAP_GIS, CAP_CIS = 32, 15, 8
ACCESS_MODE, CONFIG_MODE = 0o444, 0o400  # DeviceFileMode of access/monitor, of config

# product → (memory MiB, compute capability)
PRODUCTS: dict[str, tuple[int, tuple[int, int]]] = {
    "NVIDIA A100-SXM4-80GB": (81920, (8, 0)),
    "NVIDIA A100-SXM4-40GB": (40960, (8, 0)),
    "NVIDIA A100-PCIE-40GB": (40960, (8, 0)),
    "NVIDIA H100 80GB HBM3": (81559, (9, 0)),
    "NVIDIA H200": (143771, (9, 0)),
    "NVIDIA L4": (23034, (8, 9)),
    "Tesla T4": (15360, (7, 5)),
    "Tesla V100-SXM2-32GB": (32768, (7, 0)),
}
DEFAULT_PRODUCT = "NVIDIA A100-SXM4-80GB"
DEFAULT_DRIVER = "550.54.15"
DEFAULT_CUDA = "12.4"
NVLINKS_PER_PAIR = 12
# DGX A100 bus numbers, then evenly spaced ones.
_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)

# SONAMEs that are not `<name>.1` on a real driver install.
_SONAMES = {
    "libGLX_nvidia.so": "libGLX_nvidia.so.0",
    "libEGL_nvidia.so": "libEGL_nvidia.so.0",
    "libGLESv2_nvidia.so": "libGLESv2_nvidia.so.2",
    "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
}


@dataclass(frozen=True)
class SimMig:
    """A MIG device of a simulated GPU: one compute instance spanning its GPU instance."""

    gi: int
    ci: int
    profile: str
    uuid: str
    start: int  # the memory slice its GPU instance starts at


@dataclass(frozen=True)
class SimGpu:
    device: Device
    compute_capability: tuple[int, int]
    mig: tuple[SimMig, ...] | None = None  # None: MIG mode off

    @property
    def mig_capable(self) -> bool:
        return bool(migprofiles.profiles(self.device.product))


@dataclass(frozen=True)
class Machine:
    driver_version: str
    cuda_version: str
    gpus: tuple[SimGpu, ...]
    mig_created: int = 0  # MIG devices ever created: each gets a UUID of its own

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(g.device for g in self.gpus)

    def to_json(self) -> str:
        gpus = [
            {
                "device": g.device.as_dict(),
                "compute_capability": g.compute_capability,
                "mig": None if g.mig is None else [m.__dict__ for m in g.mig],
            }
            for g in self.gpus
        ]
        body = {"driver_version": self.driver_version, "cuda_version": self.cuda_version}
        return json.dumps({**body, "gpus": gpus, "mig_created": self.mig_created}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Machine:
        raw = json.loads(text)
        gpus = []
        for g in raw["gpus"]:
            links = tuple((int(peer), int(count)) for peer, count in g["device"]["nvlinks"])
            major, minor = g["compute_capability"]
            mig = g.get("mig")
            instances = None if mig is None else tuple(SimMig(**m) for m in mig)
            device = Device(**{**g["device"], "nvlinks": links})
            gpus.append(SimGpu(device, (major, minor), instances))
        return cls(
            raw["driver_version"], raw["cuda_version"], tuple(gpus), raw.get("mig_created", 0)
        )


class NoSimulatedNode(exits.CommandError):
    """A directory given as a simulated node that holds none."""


def check_root(root: str | os.PathLike[str]) -> None:
    """NoSimulatedNode, saying what to do, unless `root` holds a simulated node."""
    if not Path(root, MACHINE).is_file():
        raise NoSimulatedNode(
            f"{root}: no simulated node there ({MACHINE} is missing); "
            f"write one with gpuwire sim node {root}"
        )


def load_machine(root: str | os.PathLike[str]) -> Machine:
    check_root(root)
    return Machine.from_json(Path(root, MACHINE).read_text())


def product_memory(product: str) -> tuple[int, tuple[int, int]]:
    """Memory and compute capability of a product: the table, else `<N>GB` in its name."""
    if product in PRODUCTS:
        return PRODUCTS[product]
    digits = [
        p[:-2] for p in product.replace("-", " ").split() if p.endswith("GB") and p[:-2].isdigit()
    ]
    return (int(digits[0]) * 1024 if digits else 16384, (8, 0))


def _links(count: int, topology: str, index: int) -> tuple[tuple[int, int], ...]:
    if topology == "pairs":
        peer = index ^ 1
        return ((peer, NVLINKS_PER_PAIR),) if peer < count else ()
    if topology == "mesh":
        return tuple((peer, NVLINKS_PER_PAIR) for peer in range(count) if peer != index)
    return ()


def make_machine(
    gpus: int = 4,
    products: tuple[str, ...] = (DEFAULT_PRODUCT,),
    driver: str = DEFAULT_DRIVER,
    cuda: str = DEFAULT_CUDA,
    nvlink: str = "pairs",
    seed: str = "gpuwire",
) -> Machine:
    """A node's GPUs: products cycle over the indices; NUMA node 0 for the first half."""
    out = []
    for i in range(gpus):
        product = products[i % len(products)]
        memory, cc = product_memory(product)
        bus = _BUSES[i] if gpus <= len(_BUSES) else 0x07 + i * (0xF0 // max(gpus, 1))
        device = Device(
            index=i,
            minor=i,
            uuid="GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuwire-sim/{seed}/{i}")),
            pci_bus_id=f"0000:{bus:02x}:00.0",
            product=product,
            memory_mib=memory,
            numa_node=0 if i < (gpus + 1) // 2 else 1,
            nvlinks=_links(gpus, nvlink, i),
        )
        out.append(SimGpu(device, cc))
    return Machine(driver, cuda, tuple(out))


# -- MIG: the machine's instances -------------------------------------------------------


class MigChangeError(ValueError):
    """A MIG change the simulated GPU cannot make; the message says why."""


def _gpu(machine: Machine, index: int) -> SimGpu:
    if not 0 <= index < len(machine.gpus):
        raise MigChangeError(f"no GPU {index}: the node has GPUs 0-{len(machine.gpus) - 1}")
    return machine.gpus[index]


def _replaced(machine: Machine, index: int, gpu: SimGpu, created: int) -> Machine:
    gpus = tuple(gpu if i == index else g for i, g in enumerate(machine.gpus))
    return replace(machine, gpus=gpus, mig_created=machine.mig_created + created)


def set_mig_mode(machine: Machine, index: int, enabled: bool) -> Machine:
    """MIG mode on (no instances yet) or off (which needs no instance left, as nvidia-smi)."""
    gpu = _gpu(machine, index)
    if not gpu.mig_capable:
        raise MigChangeError(f"GPU {index} ({gpu.device.product}) does not support MIG")
    if not enabled and gpu.mig:
        raise MigChangeError(f"GPU {index} still has {len(gpu.mig)} MIG device(s)")
    mode = (gpu.mig or ()) if enabled else None
    return _replaced(machine, index, replace(gpu, mig=mode), 0)


def create_mig(machine: Machine, index: int, profile: str) -> Machine:
    """A new GPU instance of `profile` with one compute instance over all of it."""
    gpu = _gpu(machine, index)
    if gpu.mig is None:
        raise MigChangeError(f"GPU {index}: MIG mode is off")
    product = gpu.device.product
    try:
        start = migprofiles.place(product, profile, [(m.profile, m.start) for m in gpu.mig])
    except migprofiles.PlacementError as exc:
        raise MigChangeError(f"GPU {index}: {exc}") from None
    gi = migprofiles.profile(product, profile).gpu_instance(start)
    name = f"{gpu.device.uuid}/mig/{machine.mig_created}"
    uuid = "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuwire-sim/{name}"))
    instances = sorted((*gpu.mig, SimMig(gi, 0, profile, uuid, start)), key=lambda m: m.gi)
    return _replaced(machine, index, replace(gpu, mig=tuple(instances)), 1)


def destroy_mig(machine: Machine, index: int, gi: int) -> Machine:
    gpu = _gpu(machine, index)
    kept = tuple(m for m in gpu.mig or () if m.gi != gi)
    if gpu.mig is None or len(kept) == len(gpu.mig):
        have = ", ".join(str(m.gi) for m in gpu.mig or ()) or "none"
        raise MigChangeError(f"GPU {index} has no GPU instance {gi}; it has {have}")
    return _replaced(machine, index, replace(gpu, mig=kept), 0)


def with_mig(machine: Machine, index: int, profiles: tuple[str, ...]) -> Machine:
    """GPU `index` in MIG mode with instances of `profiles` (`balanced`: mig-parted's
    all-balanced for its model)."""
    machine = set_mig_mode(machine, index, True)
    product = machine.gpus[index].device.product
    for profile in migprofiles.BALANCED.get(product, ()) if profiles == ("balanced",) else profiles:
        machine = create_mig(machine, index, profile)
    return machine


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replaced whole: a part reading the node while it is rewritten (a MIG change, a fault)
    sees the old file or the new, as on a real node, never none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    atomicfile.replace(str(path), data.encode() if isinstance(data, str) else data, mode,
                       durable=False)  # fmt: skip


def _symlink(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.link")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target)
    os.replace(staged, path)


def _char_device(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if os.geteuid() == 0:
        os.mknod(path, mode | stat.S_IFCHR, os.makedev(major, minor))
    else:  # a placeholder: without root no test can open it anyway
        path.write_bytes(b"")


def pcie_path(d: Device) -> str:
    """Where sysfs keeps a simulated GPU: `pci0000:40/0000:40:01.0/0000:47:00.0`."""
    domain = d.pci_bus_id.split(":")[0]
    bus = (0x00, 0x40, 0x80, 0xC0)[d.index // 2 % 4]
    return f"pci{domain}:{bus:02x}/{domain}:{bus:02x}:01.0/{d.pci_bus_id}"


def cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """The capability minors of a GPU instance and of its compute instance, in the driver's
    table order (fabric-mgmt 0, mig/config 1, mig/monitor 2, then per GPU minor and GPU
    instance: its access, then its eight compute instances')."""
    gi_minor = 3 + (gpu_minor * CAP_GIS + gi) * (1 + CAP_CIS)
    return gi_minor, gi_minor + 1 + ci


def _mig_minors() -> str:
    lines = ["config 1", "monitor 2"]
    for n in range(CAP_GPUS):
        for g in range(CAP_GIS):
            gi_minor, _ = cap_minors(n, g, 0)
            lines.append(f"gpu{n}/gi{g}/access {gi_minor}")
            lines += [f"gpu{n}/gi{g}/ci{c}/access {gi_minor + 1 + c}" for c in range(CAP_CIS)]
    return "\n".join(lines) + "\n"


def _capability(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _write_mig(root: Path, machine: Machine) -> None:
    """What the driver and nvidia-modprobe show of MIG: what exists now, nothing else."""
    caps, nodes = root / nvidia.PROC_CAPABILITIES, root / "dev/nvidia-caps"
    final = caps
    caps = caps.with_name(f".{caps.name}.new")  # made beside, then swapped in at once
    shutil.rmtree(caps, ignore_errors=True)
    shutil.rmtree(nodes, ignore_errors=True)
    made = [(1, CONFIG_MODE), (2, ACCESS_MODE)]
    _write(caps / "mig/config", _capability(1, CONFIG_MODE))
    _write(caps / "mig/monitor", _capability(2, ACCESS_MODE))
    for g in machine.gpus:
        if g.mig is None:
            continue
        mig = caps / f"gpu{g.device.minor}/mig"
        mig.mkdir(parents=True, exist_ok=True)
        for m in g.mig:
            gi_cap, ci_cap = cap_minors(g.device.minor, m.gi, m.ci)
            _write(mig / f"gi{m.gi}/access", _capability(gi_cap, ACCESS_MODE))
            _write(mig / f"gi{m.gi}/ci{m.ci}/access", _capability(ci_cap, ACCESS_MODE))
            made += [(gi_cap, ACCESS_MODE), (ci_cap, ACCESS_MODE)]
    for minor, mode in made:
        _char_device(nodes / f"nvidia-cap{minor}", CAPS_MAJOR, minor, mode)
    gone = final.with_name(f".{final.name}.old")
    shutil.rmtree(gone, ignore_errors=True)
    if final.exists():
        os.rename(final, gone)
    os.rename(caps, final)
    shutil.rmtree(gone, ignore_errors=True)
    _write(root / MIG_MINORS, _mig_minors())


def _information(d: Device) -> str:
    return (
        f"Model: \t\t {d.product}\n"
        f"IRQ:   \t\t {100 + d.index}\n"
        f"GPU UUID: \t {d.uuid}\n"
        "Video BIOS: \t 92.00.36.00.02\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 47 bits\n"
        "DMA Mask: \t 0x7fffffffffff\n"
        f"Bus Location: \t {d.pci_bus_id}\n"
        f"Device Minor: \t {d.minor}\n"
        "GPU Excluded:\t No\n"
    )


HAMI_MARK = "gpuwire simulated HAMi-core"


def _nvidia_smi(machine: Machine) -> str:
    rows = []
    for g in machine.gpus:
        d = g.device
        rows.append(f"gpu {d.minor} {d.uuid} {d.memory_mib} {d.product}")
        for m in g.mig or ():
            gi_cap, ci_cap = cap_minors(d.minor, m.gi, m.ci)
            rows.append(f"mig {gi_cap} {ci_cap} {m.profile} {m.uuid}")
    table = "\n".join(rows)
    return f"""#!/bin/sh
# gpuwire simulated nvidia-smi (driver {machine.driver_version}): lists the GPUs whose device
# node this container can open (-L, the default), each with the MIG devices whose two
# capability nodes it can open, or their memory (--query-gpu=memory.total). With no driver
# loaded, an allowed open fails with ENXIO and a denied one with EPERM, so the error text
# tells which. Where the container preloads HAMi-core (the simulated library, named in
# /etc/ld.so.preload), memory is what HAMi-core's NVML hook reports: its limit.
allowed() {{
  [ -e "$1" ] || return 1
  case "$(cat "$1" 2>&1 >/dev/null)" in
    *"No such device or address"*|"") return 0 ;;
  esac
  return 1
}}
hami=""
if [ -r /etc/ld.so.preload ]; then
  while read -r lib; do
    grep -q "{HAMI_MARK}" "$lib" 2>/dev/null && hami=yes
  done < /etc/ld.so.preload
fi
mib() {{  # HAMi-core's limit syntax: g, m, k or bytes
  case "$1" in
    *[gG]) echo $(( ${{1%?}} * 1024 )) ;;
    *[mM]) echo "${{1%?}}" ;;
    *[kK]) echo $(( ${{1%?}} / 1024 )) ;;
    *) echo $(( $1 / 1048576 )) ;;
  esac
}}
if ! allowed /dev/nvidiactl; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit 9
fi
query=$1
n=0
shown=0
while read -r kind a b rest; do
  if [ "$kind" = gpu ]; then
    shown=0
    m=0
    allowed "/dev/nvidia$a" || continue
    memory=${{rest%% *}}
    if [ "$query" = "--query-gpu=memory.total" ]; then
      eval "limit=\\${{CUDA_DEVICE_MEMORY_LIMIT_$n:-$CUDA_DEVICE_MEMORY_LIMIT}}"
      if [ -n "$hami" ] && [ -n "$limit" ] && [ "$(mib "$limit")" -lt "$memory" ]; then
        memory=$(mib "$limit")
      fi
      echo "$memory MiB"
    else
      echo "GPU $n: ${{rest#* }} (UUID: $b)"
      shown=1
    fi
    n=$((n + 1))
  elif [ "$shown" = 1 ] && allowed "/dev/nvidia-caps/nvidia-cap$a" \\
      && allowed "/dev/nvidia-caps/nvidia-cap$b"; then
    set -- $rest
    printf '  MIG %-11s Device %2d: (UUID: %s)\\n' "$1" "$m" "$2"
    m=$((m + 1))
  fi
done <<'EOF'
{table}
EOF
if [ "$n" -eq 0 ]; then
  echo "No devices were found"
  exit 6
fi
"""


def write_node(root: str | os.PathLike[str], machine: Machine, layout: str = "debian") -> None:
    """Write the host root for `machine` under `root` (idempotent: files are replaced)."""
    root = Path(root)
    ver = machine.driver_version
    # device nodes
    for d in machine.devices:
        _char_device(root / "dev" / f"nvidia{d.minor}", nvidia.GPU_MAJOR, d.minor)
    for name, major_name, minor in (nvidia.CTL_NODE, nvidia.MODESET_NODE, *nvidia.UVM_NODES):
        major = UVM_MAJOR if major_name == "nvidia-uvm" else nvidia.GPU_MAJOR
        _char_device(root / "dev" / name, major, minor)
    # procfs
    _write(
        root / "proc/devices",
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n"
        f"{nvidia.GPU_MAJOR} nvidia\n{nvidia.GPU_MAJOR} nvidiactl\n"
        f"{CAPS_MAJOR} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n\n"
        "Block devices:\n  7 loop\n  8 sd\n",
    )
    proc = root / nvidia.PROC_DRIVER
    _write(
        proc / "version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {ver}  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    )
    _write(
        proc / "params", "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"
    )
    _write(proc / "registry", 'Binary: ""\n')
    for d in machine.devices:
        _write(proc / "gpus" / d.pci_bus_id / "information", _information(d))
    _write_mig(root, machine)
    # libraries: <name>.so.<ver>, the SONAME link, and the unversioned link for libcuda
    libdir = root / (nvidia.LIBDIR_DEBIAN if layout == "debian" else nvidia.LIBDIR_OTHER)
    for cap, names in nvidia.LIBRARIES.items():
        for name in names:
            soname = _SONAMES.get(name, f"{name}.1")
            _write(
                libdir / f"{name}.{ver}", shared_object(soname, f"gpuwire simulated {cap} {ver}")
            )
            _symlink(libdir / soname, f"{name}.{ver}")
    _symlink(libdir / "libcuda.so", "libcuda.so.1")
    # binaries
    bindir = root / nvidia.BINDIR
    for names in nvidia.BINARIES.values():
        for name in names:
            _write(
                bindir / name, f"#!/bin/sh\necho '{name}: gpuwire simulated driver {ver}'\n", 0o755
            )
    _write(bindir / "nvidia-smi", _nvidia_smi(machine), 0o755)
    # HAMi-core, where HAMi's device plugin installs it (a node config's hami-library)
    _write(root / HAMI_LIBRARY, shared_object("libvgpu.so", HAMI_MARK))
    # sysfs: each GPU under a PCIe root complex (a pair per root port, as behind the PCIe
    # switches of a DGX), with its NUMA node
    for d in machine.devices:
        path = pcie_path(d)
        _write(root / "sys/devices" / path / "numa_node", f"{d.numa_node}\n")
        _symlink(root / "sys/bus/pci/devices" / d.pci_bus_id, f"../../../devices/{path}")
    # firmware, machine, an empty fault stream
    for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        _write(root / nvidia.FIRMWARE_DIR / ver / fw, b"gpuwire simulated GSP firmware\n")
    _write(root / MACHINE, machine.to_json())
    events = root / EVENTS
    if not events.exists():
        _write(events, "")


def inject_fault(
    root: str | os.PathLike[str], uuid: str, xid: int, instance: tuple[int, int] | None = None
) -> None:
    """Append an XID event for GPU `uuid` (for one of its MIG devices: its GPU and compute
    instance ids, as NVML's event data says); the simulated NVML backend delivers it."""
    event: dict[str, object] = {"uuid": uuid, "xid": xid}
    if instance is not None:
        event["gi"], event["ci"] = instance
    with open(Path(root, EVENTS), "a") as f:
        f.write(json.dumps(event) + "\n")


def _mig_option(text: str) -> tuple[str, tuple[str, ...]]:
    """`--mig GPU=PROFILE,...`: GPU index or `all`; profiles may be empty or `balanced`."""
    gpu, sep, profiles = text.partition("=")
    if not sep or not (gpu == "all" or gpu.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected GPU=PROFILES, e.g. 0=3g.40gb,1g.10gb, all=balanced or 1= "
            "(MIG on, no instances)"
        )
    return gpu, tuple(p.strip() for p in profiles.split(",") if p.strip())


def _print_node(machine: Machine) -> None:
    for g in machine.gpus:
        d = g.device
        mode = "" if g.mig is None else f", MIG on ({len(g.mig)} device(s))"
        print(f"GPU {d.index}: {d.product} (UUID: {d.uuid}) bus {d.pci_bus_id}{mode}")
        for m in g.mig or ():
            print(f"  MIG {m.profile} GI {m.gi} CI {m.ci} (UUID: {m.uuid})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire sim node", description="Write a simulated GPU node."
    )
    parser.add_argument("dir", help="the node's root, written as a host's / (made if missing)")
    parser.add_argument(
        "--vendor", choices=("nvidia", "amd"), default="nvidia", help="whose GPUs (default nvidia)"
    )
    parser.add_argument("--gpus", type=int, help="how many (default: 4 NVIDIA, 8 AMD)")
    parser.add_argument(
        "--product", action="append", help=f"repeat to mix models (default {DEFAULT_PRODUCT!r})"
    )
    parser.add_argument(
        "--driver", default=DEFAULT_DRIVER, help="driver version (default %(default)s)"
    )
    parser.add_argument("--cuda", default=DEFAULT_CUDA, help="CUDA version (default %(default)s)")
    parser.add_argument(
        "--nvlink", choices=("pairs", "mesh", "none"), default="pairs",
        help="how the GPUs are linked (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--layout", choices=("debian", "rhel"), default="debian",
        help="where the driver's libraries go (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--seed", default="gpuwire", help="UUIDs derive from it (default %(default)s)"
    )
    parser.add_argument(
        "--mig",
        action="append",
        type=_mig_option,
        default=[],
        metavar="GPU=PROFILES",
        help="MIG mode on GPU (index or all) with instances of PROFILES (repeatable; "
        "e.g. 0=3g.40gb,2g.20gb,1g.10gb, all=balanced, 1= for none yet)",
    )
    amdsim.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.gpus is not None and args.gpus < 0:
        parser.error("--gpus must be 0 or more")
    if args.vendor == "amd":
        return amdsim.main(args, parser)
    machine = make_machine(
        4 if args.gpus is None else args.gpus,
        tuple(args.product or (DEFAULT_PRODUCT,)),
        args.driver,
        args.cuda,
        args.nvlink,
        args.seed,
    )
    try:
        for gpu, profiles in args.mig:
            for index in range(len(machine.gpus)) if gpu == "all" else (int(gpu),):
                machine = with_mig(machine, index, profiles)
    except MigChangeError as exc:
        parser.error(f"--mig: {exc}")
    _write_node_or_say(args.dir, machine, args.layout)
    _print_node(machine)
    if os.geteuid() != 0:
        print("not root: /dev/nvidia* are placeholder files, not character devices")
    return 0


def _write_node_or_say(root: str, machine: Machine, layout: str = "debian") -> None:
    try:
        write_node(root, machine, layout)
    except OSError as exc:
        raise exits.CommandError(f"{root}: cannot write the simulated node: {exc}") from None


def mig_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire sim mig",
        description="Change MIG on a simulated node, as nvidia-smi mig does on a real one: "
        "create GPU instances (each with one compute instance over all of it) or destroy them.",
    )
    parser.add_argument("dir", help="the simulated node (gpuwire sim node DIR)")
    parser.add_argument("--gpu", type=int, required=True, help="GPU index")
    parser.add_argument("--enable", action="store_true", help="turn MIG mode on first")
    parser.add_argument("--disable", action="store_true", help="turn MIG mode off last")
    parser.add_argument(
        "--create", action="append", default=[], metavar="PROFILE",
        help="create a GPU instance of PROFILE (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--destroy", action="append", default=[], type=int, metavar="GI",
        help="destroy GPU instance GI (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    machine = load_machine(args.dir)
    try:
        if args.enable:
            machine = set_mig_mode(machine, args.gpu, True)
        for gi in args.destroy:
            machine = destroy_mig(machine, args.gpu, gi)
        for profile in args.create:
            machine = create_mig(machine, args.gpu, profile)
        if args.disable:
            machine = set_mig_mode(machine, args.gpu, False)
    except MigChangeError as exc:
        parser.exit(2, f"{parser.prog}: {exc}; nothing changed\n")
    _write_node_or_say(args.dir, machine)
    _print_node(machine)
    return 0


def fault_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuwire sim fault", description="Inject an XID event.")
    parser.add_argument("dir", help="the simulated node (gpuwire sim node DIR)")
    parser.add_argument("--gpu", required=True, help="index, GPU UUID or MIG UUID")
    parser.add_argument("--xid", type=int, required=True, help="the XID to report (e.g. 79)")
    args = parser.parse_args(argv)
    machine = load_machine(args.dir)
    for g in machine.gpus:
        if args.gpu in (str(g.device.index), g.device.uuid):
            inject_fault(args.dir, g.device.uuid, args.xid)
            return 0
        for m in g.mig or ():
            if args.gpu == m.uuid:
                inject_fault(args.dir, g.device.uuid, args.xid, (m.gi, m.ci))
                return 0
    parser.error(f"no GPU or MIG device {args.gpu!r} on this node")
    return 2
