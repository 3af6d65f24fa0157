"""containerd itself reads what `gpuwire containerd configure` writes.

A private containerd (tests/../gpuwire/lab/containerd.py) starts from a main config an admin
might have, after `gpuwire containerd configure` added its drop-in: `config dump` must show
the handler, and the CRI plugin, which validates its runtimes when it loads, must load.
containerd 1.6 reads config version 2; version 3 needs containerd 2.x, which Debian 12 does
not ship, so version 3 is checked as TOML structure in test_containerd_config.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from gpuwire.lab.containerd import CRI, Containerd
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuwire-runtime")
HOOK = str(BIN / "gpuwire-hook")


def gpuwire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpuwire"), *args], capture_output=True, text=True)


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    with Containerd.create(cri=True) as instance:
        # what an admin's file holds besides the private paths: a setting the drop-in must keep
        text = instance.config.read_text()
        instance.config.write_text(
            "# the admin's comment\n"
            + text.replace(
                'stream_server_port = "0"',
                'stream_server_port = "0"\n  sandbox_image = "registry.example/pause:9"',
            )
        )
        yield instance


def cri_section(dump: str) -> dict[str, Any]:
    section: dict[str, Any] = tomlkit.parse(dump).unwrap()["plugins"][CRI]
    return section


def cri_status(containerd: Containerd) -> str:
    return containerd.ctr("plugins", "ls", "id==cri").stdout.split()[-1]


def configure(containerd: Containerd, *args: str) -> None:
    out = gpuwire("containerd", "configure", "--config", str(containerd.config), *args)
    assert out.returncode == 0, out.stderr


def test_containerd_runs_the_shim_handler(containerd: Containerd) -> None:
    configure(containerd, "--runtime-path", SHIM)
    assert containerd.config.read_text().startswith("# the admin's comment\n")
    containerd.start()
    assert cri_status(containerd) == "ok"
    section = cri_section(containerd.dump())
    assert section["sandbox_image"] == "registry.example/pause:9"
    ctd = section["containerd"]
    assert isinstance(ctd, dict)
    assert ctd["default_runtime_name"] == "runc"  # still there: the drop-in keeps runc
    assert ctd["runtimes"]["gpuwire"]["runtime_type"] == "io.containerd.runc.v2"
    assert ctd["runtimes"]["gpuwire"]["options"]["BinaryName"] == SHIM
    containerd.stop()
    configure(containerd, "--runtime-path", SHIM, "--set-default")
    containerd.start()
    assert cri_status(containerd) == "ok"
    assert cri_section(containerd.dump())["containerd"]["default_runtime_name"] == "gpuwire"


def test_cri_refuses_a_broken_handler(containerd: Containerd) -> None:
    """The check above can fail: a default runtime that is not configured stops the CRI plugin."""
    with containerd.config.open("a") as f:
        f.write(f'  [plugins."{CRI}".containerd]\n    default_runtime_name = "gpuwire"\n')
    containerd.start()
    assert cri_status(containerd) == "error"


def test_containerd_loads_the_prestart_hook_base_spec(containerd: Containerd) -> None:
    """containerd reads base_runtime_spec files when the CRI plugin loads; a bad one fails it."""
    base = containerd.home / "base-spec.json"
    configure(containerd, "--prestart-hook", "--hook-path", HOOK, "--base-spec", str(base))
    spec = json.loads(base.read_text())
    assert spec["hooks"]["prestart"][-1]["path"] == HOOK
    assert spec["linux"]["namespaces"]  # containerd's own default spec (`ctr oci spec`)
    containerd.start()
    assert cri_status(containerd) == "ok"
    runtime = cri_section(containerd.dump())["containerd"]["runtimes"]["gpuwire"]
    assert runtime["base_runtime_spec"] == str(base)
    assert runtime["options"].get("BinaryName", "") == ""  # runc itself
    containerd.stop()
    base.write_text("{not json")
    containerd.start()
    assert cri_status(containerd) == "error"


def test_config_dump_as_the_source(containerd: Containerd) -> None:
    configure(containerd, "--runtime-path", SHIM, "--config-source", "command")
    drop_in = tomlkit.parse((containerd.home / "conf.d/99-gpuwire.toml").read_text()).unwrap()
    section = drop_in["plugins"][CRI]
    # the effective config, defaults included (containerd's own runc entry and options)
    assert section["sandbox_image"] == "registry.example/pause:9"
    assert "max_container_log_line_size" in section
    assert section["containerd"]["runtimes"]["gpuwire"]["options"]["BinaryName"] == SHIM
    again = gpuwire(
        "containerd", "configure", "--config", str(containerd.config),
        "--runtime-path", SHIM, "--config-source", "command",
    )  # fmt: skip
    assert again.stdout.startswith("no change:"), again.stdout
    containerd.start()
    assert cri_status(containerd) == "ok"
