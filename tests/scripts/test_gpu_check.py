"""scripts/gpu-check on a machine without an NVIDIA GPU: one clear line and exit status 1,
at once, not a traceback (the checks themselves need a real GPU: docs/device-plugin.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts.conftest import SCRIPT

PROC_GPUS = Path("/proc/driver/nvidia/gpus")

pytestmark = pytest.mark.skipif(
    PROC_GPUS.is_dir(), reason="this machine has an NVIDIA driver: run scripts/gpu-check itself"
)


def run_gpu_check(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env={"PATH": path}, capture_output=True, text=True
    )


def test_without_driver_or_gpu_it_says_so_and_fails() -> None:
    done = run_gpu_check(os.defpath)
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
    done = run_gpu_check(f"{tmp_path}:{os.defpath}")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        f"FAIL NVIDIA driver: no NVIDIA GPU/driver found: no GPU in {PROC_GPUS} (is the nvidia "
        "kernel module loaded?)"
    )


CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.mark.skipif(not (CUDA / "include/cuda.h").exists(), reason=f"no CUDA toolkit at {CUDA}")
def test_the_mps_checks_program_builds_with_the_toolkit_and_says_why_it_cannot_run(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    """gpu_alloc.c, what the MPS check's containers run, builds clean (-Wall -Wextra
    -Werror) against the toolkit's cuda.h; on a machine without a driver it fails at once
    with one clear line."""
    program = gpu_check.build_gpu_alloc(tmp_path)
    assert isinstance(program, Path), program
    done = subprocess.run([str(program), "1024"], capture_output=True, text=True, env={})
    assert done.returncode == 2
    assert done.stdout.startswith("cannot load libcuda.so.1: ")


def test_without_the_toolkit_the_mps_check_says_what_it_needs(
    gpu_check: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    assert gpu_check.build_gpu_alloc(tmp_path) == (
        f"no {tmp_path}/no-cuda/include/cuda.h: the CUDA toolkit builds gpu_alloc.c (CUDA_HOME)"
    )
