"""Discovery reads the driver's own formats: the simulated node writes exactly those."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuwire import driver as discovery
from gpuwire import elf, nvidia, sim
from gpuwire.devices import Device
from gpuwire.driver import DiscoveryError, discover, parse_proc_devices, parse_version
from gpuwire.elfstub import shared_object
from gpuwire.roots import Roots

VERSION = sim.DEFAULT_DRIVER


def test_gpus_come_in_pci_bus_order_with_the_drivers_numbers(
    sim_node: tuple[Path, sim.Machine],
) -> None:
    root, machine = sim_node
    driver = discover(Roots(str(root)))
    assert driver.version == VERSION
    assert [(d.index, d.minor, d.uuid, d.pci_bus_id, d.product) for d in driver.devices] == [
        (d.index, d.minor, d.uuid, d.pci_bus_id, d.product) for d in machine.devices
    ]
    nodes = {n: (c.major, c.minor) for n, c in driver.control_nodes.items()}
    assert nodes == {
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (sim.UVM_MAJOR, 0),  # dynamic: from /proc/devices, not assumed
        "nvidia-uvm-tools": (sim.UVM_MAJOR, 1),
    }


def test_index_order_is_bus_order_not_directory_order(tmp_path: Path) -> None:
    """GPUs whose minors run against their bus order still get NVML's (bus) indices."""
    machine = sim.make_machine(gpus=3)
    swapped = tuple(
        sim.SimGpu(
            Device(g.device.index, 2 - g.device.minor, g.device.uuid, g.device.pci_bus_id, "X"),
            g.compute_capability,
        )
        for g in machine.gpus
    )
    sim.write_node(tmp_path, sim.Machine(VERSION, "12.4", swapped))
    found = discover(Roots(str(tmp_path))).devices
    assert [d.pci_bus_id for d in found] == sorted(d.pci_bus_id for d in found)
    assert [(d.index, d.minor) for d in found] == [(0, 2), (1, 1), (2, 0)]


def test_libraries_binaries_and_firmware_per_capability(
    sim_node: tuple[Path, sim.Machine],
) -> None:
    root, _ = sim_node
    driver = discover(Roots(str(root)))
    libdir = root / nvidia.LIBDIR_DEBIAN
    cuda = {lib.name: lib for lib in driver.libraries["compute"]}[f"libcuda.so.{VERSION}"]
    assert cuda.host_path == str(libdir / f"libcuda.so.{VERSION}")
    assert cuda.soname == "libcuda.so.1"
    glx = {lib.name: lib.soname for lib in driver.libraries["graphics"]}
    assert glx[f"libGLX_nvidia.so.{VERSION}"] == "libGLX_nvidia.so.0"  # read from the ELF
    assert {b.name for b in driver.binaries["utility"]} == set(nvidia.BINARIES["utility"])
    assert [f.name for f in driver.firmware] == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    for cap in ("utility", "compute", "video", "graphics", "ngx"):
        assert {lib.name for lib in driver.libraries[cap]} == {
            f"{n}.{VERSION}" for n in nvidia.LIBRARIES[cap]
        }


def test_only_the_capabilities_asked_for_are_looked_up(
    sim_node: tuple[Path, sim.Machine],
) -> None:
    root, _ = sim_node
    driver = discover(Roots(str(root)), ("video",))
    assert set(driver.libraries) == {"compute", "video"}  # video needs compute's libraries
    assert set(driver.binaries) == {"video"}  # ... but not its binaries


def test_rhel_layout(tmp_path: Path) -> None:
    sim.write_node(tmp_path, sim.make_machine(gpus=2), layout="rhel")
    driver = discover(Roots(str(tmp_path)), ("compute",))
    assert {Path(lib.host_path).parent for lib in driver.libraries["compute"]} == {
        tmp_path / "usr/lib64"
    }


def test_driver_container_root_resolves_its_links_inside_itself(tmp_path: Path) -> None:
    """A driver container's `usr/lib64 -> /opt/nvidia/lib64` means its own /opt, not the host's."""
    driver_root, proc_root = tmp_path / "driver", tmp_path / "host"
    sim.write_node(proc_root, sim.make_machine(gpus=1), layout="rhel")
    shutil.copytree(proc_root / "usr/lib64", driver_root / "opt/nvidia/lib64", symlinks=True)
    shutil.copytree(proc_root / "usr/bin", driver_root / "usr/bin")
    (driver_root / "usr/lib64").symlink_to("/opt/nvidia/lib64")
    driver = discover(Roots(str(proc_root), driver=str(driver_root)), ("compute", "utility"))
    assert driver.devices
    assert driver.libraries["compute"]
    for lib in driver.libraries["compute"]:
        assert lib.host_path.startswith(f"{driver_root}/opt/nvidia/lib64/"), lib
    assert all(b.host_path.startswith(str(driver_root)) for b in driver.binaries["utility"])


