"""The node a trust test decides on: a simulated GPU node, grant keys, an allocation dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import sim
from gpuwire.grant import KeyRing
from gpuwire.roots import Roots
from runtime_hook.start.config import Config
from testbed.lab import write_keys


@pytest.fixture
def node(sim_node: tuple[Path, sim.Machine], tmp_path: Path) -> tuple[Config, KeyRing]:
    keys = write_keys(tmp_path / "keys")
    config = Config(
        roots=Roots(str(sim_node[0])),
        grant_key_dir=str(tmp_path / "keys"),
        allocation_dir=str(tmp_path / "alloc"),
        records_dir=str(tmp_path / "containers"),
        log="stderr",
    )
    return config, keys
