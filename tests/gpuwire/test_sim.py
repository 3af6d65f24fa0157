"""The simulated node writes what the driver writes, in the driver's formats."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpuwire import cli, sim
from tests.conftest import requires_binary, requires_root


def test_procfs_in_bus_order(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    gpus = sorted((root / "proc/driver/nvidia/gpus").iterdir())
    assert [g.name for g in gpus] == [d.pci_bus_id for d in machine.devices]
    info = (gpus[1] / "information").read_text()
    assert f"GPU UUID: \t {machine.devices[1].uuid}\n" in info
    assert "Device Minor: \t 1\n" in info
    assert "Model: \t\t NVIDIA A100-SXM4-80GB\n" in info
    assert "550.54.15" in (root / "proc/driver/nvidia/version").read_text()
    assert "510 nvidia-uvm" in (root / "proc/devices").read_text()


def test_inventory_round_trips_with_nvlink_pairs(sim_node: tuple[Path, sim.Machine]) -> None:
    root, machine = sim_node
    loaded = sim.load_machine(root)
    assert loaded == machine
    d = loaded.devices
    assert d[0].links_to(1) == 12
    assert d[0].links_to(2) == 0
    assert d[3].links_to(2) == 12
    assert [x.numa_node for x in d] == [0, 0, 1, 1]
    assert len({x.uuid for x in d}) == 4


def test_mixed_products_and_memory() -> None:
    machine = sim.make_machine(
        gpus=3, products=("Tesla T4", "NVIDIA H100 80GB HBM3"), nvlink="none"
    )
    assert [d.product for d in machine.devices] == ["Tesla T4", "NVIDIA H100 80GB HBM3", "Tesla T4"]
    assert machine.devices[0].memory_mib == 15360
    assert machine.gpus[1].compute_capability == (9, 0)
    assert all(not d.nvlinks for d in machine.devices)
    assert sim.product_memory("NVIDIA Future 96GB")[0] == 96 * 1024


@requires_root()
def test_device_nodes_are_char_devices_with_driver_majors(
    sim_node: tuple[Path, sim.Machine],
) -> None:
    root, _ = sim_node
    st = os.stat(root / "dev/nvidia2")
    assert stat.S_ISCHR(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 2)
    ctl = os.stat(root / "dev/nvidiactl").st_rdev
    assert (os.major(ctl), os.minor(ctl)) == (195, 255)
    assert os.major(os.stat(root / "dev/nvidia-uvm-tools").st_rdev) == sim.UVM_MAJOR
    with pytest.raises(OSError, match="No such device"):
        open(root / "dev/nvidia0", "rb")  # noqa: SIM115 - no driver: ENXIO, as in a container


@requires_binary("ldconfig", "readelf")
def test_libraries_are_elf_with_driver_sonames(sim_node: tuple[Path, sim.Machine]) -> None:
    root, _ = sim_node
    lib = root / "usr/lib/x86_64-linux-gnu"
    out = subprocess.run(
        ["readelf", "-d", lib / "libcuda.so.550.54.15"], capture_output=True, text=True, check=True
    ).stdout
    assert "Library soname: [libcuda.so.1]" in out
    assert os.readlink(lib / "libcuda.so.1") == "libcuda.so.550.54.15"
    assert os.readlink(lib / "libGLX_nvidia.so.0") == "libGLX_nvidia.so.550.54.15"


def test_fake_nvidia_smi_lists_only_openable_gpus(
    sim_node: tuple[Path, sim.Machine], tmp_path: Path
) -> None:
    """Run the script against a fake /dev via a path rewrite: regular files open fine."""
    root, machine = sim_node
    script = (root / "usr/bin/nvidia-smi").read_text()
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").write_bytes(b"")
    (dev / "nvidia2").write_bytes(b"")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", script.replace("/dev/", f"{dev}/"), "nvidia-smi", "-L"],
            capture_output=True,
            text=True,
        )

    out = run()
    assert out.returncode == 0
    assert out.stdout == f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {machine.devices[2].uuid})\n"
    (dev / "nvidia2").unlink()
    assert run().returncode == 6
    (dev / "nvidiactl").unlink()
    assert run().returncode == 9


def test_cli_sim_node_and_fault(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "n"
    assert cli.main(["sim", "node", str(root), "--gpus", "2", "--layout", "rhel"]) == 0
    assert "GPU 1: NVIDIA A100-SXM4-80GB" in capsys.readouterr().out
    assert (root / "usr/lib64/libnvidia-ml.so.550.54.15").is_file()
    uuid = sim.load_machine(root).devices[1].uuid
    assert cli.main(["sim", "fault", str(root), "--gpu", "1", "--xid", "79"]) == 0
    assert (root / sim.EVENTS).read_text() == f'{{"uuid": "{uuid}", "xid": 79}}\n'


def test_mig_layout_follows_creates_and_destroys(tmp_path: Path) -> None:
    root = tmp_path / "n"
    assert cli.main(["sim", "node", str(root), "--gpus", "2", "--mig", "0=3g.40gb,1g.10gb"]) == 0
    caps = root / "proc/driver/nvidia/capabilities"
    # 3g.40gb takes memory slices 0-3 (GI 1), 1g.10gb the first free one, 4 (GI 11)
    assert sorted(p.name for p in (caps / "gpu0/mig").iterdir()) == ["gi1", "gi11"]
    assert (caps / "gpu0/mig/gi1/ci0/access").read_text() == (
        "DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    assert not (caps / "gpu1").exists()  # MIG off
    args = ["sim", "mig", str(root), "--gpu", "0", "--destroy", "1", "--create", "2g.20gb"]
    assert cli.main(args) == 0
    assert sorted(p.name for p in (caps / "gpu0/mig").iterdir()) == ["gi11", "gi3"]
    nodes = sorted(p.name for p in (root / "dev/nvidia-caps").iterdir())
    assert nodes == sorted(f"nvidia-cap{m}" for m in (1, 2, 30, 31, 102, 103))
    machine = sim.load_machine(root)
    assert [(m.gi, m.profile) for m in machine.gpus[0].mig or ()] == [
        (3, "2g.20gb"),
        (11, "1g.10gb"),
    ]
    assert "\nmig 30 31 2g.20gb MIG-" in (root / "usr/bin/nvidia-smi").read_text()


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (["--create", "4g.40gb", "--create", "4g.40gb"], "at most 1 of it"),
        (["--create", "7g.80gb", "--create", "1g.10gb"], "1 compute slices, 0 are free"),
        (["--create", "5g.50gb"], "has no MIG profile '5g.50gb'; its profiles: 1g.10gb"),
        (["--destroy", "9"], "GPU 0 has no GPU instance 9; it has none"),
        (["--create", "1g.10gb", "--disable"], "GPU 0 still has 1 MIG device(s)"),
    ],
)
def test_mig_changes_the_gpu_cannot_make_change_nothing(
    tmp_path: Path, changes: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "n"
    sim.write_node(root, sim.with_mig(sim.make_machine(gpus=1), 0, ()))
    before = (root / sim.MACHINE).read_text()
    with pytest.raises(SystemExit):
        cli.main(["sim", "mig", str(root), "--gpu", "0", *changes])
    assert says in capsys.readouterr().err
    assert (root / sim.MACHINE).read_text() == before


def test_only_mig_models_take_mig_and_uuids_are_never_reused() -> None:
    machine = sim.make_machine(gpus=2, products=("NVIDIA H200", "Tesla T4"))
    with pytest.raises(sim.MigChangeError, match=r"GPU 1 \(Tesla T4\) does not support MIG"):
        sim.with_mig(machine, 1, ())
    machine = sim.with_mig(machine, 0, ("balanced",))
    assert [m.profile for m in machine.gpus[0].mig or ()] == [
        "3g.71gb",
        "2g.35gb",
        "1g.18gb",
        "1g.18gb",
    ]
    gone = (machine.gpus[0].mig or ())[3]
    again = sim.create_mig(sim.destroy_mig(machine, 0, gone.gi), 0, "1g.18gb")
    back = (again.gpus[0].mig or ())[3]
    assert (back.gi, back.profile) == (gone.gi, gone.profile)
    assert back.uuid != gone.uuid
    assert sim.Machine.from_json(again.to_json()) == again


def test_fake_nvidia_smi_lists_the_mig_devices_it_can_open(tmp_path: Path) -> None:
    root = tmp_path / "n"
    machine = sim.with_mig(sim.make_machine(gpus=1), 0, ("3g.40gb", "1g.10gb"))
    sim.write_node(root, machine)
    big, small = machine.gpus[0].mig or ()
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    own = sim.cap_minors(0, small.gi, small.ci)
    for name in ("nvidiactl", "nvidia0", *(f"nvidia-caps/nvidia-cap{m}" for m in own)):
        (dev / name).write_bytes(b"")
    script = (root / "usr/bin/nvidia-smi").read_text().replace("/dev/", f"{dev}/")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert out.stdout == (
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {machine.devices[0].uuid})\n"
        f"  MIG 1g.10gb     Device  0: (UUID: {small.uuid})\n"
    )
    assert sim.cap_minors(0, big.gi, big.ci) == (12, 13)  # not in this /dev


def test_fault_on_a_mig_device_names_its_instance(tmp_path: Path) -> None:
    root = tmp_path / "n"
    machine = sim.with_mig(sim.make_machine(gpus=1), 0, ("1g.10gb",))
    sim.write_node(root, machine)
    (device,) = machine.gpus[0].mig or ()
    assert cli.main(["sim", "fault", str(root), "--gpu", device.uuid, "--xid", "94"]) == 0
    line = (root / sim.EVENTS).read_text()
    assert line == f'{{"uuid": "{machine.devices[0].uuid}", "xid": 94, "gi": 7, "ci": 0}}\n'
