"""Images built for NVIDIA's toolkit start (or do not) as they would under it, with real runc
on the simulated node: `NVIDIA_REQUIRE_*` against the driver and the facts the node agent
wrote, legacy CUDA images. (MIG's control variables: tests/system/test_mig_runc.py.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deviceplugin.agent import labels
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import requirements
from testbed.lab import Lab
from testbed.view import view
from tests.conftest import requires_binary, requires_root
from tests.system.test_runc import granted_env, make_bundle, run

pytestmark = [requires_root(), requires_binary("runc")]

DELIVERIES = ("shim", "prestart")
PRIVILEGED = ["CAP_SYS_ADMIN", "CAP_CHOWN", "CAP_KILL"]


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """The lab node (driver 550.54.15, CUDA 12.4, A100s) with the facts its agent writes."""
    lab = Lab(tmp_path / "lab")
    facts = str(lab.root / "facts/driver.json")
    requirements.write_facts(facts, labels.driver_facts(SimDiscovery(lab.node).discover()))
    lab.configure(**{"driver-facts": facts})
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))
    return lab


def privileged(lab: Lab, env: dict[str, str], delivery: str) -> subprocess.CompletedProcess[str]:
    bundle = make_bundle(lab, env, delivery=delivery)
    bundle.spec["process"]["capabilities"]["bounding"] = PRIVILEGED
    bundle.save()
    return run(bundle, delivery)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_an_image_whose_requirements_the_node_meets_starts(lab: Lab, delivery: str) -> None:
    image = "cuda>=12.4 brand=tesla,driver>=470,driver<471"
    env = granted_env(lab, "0") | {"NVIDIA_REQUIRE_CUDA": image, "NVIDIA_REQUIRE_ARCH": "arch>=8.0"}
    out = run(make_bundle(lab, env, delivery=delivery), delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(0)})"]


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_an_unmet_requirement_fails_the_start_naming_it(lab: Lab, delivery: str) -> None:
    env = granted_env(lab, "0") | {"NVIDIA_REQUIRE_CUDA": "cuda>=12.6 brand=tesla,driver>=560"}
    out = run(make_bundle(lab, env, delivery=delivery), delivery)
    assert out.returncode != 0
    assert (
        "NVIDIA_REQUIRE_CUDA: unsatisfied condition: cuda>=12.6, please update your driver to a "
        "newer version, or use an earlier cuda container (this node: driver 550.54.15, CUDA 12.4)"
    ) in out.stderr
    assert "cannot start: NVIDIA_REQUIRE_CUDA: unsatisfied condition" in lab.log_lines()[-1]
    off = env | {"NVIDIA_DISABLE_REQUIRE": "true"}
    assert run(make_bundle(lab, off, delivery=delivery), delivery).returncode == 0


def test_without_the_agents_facts_a_cuda_requirement_is_not_checked_and_logged(lab: Lab) -> None:
    lab.configure(**{"driver-facts": str(lab.root / "none.json")})
    env = granted_env(lab, "0") | {"NVIDIA_REQUIRE_CUDA": "cuda>=12.6"}
    out = run(make_bundle(lab, env, delivery="shim"), "shim")
    assert out.returncode == 0, out.stderr
    assert lab.log_lines()[-1].endswith(
        "(not checked here: NVIDIA_REQUIRE_CUDA (cuda unknown here))"
    )


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_privileged_legacy_cuda_image_gets_every_gpu_and_capability(
    lab: Lab, delivery: str
) -> None:
    """CUDA_VERSION and no NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES or
    NVIDIA_REQUIRE_CUDA: the toolkit gives it all, and requires its CUDA version."""
    out = privileged(lab, {"CUDA_VERSION": "12.2.2"}, delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert len(seen["smi"]) == 4
    assert any(n.startswith("libGLX_nvidia") for n in seen["lib"])  # graphics too: all
    newer = privileged(lab, {"CUDA_VERSION": "12.6.0"}, delivery)
    assert newer.returncode != 0
    assert "CUDA_VERSION: unsatisfied condition: cuda>=12.6" in newer.stderr


def test_an_unprivileged_legacy_image_without_a_grant_gets_no_gpu(lab: Lab) -> None:
    out = run(make_bundle(lab, {"CUDA_VERSION": "12.2.2"}, delivery="shim"), "shim")
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["devices"] == ["nvidia*"]
    assert "no GPU: NVIDIA_VISIBLE_DEVICES= " in lab.log_lines()[-1]
