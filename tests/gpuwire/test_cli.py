"""The command table: every entry resolves, and unknown commands say what exists."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from importlib import metadata

import pytest

from deviceplugin import config as plugin_config
from gpuwire import cli, exits
from runtime_hook.start import config as node_config


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


def test_version_is_the_distribution_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"gpuwire {metadata.version('gpuwire')}\n"


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(target: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser a command builds, caught as it parses (nothing after that runs)."""

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Built(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(_Built) as built:
        cli.resolve(target)([])
    return built.value.parser


def _config_backed(target: str) -> set[str]:
    """The options of a command whose default a config file holds, by dest: their argparse
    default is None (a flag not given leaves the file's value), so only the help can say
    what they are when neither sets them."""
    if target.startswith("deviceplugin."):
        defaults = plugin_config.Config()
        fields = dataclasses.fields(plugin_config.Config)
        return {f.name for f in fields if getattr(defaults, f.name) is not None}
    if target.startswith("runtime_hook.setup."):
        return {key.replace("-", "_") for key in node_config.KEYS}
    return set()


@pytest.mark.parametrize(("words", "target"), [(w, t) for w, t, _ in cli.COMMANDS])
def test_every_option_says_what_it_is_and_its_default(
    words: tuple[str, ...], target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = _parser_of(target, monkeypatch)
    assert parser.prog == "gpuwire " + " ".join(words)
    config_backed = _config_backed(target)
    missing, undefaulted = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(name)
        elif (
            (
                action.default not in (None, False, [], argparse.SUPPRESS)
                or action.dest in config_backed
            )
            and not action.required
            and "default" not in action.help
        ):
            undefaulted.append(f"{name} (default {action.default!r})")
    assert missing == [], f"options without help: {missing}"
    assert undefaulted == [], f"help that does not say the default: {undefaulted}"


def test_a_bug_is_said_in_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(argv: list[str]) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "resolve", lambda target: broken)
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    assert cli.main(["inventory"]) == exits.INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("gpuwire inventory: internal error: KeyError: 'surprise'\n")
    assert f"{exits.DEBUG_ENV}=1" in err
    assert "Traceback" not in err
    monkeypatch.setenv(exits.DEBUG_ENV, "1")
    with pytest.raises(KeyError):
        cli.main(["inventory"])
