"""scripts/gpu-check on a machine without an NVIDIA GPU: one clear line and exit status 1,
at once, not a traceback (the checks themselves need a real GPU: docs/device-plugin.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/gpu-check"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")

pytestmark = pytest.mark.skipif(
    PROC_GPUS.is_dir(), reason="this machine has an NVIDIA driver: run scripts/gpu-check itself"
)


def gpu_check(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env={"PATH": path}, capture_output=True, text=True
    )


def test_without_driver_or_gpu_it_says_so_and_fails() -> None:
    done = gpu_check(os.defpath)
    assert done.returncode == 1
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        f"FAIL NVIDIA driver: no NVIDIA GPU/driver found: no GPU in {PROC_GPUS} (is the nvidia "
        "kernel module loaded?); no nvidia-smi on PATH",
        "gpu-check: 0 passed, 1 failed",
    ]


def test_nvidia_smi_alone_is_not_a_gpu(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    done = gpu_check(f"{tmp_path}:{os.defpath}")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        f"FAIL NVIDIA driver: no NVIDIA GPU/driver found: no GPU in {PROC_GPUS} (is the nvidia "
        "kernel module loaded?)"
    )