def test_compat32_finds_32_bit_libraries_and_never_a_64_bit_one(
    sim_node: tuple[Path, sim.Machine],
) -> None:
    root, _ = sim_node
    lib32 = root / nvidia.LIBDIR_DEBIAN_32
    lib32.mkdir(parents=True)
    (lib32 / f"libcuda.so.{VERSION}").write_bytes(shared_object("libcuda.so.1", bits=32))
    # A 64-bit file in a 32-bit directory is not a 32-bit library.
    shutil.copy(
        root / nvidia.LIBDIR_DEBIAN / f"libnvidia-ml.so.{VERSION}",
        lib32 / f"libnvidia-ml.so.{VERSION}",
    )
    driver = discover(Roots(str(root)), ("compute", "utility", "compat32"))
    assert [(lib.name, lib.soname) for lib in driver.libraries32["compute"]] == [
        (f"libcuda.so.{VERSION}", "libcuda.so.1")
    ]
    assert driver.libraries32["utility"] == ()


def test_separate_dev_root_decides_which_control_nodes_exist(
    sim_node: tuple[Path, sim.Machine], tmp_path: Path
) -> None:
    root, _ = sim_node
    dev_root = tmp_path / "devroot"
    (dev_root / "dev").mkdir(parents=True)
    (dev_root / "dev/nvidiactl").write_bytes(b"")
    driver = discover(Roots(str(root), dev=str(dev_root)), ("utility",))
    assert set(driver.control_nodes) == {"nvidiactl"}
    assert driver.control_nodes["nvidiactl"].host_path == f"{dev_root}/dev/nvidiactl"


def test_no_driver_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"no NVIDIA driver: .*version is missing"):
        discover(Roots(str(tmp_path)))


def test_malformed_information_names_the_file(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    info = root / nvidia.PROC_DRIVER / "gpus" / machine.devices[1].pci_bus_id / "information"
    info.write_text("Model: \t NVIDIA A100\nGPU UUID: \t GPU-x\n")
    with pytest.raises(DiscoveryError, match=f"{info}: missing or malformed field 'Bus Location'"):
        discover(Roots(str(root)))


def test_version_formats_of_proprietary_and_open_modules() -> None:
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release\n"
    assert parse_version(proprietary) == "550.54.15"
    assert parse_version(open_module) == "570.86.15"
    with pytest.raises(DiscoveryError):
        parse_version("NVRM version: garbage\n")


def test_proc_devices_only_character_section() -> None:
    text = "Character devices:\n195 nvidia\n507 nvidia-uvm\n\nBlock devices:\n259 blkext\n"
    assert parse_proc_devices(text) == {"nvidia": 195, "nvidia-uvm": 507}


def test_discovery_opens_nothing_it_does_not_close(sim_node: tuple[Path, sim.Machine]) -> None:
    root, _ = sim_node
    before = len(os.listdir("/proc/self/fd"))
    discover(Roots(str(root)))
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_library_replaced_on_disk_is_seen_by_the_next_discovery(
    sim_node: tuple[Path, sim.Machine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Facts are remembered by file identity, not path: an upgrade's new file is read."""
    root, _ = sim_node
    monkeypatch.setattr(discovery, "_SETTLED_NS", 0)  # the node's files were written just now
    real_read, reads = elf.read, []

    def read(fd: int) -> elf.Elf:
        reads.append(fd)
        return real_read(fd)

    monkeypatch.setattr(elf, "read", read)
    path = root / nvidia.LIBDIR_DEBIAN / f"libcuda.so.{VERSION}"
    assert _cuda_soname(root) == "libcuda.so.1"
    first = len(reads)
    assert _cuda_soname(root) == "libcuda.so.1"
    assert len(reads) == first  # nothing changed: no header read again
    new = path.with_name("new")
    new.write_bytes(shared_object("libcuda.so.2"))
    new.replace(path)  # as a package upgrade does: a new inode under the old name
    assert _cuda_soname(root) == "libcuda.so.2"


def test_a_library_rewritten_in_place_just_now_is_read_again(tmp_path: Path) -> None:
    """A rewrite within one timestamp tick keeps inode, size and times: a file changed in
    the last second is not remembered, so the stat identity it had is never trusted."""
    path = tmp_path / "libcuda.so.1"
    path.write_bytes(shared_object("libcuda.so.1"))
    with open(path, "r+b") as f:
        same_tick = os.fstat(f.fileno())
        assert discovery._library_facts(f.fileno(), same_tick)[1] == "libcuda.so.1"
        f.write(shared_object("libcuda.so.7"))  # the same inode, the same size
        f.flush()
        assert discovery._library_facts(f.fileno(), same_tick)[1] == "libcuda.so.7"


def _cuda_soname(root: Path) -> str | None:
    (cuda,) = (
        lib
        for lib in discover(Roots(str(root)), ("compute",)).libraries["compute"]
        if lib.name == f"libcuda.so.{VERSION}"
    )
    return cuda.soname
