"""End to end on the simulated node: the device plugin's Allocate answer, as the kubelet
passes it to the runtime (env and a read-only bind mount), is accepted by gpuwire's runtime
side in a real runc container, which then sees exactly the allocated GPUs; the same answer
replayed into another pod gets nothing, while the same pod in a new sandbox keeps it."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.api import api_pb2
from deviceplugin.config import Config
from deviceplugin.plugin import serve
from testbed.kubelet import Kubelet
from testbed.lab import OTHER_POD, POD_UID, Lab, cri_annotations
from testbed.rootfs import Bundle
from testbed.view import VIEW_SCRIPT, view
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("runc")]

HOOK = str(Path(sys.executable).parent / "gpuwire-hook")
SHIM = str(Path(sys.executable).parent / "gpuwire-runtime")


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim reads it
    return lab


@pytest.fixture
def kubelet(lab: Lab, socket_dir: Path) -> Iterator[Kubelet]:
    """A kubelet with the device plugin registered, on the lab's node and keys."""
    config = Config(
        kubelet_dir=str(socket_dir),
        sim=str(lab.node),
        allocation_dir=str(lab.allocations),
        grant_key_dir=str(lab.root / "keys"),
    )
    stop = threading.Event()
    with Kubelet(socket_dir) as k:
        thread = threading.Thread(target=serve.run, args=(config, stop))
        thread.start()
        try:
            yield k
        finally:
            stop.set()
            thread.join(timeout=30)


def container(
    lab: Lab,
    answer: api_pb2.ContainerAllocateResponse,
    delivery: str,
    sandbox: str = "5" * 64,
    pod: str | None = POD_UID,
) -> Bundle:
    """A container spec as containerd writes it from the kubelet's run options."""
    path = lab.root / f"bundle-{uuid.uuid4().hex[:8]}"
    notes = cri_annotations(sandbox=sandbox, pod=pod)
    bundle = Bundle.create(path, ["sh", "-c", VIEW_SCRIPT], dict(answer.envs), notes)
    bundle.spec["mounts"] += [
        {
            "destination": m.container_path,
            "type": "bind",
            "source": m.host_path,
            "options": ["rbind", "ro" if m.read_only else "rw"],
        }
        for m in answer.mounts
    ]
    if delivery == "prestart":
        hook = {
            "path": HOOK,
            "args": ["gpuwire-hook", "prestart"],
            "env": [f"GPUWIRE_CONFIG={lab.config}"],
        }
        bundle.spec["hooks"] = {"prestart": [hook]}
    bundle.save()
    return bundle


@pytest.mark.parametrize("delivery", ["prestart", "shim"])
def test_allocated_gpus_and_only_those_reach_the_container(
    lab: Lab, kubelet: Kubelet, delivery: str
) -> None:
    ids, answer = kubelet.admit("nvidia.com/gpu", 2)
    index = {d.uuid: d.index for d in lab.machine.devices}
    granted = sorted(ids, key=index.__getitem__)
    out = container(lab, answer, delivery).run(runtime=SHIM if delivery == "shim" else "runc")
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["smi"] == [
        f"GPU {n}: NVIDIA A100-SXM4-80GB (UUID: {gpu})" for n, gpu in enumerate(granted)
    ]
    nodes = " ".join(sorted(f"nvidia{index[g]}" for g in granted))
    assert seen["devices"] == [f"nvidia-uvm nvidia-uvm-tools {nodes} nvidiactl"]


def gpus_seen(bundle: Bundle) -> list[str]:
    out = bundle.run()
    assert out.returncode == 0, out.stderr
    return view(out.stdout)["devices"]


def test_answer_replayed_in_another_pod_gets_no_gpu(lab: Lab, kubelet: Kubelet) -> None:
    _, answer = kubelet.admit("nvidia.com/gpu", 1)
    assert gpus_seen(container(lab, answer, "prestart")) != ["nvidia*"]
    # the kubelet's checkpointed answer, reused for the same pod in a new sandbox
    assert gpus_seen(container(lab, answer, "prestart", sandbox="6" * 64)) != ["nvidia*"]
    replay = container(lab, answer, "prestart", sandbox="7" * 64, pod=OTHER_POD)
    assert gpus_seen(replay) == ["nvidia*"]  # nothing injected
    assert f"belongs to pod {POD_UID}, not {OTHER_POD}" in lab.log_lines()[-1]


def test_without_pod_uids_the_answer_stays_in_its_sandbox(lab: Lab, kubelet: Kubelet) -> None:
    """containerd before 1.6.11 writes no pod UID: the token binds the first sandbox."""
    _, answer = kubelet.admit("nvidia.com/gpu", 1)
    assert gpus_seen(container(lab, answer, "prestart", pod=None)) != ["nvidia*"]
    assert gpus_seen(container(lab, answer, "prestart", sandbox="7" * 64, pod=None)) == ["nvidia*"]
    assert "belongs to sandbox 555555555555, not 777777777777" in lab.log_lines()[-1]
