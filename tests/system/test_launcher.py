"""The launchers under real runc, as containerd calls them: Python starts only for a GPU
create, and a GPU container's record goes with its delete (the shell's decisions themselves:
tests/runtime_hook/test_launcher.py)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from runtime_hook.setup import launcher
from runtime_hook.start import config
from testbed.lab import Lab, cri_annotations, grant_for
from testbed.waiting import until
from tests.conftest import requires_binary, requires_root


@requires_root()
@requires_binary("runc")
def test_only_a_gpu_create_starts_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launchers written for a Python that does not exist: every call but a GPU create
    still works, so none of them started Python."""
    from testbed.rootfs import Bundle

    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv(config.ENV, str(lab.config))
    runtime, _ = launcher.install(str(tmp_path / "libexec"), python="/nonexistent/python3")
    version = subprocess.run([runtime, "--version"], capture_output=True, text=True)
    assert version.returncode == 0
    assert version.stdout.startswith("runc version")
    plain = Bundle.create(tmp_path / "plain", ["echo", "started"], {"A": "1"})
    out = plain.run(runtime=runtime)  # run, then runc's delete
    assert (out.returncode, out.stdout) == (0, "started\n"), out.stderr
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    gpu = Bundle.create(tmp_path / "gpu", ["true"], env)
    assert gpu.run(runtime=runtime).returncode == 127  # exec /nonexistent/python3


@requires_root()
@requires_binary("runc")
def test_a_gpu_containers_record_goes_with_its_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Create, start and delete through the launcher, as containerd calls it: the record
    the shim writes at create is removed at delete, which the launcher hands to Python."""
    from testbed.rootfs import Bundle

    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv(config.ENV, str(lab.config))
    runtime, _ = launcher.install(str(tmp_path / "libexec"))
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    bundle = Bundle.create(tmp_path / "gpu", ["true"], env, cri_annotations())
    root, cid = str(tmp_path / "runc"), f"gpuwire-{uuid.uuid4().hex[:12]}"

    def call(*args: str) -> None:
        """Output to a file: the container inherits it (a pipe would not see EOF)."""
        with tempfile.TemporaryFile("w+") as output:
            command = [runtime, "--root", root, *args]
            code = subprocess.call(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
            output.seek(0)
            assert code == 0, output.read()

    try:
        call("create", "--bundle", str(bundle.path), cid)
        assert (lab.records / cid).exists()
        call("start", cid)
        until(lambda: json.loads(runc_state(root, cid))["status"] == "stopped")
        call("delete", cid)
        assert not (lab.records / cid).exists()
    finally:
        subprocess.run(["runc", "--root", root, "delete", "--force", cid], capture_output=True)


def runc_state(root: str, cid: str) -> str:
    return subprocess.run(
        ["runc", "--root", root, "state", cid], capture_output=True, text=True, check=True
    ).stdout
