"""The command table: every entry resolves, and unknown commands say what exists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuwire import cli


@pytest.mark.parametrize(("words", "target"), [(w, t) for w, t, _ in cli.COMMANDS])
def test_every_command_resolves_to_a_function(words: tuple[str, ...], target: str) -> None:
    assert callable(cli.resolve(target)), words


def test_unknown_command_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err
    assert "gpuwire sim node" in err


def test_contract_import_pulls_in_no_component() -> None:
    """`gpuwire` and its contract must not import the components (or their dependencies)."""
    code = (
        "import sys, gpuwire.cli, gpuwire.grant, gpuwire.allocation, gpuwire.devices, gpuwire.sim;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('webhook','runtime_hook','deviceplugin','certs','starlette','kubernetes','grpc','yaml')];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
