"""Container records through a real container lifecycle: runc on the simulated node, driven
the way containerd drives it (create, start, kill, delete, under a private `--root`), with
GPUs given by the shim (`gpuwire-runtime`) or by the prestart hook. Create writes the record
with the container's GPUs; delete removes it (the shim sees `delete`, the hook path runs
`gpuwire-hook poststop`); a container killed and never deleted is swept by the node agent."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.agent import holding
from gpuwire import allocation, records
from gpuwire.records import PLUGIN, PLUGIN_LESS
from testbed.lab import Lab, cri_annotations, grant_for
from testbed.rootfs import Bundle
from testbed.waiting import until
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("runc")]

BIN = Path(sys.executable).parent
HOOK, SHIM = str(BIN / "gpuwire-hook"), str(BIN / "gpuwire-runtime")
DELIVERIES = ("prestart", "shim")
POD = {
    "io.kubernetes.cri.sandbox-name": "trainer-0",
    "io.kubernetes.cri.sandbox-uid": "9f1c7a52-0000-4000-8000-00000000a11c",
}


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it
    return lab


class Runc:
    """One container under a private runc root, as containerd's shim runs it."""

    def __init__(self, lab: Lab, bundle: Bundle, delivery: str) -> None:
        self.root = str(lab.root / "runc")
        self.id = f"gpuwire-{uuid.uuid4().hex[:12]}"
        self.bundle = bundle
        self.runtime = SHIM if delivery == "shim" else "runc"

    def __call__(self, *args: str, runtime: str | None = None) -> None:
        """Run a runtime command; its output goes to a file, since the container's process
        inherits it (a pipe would not see EOF while the container runs)."""
        command = [runtime or self.runtime, "--root", self.root, *args]
        with tempfile.TemporaryFile("w+") as output:
            code = subprocess.call(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
            output.seek(0)
            assert code == 0, output.read()

    def create(self) -> None:
        self("create", "--bundle", str(self.bundle.path), self.id)

    def state(self) -> dict[str, Any]:
        out = subprocess.run(
            ["runc", "--root", self.root, "state", self.id], capture_output=True, text=True
        )
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def kill(self) -> None:
        self("kill", self.id, "KILL", runtime="runc")
        until(lambda: self.state().get("status") == "stopped")

    def cleanup(self) -> None:
        subprocess.run(
            ["runc", "--root", self.root, "delete", "--force", self.id], capture_output=True
        )


@pytest.fixture
def containers() -> Iterator[list[Runc]]:
    made: list[Runc] = []
    yield made
    for container in made:
        container.cleanup()


def container(
    lab: Lab,
    made: list[Runc],
    env: dict[str, str],
    delivery: str,
    mounts: list[dict[str, Any]] | None = None,
) -> Runc:
    path = lab.root / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle = Bundle.create(path, ["sleep", "300"], env, cri_annotations() | POD)
    if delivery == "prestart":
        hook_env = [f"GPUWIRE_CONFIG={lab.config}"]
        bundle.spec["hooks"] = {
            "prestart": [{"path": HOOK, "args": ["gpuwire-hook", "prestart"], "env": hook_env}],
            "poststop": [{"path": HOOK, "args": ["gpuwire-hook", "poststop"], "env": hook_env}],
        }
    bundle.spec["mounts"] += mounts or []
    bundle.save()
    made.append(Runc(lab, bundle, delivery))
    return made[-1]


def granted(lab: Lab, visible: str) -> dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": visible, "GPUWIRE_GRANT": grant_for(lab.keys, visible)}


def record_of(lab: Lab, c: Runc) -> records.ContainerRecord | None:
    path = lab.records / c.id
    return records.decode(path.read_text()) if path.exists() else None


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_create_records_the_gpus_and_delete_forgets_them(
    lab: Lab, containers: list[Runc], delivery: str
) -> None:
    c = container(lab, containers, granted(lab, "1,3"), delivery)
    c.create()
    found = record_of(lab, c)
    assert found is not None
    assert (found.namespace, found.pod, found.container) == ("team-a", "trainer-0", "trainer")
    assert found.pod_uid == POD["io.kubernetes.cri.sandbox-uid"]
    assert found.gpus == tuple(sorted((lab.uuid(1), lab.uuid(3))))
    assert (found.path, found.whole_node) == (PLUGIN_LESS, False)
    if delivery == "prestart":  # the hook is handed the created container's pid
        assert found.pid == c.state()["pid"]
    else:  # the shim runs before the container exists: runc's state dir will tell
        assert found.state == f"{c.root}/{c.id}"
    assert records.status(found) == records.RUNNING
    c("start", c.id)
    assert records.sweep(str(lab.records), grace=0, now=time.time())[1] == []
    c.kill()
    c("delete", c.id)
    assert record_of(lab, c) is None
    assert list(lab.records.iterdir()) == []


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_container_killed_without_delete_is_swept(
    lab: Lab, containers: list[Runc], delivery: str
) -> None:
    c = container(lab, containers, granted(lab, "all"), delivery)
    c.create()
    c("start", c.id)
    settings = holding.Settings(records_dir=str(lab.records), pod_resources="/nonexistent")
    devices = lab.machine.devices
    node = holding.observe(settings, devices, time.time())
    assert [(h.name, len(h.gpus), h.whole_node) for h in node.holders] == [
        ("team-a/trainer-0", 4, True)
    ]
    c.kill()  # the container died; nobody called delete (a crashed shim, a lost node)
    assert holding.observe(settings, devices, time.time()).holders == ()
    assert not (lab.records / c.id).exists()


def test_a_plugin_allocation_is_recorded_as_the_plugin_path(
    lab: Lab, containers: list[Runc]
) -> None:
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(2)], lab.keys).token
    mount = {
        "destination": allocation.container_path(token),
        "type": "bind",
        "source": f"{lab.allocations}/{token}",
        "options": ["rbind", "ro"],
    }
    c = container(lab, containers, {"NVIDIA_VISIBLE_DEVICES": "plugin"}, "shim", [mount])
    c.create()
    found = record_of(lab, c)
    assert found is not None
    assert (found.path, found.gpus) == (PLUGIN, (lab.uuid(2),))


def test_a_refused_container_leaves_no_record(lab: Lab, containers: list[Runc]) -> None:
    c = container(lab, containers, {"NVIDIA_VISIBLE_DEVICES": "all"}, "shim")  # no grant
    c.create()
    assert not lab.records.exists() or list(lab.records.iterdir()) == []


def test_a_record_that_cannot_be_written_does_not_stop_the_container(
    lab: Lab, containers: list[Runc]
) -> None:
    blocker = lab.root / "not-a-dir"
    blocker.write_text("")
    lab.configure(**{"records-dir": str(blocker / "containers")})
    c = container(lab, containers, granted(lab, "0"), "shim")
    c.create()
    assert c.state()["status"] == "created"
    assert any("container record not written" in line for line in lab.log_lines())
