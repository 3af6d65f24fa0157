"""The testbed runs real containers: a busybox rootfs under runc, as the injection tests need."""

from __future__ import annotations

from pathlib import Path

from testbed.rootfs import Bundle
from tests.conftest import requires_binary, requires_root


@requires_root()
@requires_binary("runc")
def test_runc_runs_a_bundle(tmp_path: Path) -> None:
    bundle = Bundle.create(tmp_path / "b", ["sh", "-c", "echo hello $WHO; ls /dev"], {"WHO": "gpu"})
    out = bundle.run()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello gpu\n")
    assert "nvidia0" not in out.stdout
