"""Shared fixtures: a simulated GPU node, and the rule that CI runs every test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from gpuwire import sim

# Property tests check behaviour, not time: Hypothesis's per-example deadline (200 ms) would
# make them fail on a loaded machine, which is a timed assertion in disguise.
settings.register_profile("gpuwire", deadline=None)
settings.load_profile("gpuwire")


def requires_root() -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.geteuid() != 0, reason="needs root (device nodes, mounts)")


def requires_binary(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if shutil.which(n) is None]
    return pytest.mark.skipif(
        bool(missing), reason=f"needs {', '.join(missing)} (make test installs it as root)"
    )


@pytest.fixture
def sim_node(tmp_path: Path) -> tuple[Path, sim.Machine]:
    """A 4-GPU A100 node (NVLink pairs 0-1, 2-3) written under a temporary directory."""
    root = tmp_path / "node"
    machine = sim.make_machine(gpus=4)
    sim.write_node(root, machine)
    return root, machine


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process standing in for a container's init process (container records)."""
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short temporary directory for unix sockets: a socket path has at most 107 bytes,
    which pytest's tmp_path (named after the test) can exceed."""
    with tempfile.TemporaryDirectory(prefix="gw-") as directory:
        yield Path(directory)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches what the tests start as it would at a terminal. A shell without job
    control starts a background command with SIGINT ignored (POSIX, "Asynchronous Lists"),
    and an ignored signal stays ignored across exec: a run started so (a script's `make
    check &`) handed every child SIGINT ignored, and the tests that send one (the demo's
    Ctrl-C, `inventory --watch`) waited on a child that never stopped. Handled here, SIGINT
    is back at its default in every child (exec resets a handled signal)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With GPUWIRE_NO_SKIP set (CI), a skipped test fails the run: in CI everything runs."""
    if not os.environ.get("GPUWIRE_NO_SKIP"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if reporter and skipped:
        reporter.write_line(
            f"GPUWIRE_NO_SKIP: {len(skipped)} test(s) skipped; CI runs all", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
