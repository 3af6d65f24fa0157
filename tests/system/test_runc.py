"""Proof with real runc on the simulated node: the prestart hook and the shim.

Each container prints its GPU view (testbed.view.VIEW_SCRIPT). A granted device
node opens with ENXIO (the cgroup allows it, no driver answers); one the cgroup denies
would give EPERM; one not injected does not exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpuwire import allocation
from gpuwire.grant import POD_ANNOTATION
from runtime_hook.setup import launcher
from runtime_hook.start import resident
from testbed.lab import (
    OTHER_POD,
    POD_UID,
    SANDBOX,
    Lab,
    cri_annotations,
    grant_for,
    served_launchers,
)
from testbed.rootfs import Bundle
from testbed.view import VIEW_SCRIPT, view
from tests.conftest import requires_binary, requires_root
from tests.runtime_hook.test_launcher import settings_of

pytestmark = [requires_root(), requires_binary("runc")]

BIN = Path(sys.executable).parent
HOOK, SHIM = str(BIN / "gpuwire-hook"), str(BIN / "gpuwire-runtime")
ENXIO = "cat: can't open '/dev/nvidia{}': No such device or address"
# "-resident": the same launchers, served by a resident gpuwire (runtime_hook.start.resident)
DELIVERIES = ("prestart", "shim", "prestart-resident", "shim-resident")


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it
    return lab


def make_bundle(
    lab: Lab,
    env: dict[str, str],
    annotations: dict[str, str] | None = None,
    *,
    delivery: str,
    script: str = VIEW_SCRIPT,
    mounts: list[dict[str, Any]] | None = None,
) -> Bundle:
    path = lab.root / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle = Bundle.create(path, ["sh", "-c", script], env, cri_annotations() | (annotations or {}))
    if delivery.startswith("prestart"):
        bundle.spec["hooks"] = {
            "prestart": [
                {
                    "path": launchers(delivery)[0],
                    "args": ["gpuwire-hook", "prestart"],
                    "env": [f"GPUWIRE_CONFIG={lab.config}"],
                }
            ]
        }
    bundle.spec["mounts"] += mounts or []
    bundle.save()
    return bundle


def launchers(delivery: str) -> tuple[str, str]:
    """(gpuwire-hook, gpuwire-runtime) for this delivery."""
    if delivery.endswith("-resident"):
        served = served_launchers()
        return str(served / launcher.HOOK), str(served / launcher.RUNTIME)
    return HOOK, SHIM


def run(bundle: Bundle, delivery: str) -> subprocess.CompletedProcess[str]:
    return bundle.run(runtime=launchers(delivery)[1] if delivery.startswith("shim") else "runc")


def granted_env(
    lab: Lab, visible: str, caps: str = "", limits: dict[str, str] | None = None
) -> dict[str, str]:
    """A container's env as the webhook writes it: the request, the limits, the grant."""
    env = {"NVIDIA_VISIBLE_DEVICES": visible, **(limits or {})}
    env["GPUWIRE_GRANT"] = grant_for(lab.keys, visible, caps, env=env)
    if caps:
        env["NVIDIA_DRIVER_CAPABILITIES"] = caps
    return env


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_granted_container_sees_exactly_its_gpus(lab: Lab, delivery: str) -> None:
    out = run(make_bundle(lab, granted_env(lab, "1,3"), delivery=delivery), delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["devices"] == ["nvidia-uvm nvidia-uvm-tools nvidia1 nvidia3 nvidiactl"]
    assert seen["open /dev/nvidia1"] == [ENXIO.format(1)]  # allowed by the cgroup
    assert seen["open /dev/nvidia3"] == [ENXIO.format(3)]
    assert seen["smi"] == [
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(1)})",
        f"GPU 1: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(3)})",
    ]
    assert seen["libcuda"] == ["read-only"]
    assert seen["ldcache"] == ["libcuda.so.1"]  # busybox has no ldconfig: the host's ran
    if delivery.startswith("shim"):  # the shim also finalises the env the process sees
        assert seen["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]
    assert any("team-a/trainer: GPUs 1 (" in line for line in lab.log_lines())


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_image_with_visible_devices_all_and_no_grant_gets_no_gpu(lab: Lab, delivery: str) -> None:
    bundle = make_bundle(lab, {"NVIDIA_VISIBLE_DEVICES": "all"}, delivery=delivery)
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["devices"] == ["nvidia*"]  # the glob matched nothing
    assert "libcuda" not in seen
    assert "ldcache" not in seen
    assert seen["env"] == ["void" if delivery.startswith("shim") else "all"]
    (line,) = lab.log_lines()
    assert line.endswith(
        "team-a/trainer: no GPU: NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES= not "
        "honoured: no GPUWIRE_GRANT, no device-plugin allocation, and the container is not "
        'privileged (trust = "granted")'
    )


COPIES = {
    # the grant and the limit env in another pod of the namespace: another admission
    "another-pod": ({POD_ANNOTATION: "0b7e5d1c-9a3f-4c2e-8d6b-1f0e2d3c4b5a"}, True),
    # in a pod the webhook never saw (envFrom a ConfigMap, no GPU hint): no admission
    "unadmitted-pod": (None, True),
    # in its own pod, with the limit env dropped
    "without-limits": ({}, False),
}


@pytest.mark.parametrize("case", sorted(COPIES))
@pytest.mark.parametrize("delivery", ["prestart", "shim"])
def test_a_grant_binds_its_pod_and_its_limits(lab: Lab, delivery: str, case: str) -> None:
    """A GPUWIRE_GRANT for `all` of a container held to a quarter by MPS, copied. Before:
    every GPU of the node, and no limit."""
    limits = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    issued = granted_env(lab, "all", limits=limits)
    annotations, with_limits = COPIES[case]
    copied = issued if with_limits else {k: v for k, v in issued.items() if k not in limits}
    bundle = make_bundle(lab, copied, annotations, delivery=delivery)
    if annotations is None:
        del bundle.spec["annotations"][POD_ANNOTATION]
        bundle.save()
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["devices"] == ["nvidia*"]  # no GPU
    (line,) = lab.log_lines()
    why = "names no pod admission" if annotations is None else "does not sign"
    assert "no GPU: NVIDIA_VISIBLE_DEVICES=all" in line
    assert why in line


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_allocation_token_follows_its_pod_into_a_new_sandbox_and_no_further(
    lab: Lab, delivery: str
) -> None:
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(2)], lab.keys).token
    mount = {  # as the kubelet mounts the device plugin's Allocate response
        "destination": allocation.container_path(token),
        "type": "bind",
        "source": f"{lab.allocations}/{token}",
        "options": ["rbind", "ro"],
    }
    env = {"NVIDIA_VISIBLE_DEVICES": "plugin"}

    def start(sandbox: str, pod: str) -> dict[str, list[str]]:
        notes = cri_annotations(sandbox=sandbox, pod=pod)
        out = run(make_bundle(lab, env, notes, delivery=delivery, mounts=[mount]), delivery)
        assert out.returncode == 0, out.stderr
        return view(out.stdout)

    first = start(SANDBOX, POD_UID)
    assert first["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(2)})"]
    # the pod's sandbox is recreated (its pause container died, the node rebooted): the
    # kubelet starts the container again with the Allocate answer it checkpointed
    again = start("6" * 64, POD_UID)
    assert again["devices"] == ["nvidia-uvm nvidia-uvm-tools nvidia2 nvidiactl"]
    stolen = start("7" * 64, OTHER_POD)  # another pod presenting a copy of the mount
    assert stolen["devices"] == ["nvidia*"]
    assert f"allocation {token} belongs to pod {POD_UID}, not {OTHER_POD}" in lab.log_lines()[-1]


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_unknown_device_fails_the_start_with_a_clear_message(lab: Lab, delivery: str) -> None:
    out = run(make_bundle(lab, granted_env(lab, "0,9"), delivery=delivery), delivery)
    assert out.returncode != 0
    assert "unknown device '9': this node has 0 (GPU-" in out.stderr
    assert "cannot start: unknown device '9'" in lab.log_lines()[-1]


