"""The simulated GPU node: a host root that looks, to every component, like a node with GPUs.

`gpuwire sim node DIR` writes what the driver puts on a real node, in the driver's formats:
`/dev/nvidia*` (character devices with the driver's majors when run as root; opening one in a
container then gives ENXIO where the cgroup allows it and EPERM where it does not),
`/proc/devices`, `/proc/driver/nvidia/{version,params,gpus/<bus>/information}`, the driver's
libraries (real ELF shared objects with the driver's SONAMEs, so ldconfig treats them as it
would the real ones) and binaries (a `nvidia-smi` that lists the GPUs a container can open),
GSP firmware, and a machine file (the simulated GPUs) the simulated NVML backend reads, with
an event file for injected faults (XIDs).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from gpuwire import nvidia
from gpuwire.devices import Device
from gpuwire.elfstub import shared_object

MACHINE = "var/lib/gpuwire-sim/machine.json"
HAMI_LIBRARY = "usr/local/vgpu/libvgpu.so"
EVENTS = "var/lib/gpuwire-sim/events.jsonl"
UVM_MAJOR = 510  # dynamic on a real node: readers must take it from /proc/devices

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
class SimGpu:
    device: Device
    compute_capability: tuple[int, int]


@dataclass(frozen=True)
class Machine:
    driver_version: str
    cuda_version: str
    gpus: tuple[SimGpu, ...]

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(g.device for g in self.gpus)

    def to_json(self) -> str:
        gpus = [
            {"device": g.device.as_dict(), "compute_capability": g.compute_capability}
            for g in self.gpus
        ]
        body = {"driver_version": self.driver_version, "cuda_version": self.cuda_version}
        return json.dumps({**body, "gpus": gpus}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Machine:
        raw = json.loads(text)
        gpus = []
        for g in raw["gpus"]:
            links = tuple((int(peer), int(count)) for peer, count in g["device"]["nvlinks"])
            major, minor = g["compute_capability"]
            gpus.append(SimGpu(Device(**{**g["device"], "nvlinks": links}), (major, minor)))
        return cls(raw["driver_version"], raw["cuda_version"], tuple(gpus))


def load_machine(root: str | os.PathLike[str]) -> Machine:
    return Machine.from_json(Path(root, MACHINE).read_text())


def brand(product: str) -> str:
    """The brand NVML reports for a product: its first word where that is a brand, else
    NVIDIA's own (data-center GPUs since the A100)."""
    first = product.split()[0] if product else ""
    return first if first in ("Tesla", "Quadro", "GeForce", "Titan") else "Nvidia"


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


def _write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    path.chmod(mode)


def _symlink(path: Path, target: str) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def _char_device(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if os.geteuid() == 0:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    else:  # a placeholder: without root no test can open it anyway
        path.write_bytes(b"")


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
    table = "\n".join(f"{d.minor} {d.uuid} {d.memory_mib} {d.product}" for d in machine.devices)
    return f"""#!/bin/sh
# gpuwire simulated nvidia-smi (driver {machine.driver_version}): lists the GPUs whose device
# node this container can open (-L, the default), or their memory (--query-gpu=memory.total).
# With no driver loaded, an allowed open fails with ENXIO and a denied one with EPERM, so the
# error text tells which. Where the container preloads HAMi-core (the simulated library, named
# in /etc/ld.so.preload), memory is what HAMi-core's NVML hook reports: its limit.
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
n=0
while read -r minor uuid memory product; do
  allowed "/dev/nvidia$minor" || continue
  if [ "$1" = "--query-gpu=memory.total" ]; then
    eval "limit=\\${{CUDA_DEVICE_MEMORY_LIMIT_$n:-$CUDA_DEVICE_MEMORY_LIMIT}}"
    if [ -n "$hami" ] && [ -n "$limit" ] && [ "$(mib "$limit")" -lt "$memory" ]; then
      memory=$(mib "$limit")
    fi
    echo "$memory MiB"
  else
    echo "GPU $n: $product (UUID: $uuid)"
  fi
  n=$((n + 1))
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
        f"{UVM_MAJOR - 1} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n\n"
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
    # firmware, machine, an empty fault stream
    for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        _write(root / nvidia.FIRMWARE_DIR / ver / fw, b"gpuwire simulated GSP firmware\n")
    _write(root / MACHINE, machine.to_json())
    events = root / EVENTS
    if not events.exists():
        _write(events, "")


def inject_fault(root: str | os.PathLike[str], uuid: str, xid: int) -> None:
    """Append an XID event for `uuid`; the simulated NVML backend delivers it."""
    with open(Path(root, EVENTS), "a") as f:
        f.write(json.dumps({"uuid": uuid, "xid": xid}) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire sim node", description="Write a simulated GPU node."
    )
    parser.add_argument("dir")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument(
        "--product", action="append", help=f"repeat to mix models (default {DEFAULT_PRODUCT!r})"
    )
    parser.add_argument("--driver", default=DEFAULT_DRIVER)
    parser.add_argument("--cuda", default=DEFAULT_CUDA)
    parser.add_argument("--nvlink", choices=("pairs", "mesh", "none"), default="pairs")
    parser.add_argument("--layout", choices=("debian", "rhel"), default="debian")
    parser.add_argument("--seed", default="gpuwire", help="UUIDs derive from it")
    args = parser.parse_args(argv)
    if args.gpus < 0:
        parser.error("--gpus must be 0 or more")
    machine = make_machine(
        args.gpus,
        tuple(args.product or (DEFAULT_PRODUCT,)),
        args.driver,
        args.cuda,
        args.nvlink,
        args.seed,
    )
    write_node(args.dir, machine, args.layout)
    for d in machine.devices:
        print(f"GPU {d.index}: {d.product} (UUID: {d.uuid}) bus {d.pci_bus_id}")
    if os.geteuid() != 0:
        print("not root: /dev/nvidia* are placeholder files, not character devices")
    return 0


def fault_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuwire sim fault", description="Inject an XID event.")
    parser.add_argument("dir")
    parser.add_argument("--gpu", required=True, help="index or UUID")
    parser.add_argument("--xid", type=int, required=True)
    args = parser.parse_args(argv)
    devices = load_machine(args.dir).devices
    match = [d for d in devices if args.gpu in (str(d.index), d.uuid)]
    if not match:
        parser.error(f"no GPU {args.gpu!r} on this node")
    inject_fault(args.dir, match[0].uuid, args.xid)
    return 0
