"""Proof with real podman: the CDI spec `gpuwire cdi generate` writes gives a container the
same GPU view as the shim and the hook do under runc (tests/system/test_runc.py).

podman applies the spec itself: device nodes with cgroup rules, read-only mounts, env, and
the `gpuwire-hook ldcache` createRuntime hook. A requested device node opens with ENXIO
(the cgroup allows it, no driver answers); one not requested does not exist.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.image import NAME, write_layout_tar
from testbed.lab import Lab
from testbed.podman import Podman
from testbed.view import VIEW_SCRIPT, granted_view, shown, view
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("podman", "runc", "unshare", "busybox")]

GPUWIRE = str(Path(sys.executable).parent / "gpuwire")
CONTROL = "nvidia-modeset nvidia-uvm nvidia-uvm-tools"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("podman") / "lab")


@pytest.fixture(scope="module")
def podman(lab: Lab) -> Iterator[Podman]:
    """One private podman for the module, holding the busybox image and the node's spec."""
    with Podman.create() as instance:
        instance.load(write_layout_tar(lab.root / "busybox.tar"))
        out = subprocess.run(
            [GPUWIRE, "cdi", "generate", "--output", str(instance.cdi_dir / "nvidia.yaml")],
            env={"GPUWIRE_CONFIG": str(lab.config)},
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        yield instance


def gpu_view(podman: Podman, *devices: str) -> dict[str, list[str]]:
    out = podman.run(
        NAME, ["sh", "-c", VIEW_SCRIPT], devices=[f"nvidia.com/gpu={d}" for d in devices]
    )
    assert out.returncode == 0, out.stderr
    return view(out.stdout)


def smi(lab: Lab, *indices: int) -> list[str]:
    return [f"GPU {n}: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(i)})" for n, i in enumerate(indices)]


def test_device_by_index_gives_exactly_that_gpu(lab: Lab, podman: Podman) -> None:
    seen = gpu_view(podman, "1")
    expected = granted_view(
        lab.machine.devices, (1,), CONTROL
    )  # busybox has no ldconfig: the hook's ran
    assert shown(seen, expected) == expected
    assert seen["env"] == ["void"]  # nothing further down injects again


def test_devices_by_uuid_and_several(lab: Lab, podman: Podman) -> None:
    expected = granted_view(lab.machine.devices, (0, 3), CONTROL)
    assert shown(gpu_view(podman, lab.uuid(3), "0"), expected) == expected


def test_all(lab: Lab, podman: Podman) -> None:
    expected = granted_view(lab.machine.devices, (0, 1, 2, 3), CONTROL)
    assert shown(gpu_view(podman, "all"), expected) == expected


def test_no_device_no_gpu(podman: Podman) -> None:
    seen = gpu_view(podman)
    assert seen["devices"] == ["nvidia*"]  # the glob matched nothing
    assert "libcuda" not in seen
    assert seen["env"] == [""]


def test_unknown_device_fails_the_start(podman: Podman) -> None:
    out = podman.run(NAME, ["true"], devices=["nvidia.com/gpu=9"])
    assert out.returncode != 0
    assert "nvidia.com/gpu=9" in out.stderr