def test_shim_through_create_and_start_as_containerd_drives_it(lab: Lab) -> None:
    bundle = make_bundle(lab, granted_env(lab, "0", "utility"), delivery="shim")
    cid = f"gpuwire-{uuid.uuid4().hex[:12]}"
    create = subprocess.Popen(
        [
            SHIM,
            "--log",
            str(lab.root / "runc.log"),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle.path),
            cid,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert create.wait(timeout=60) == 0, create.stderr.read() if create.stderr else ""
        subprocess.run(["runc", "start", cid], check=True, capture_output=True)
        assert create.stdout is not None
        seen = view(create.stdout.read())  # EOF when the container exits
    finally:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    assert seen["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(0)})"]
    assert seen["devices"] == ["nvidia0 nvidiactl"]  # utility only: no uvm


def test_shim_failure_reaches_the_runtime_log_containerd_reads(lab: Lab) -> None:
    bundle = make_bundle(lab, granted_env(lab, "5"), delivery="shim")
    log = lab.root / "runc-log.json"
    out = subprocess.run(
        [
            SHIM,
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle.path),
            f"gpuwire-{uuid.uuid4().hex[:12]}",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 1
    assert '"level": "error"' in log.read_text()
    assert "gpuwire: unknown device '5'" in log.read_text()


def test_launchers_inject_the_same(lab: Lab, tmp_path: Path) -> None:
    """`python -m runtime_hook.setup.launcher DIR`, no resident: the shell launcher hands a
    GPU create to the shim, which makes links and ld cache itself (no hook in the spec); the
    hook runs Python -IS at once."""
    shim_path, hook_path = launcher.install(str(tmp_path / "libexec"), socket=None)
    bundle = make_bundle(lab, granted_env(lab, "1"), delivery="shim")
    out = bundle.run(runtime=shim_path)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(1)})"]
    assert seen["ldcache"] == ["libcuda.so.1"]
    assert "hooks" not in json.loads((bundle.path / "config.json").read_text())
    assert Path(shim_path).read_text().startswith("#!/bin/sh\n")
    settings = settings_of(Path(hook_path).read_text())
    assert (settings["python"], settings["call"]) == (sys.executable, "")
    assert settings["code"] == launcher.python_code(resident.token(), "runtime_hook.start.hook")
