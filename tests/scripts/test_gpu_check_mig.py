"""scripts/gpu-check's MIG checks, run here on a simulated MIG node through the NVML stand-in
(on a real GPU they read NVML, procfs and nvidia-smi): what they report and what fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from deviceplugin.gpus.nvml import NvmlDiscovery
from gpuwire import sim
from testbed.nvml import StandIn


def smi_listing(root: Path, tmp_path: Path) -> str:
    """The simulated nvidia-smi -L run where every device node opens (the host's view)."""
    dev = tmp_path / "dev"
    for node in (root / "dev").rglob("nvidia*"):
        target = dev / node.relative_to(root / "dev")
        if not node.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
    script = (root / "usr/bin/nvidia-smi").read_text().replace("/dev/", f"{dev}/")
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout


def test_mig_checks_pass_on_a_node_whose_sources_agree(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = sim.with_mig(sim.with_mig(sim.make_machine(gpus=3), 0, ("balanced",)), 1, ())
    root = tmp_path / "node"
    sim.write_node(root, machine)
    nvml = NvmlDiscovery(StandIn.of_machine(machine).module(), proc=str(root))
    node = nvml.discover()
    listed = smi_listing(root, tmp_path)
    assert len(gpu_check.smi_mig(listed)) == 4
    gpu_check.check_mig(node, nvml.unmatched, listed, str(root))
    out = capsys.readouterr().out
    assert "     GPU 0 MIG mode enabled, 4 MIG device(s)\n" in out
    assert "     GPU 1 MIG mode enabled, 0 MIG device(s)\n" in out
    assert "     GPU 2 MIG mode disabled\n" in out
    assert "PASS MIG discovery (procfs) matches NVML: 4 MIG device(s)" in out
    assert "PASS the MIG map names the MIG devices as NVML does\n" in out
    assert "PASS nvidia-smi -L lists NVML's MIG devices: UUIDs and profiles\n" in out
    assert gpu_check.RESULTS == [True, True, True]


def test_a_mig_device_procfs_does_not_show_fails(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = sim.with_mig(sim.make_machine(gpus=1), 0, ("3g.40gb", "1g.10gb"))
    root = tmp_path / "node"
    sim.write_node(root, machine)
    big = (machine.gpus[0].mig or ())[0]
    shutil.rmtree(root / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{big.gi}")
    nvml = NvmlDiscovery(StandIn.of_machine(machine).module(), proc=str(root))
    gpu_check.check_mig(nvml.discover(), nvml.unmatched, smi_listing(root, tmp_path), str(root))
    out = capsys.readouterr().out
    assert f"NVML's not in procfs (GPU, GI, CI): [(0, {big.gi}, 0)]" in out
    assert "FAIL MIG discovery (procfs) matches NVML" in out
    assert "FAIL nvidia-smi -L lists NVML's MIG devices" in out  # it lists the 3g.40gb


def test_without_mig_devices_it_says_why_nothing_was_checked(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine = sim.make_machine(gpus=1, products=("NVIDIA L4",))
    root = tmp_path / "node"
    sim.write_node(root, machine)
    nvml = NvmlDiscovery(StandIn.of_machine(machine).module(), proc=str(root))
    gpu_check.check_mig(nvml.discover(), [], "", str(root))
    out = capsys.readouterr().out
    assert "     GPU 0 MIG mode not supported\n" in out
    assert "gpu-check never creates one" in out
    assert gpu_check.RESULTS == []
