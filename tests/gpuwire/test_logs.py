"""One log format for every server and command: time, level, component, message; JSON as
an option; uvicorn's lines through it too. Each server sets it up from its flags."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwire import cli, logs, sim
from runtime_hook.start import hook, resident

LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) \S+: \S")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    yield out
    logs.setup("test", "warning", stream=io.StringIO())  # the next test's lines go nowhere here
    logging.getLogger().setLevel(logging.WARNING)


def test_text_lines_say_time_level_component_message(stream: io.StringIO) -> None:
    logs.setup("webhook", "info", stream=stream)
    logging.getLogger("webhook.server").info("admitted %s", "ml/trainer")
    logging.getLogger("uvicorn.error").info("Uvicorn running on https://127.0.0.1:8443")
    logging.getLogger("webhook.reload").debug("not at info")
    lines = stream.getvalue().splitlines()
    assert [LINE.match(line) is not None for line in lines] == [True, True]
    assert lines[0].endswith(" INFO webhook: admitted ml/trainer")
    assert lines[1].endswith(" INFO webhook: Uvicorn running on https://127.0.0.1:8443")


def test_json_lines_carry_the_fields(stream: io.StringIO) -> None:
    logs.setup("webhook", "info", "json", stream=stream)
    fields = {"namespace": "ml", "pod": "trainer", "uid": "u1", "message": "not this"}
    logging.getLogger("webhook.server").info("admitted ml/trainer", extra={logs.FIELDS: fields})
    (entry,) = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert entry.pop("time").endswith("Z")
    assert entry == {
        "level": "INFO",
        "component": "webhook",
        "logger": "webhook.server",
        "message": "admitted ml/trainer",  # a field never replaces the line's own keys
        "namespace": "ml",
        "pod": "trainer",
        "uid": "u1",
    }


def test_a_second_setup_replaces_the_first(stream: io.StringIO) -> None:
    logs.setup("a", stream=io.StringIO())
    logs.setup("b", stream=stream)
    logging.getLogger("x").warning("once")
    assert stream.getvalue().count("once") == 1
    assert " WARNING b: once" in stream.getvalue()


SERVERS: dict[tuple[str, ...], tuple[list[str], str]] = {
    ("webhook", "serve"): (["--tls-cert", "c", "--tls-key", "k"], "webhook"),
    ("device-plugin", "serve"): ([], "device-plugin"),
    ("dra", "serve"): ([], "dra-plugin"),
    ("node", "label"): (["--watch"], "node-agent"),
    ("certs", "ensure"): (
        ["--namespace", "n", "--service", "s", "--secret", "t", "--webhook-config", "w"],
        "certs",
    ),
}


class _SetUp(Exception):
    pass


@pytest.mark.parametrize("words", sorted(SERVERS))
def test_every_server_logs_in_the_one_format_and_takes_json(
    words: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before: each its own basicConfig (certs without a level, the webhook without a time)."""
    argv, component = SERVERS[words]
    made: list[tuple[str, str, str]] = []

    def setup(name: str, level: str = "info", fmt: str = "text", stream: object = None) -> None:
        made.append((name, level, fmt))
        raise _SetUp

    monkeypatch.setattr(logs, "setup", setup)
    command = cli.resolve(next(t for w, t, _ in cli.COMMANDS if w == words))
    with pytest.raises(_SetUp):
        command([*argv, "--log-format", "json", "--log-level", "WARNING"])
    assert made == [(component, "warning", "json")]


def test_the_resident_logs_in_the_one_format_and_takes_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: `gpuwire resident: serving …` printed, no time, no level."""
    made: list[tuple[str, str, str]] = []

    def setup(name: str, level: str = "info", fmt: str = "text", stream: object = None) -> None:
        made.append((name, level, fmt))
        raise _SetUp

    monkeypatch.setattr(logs, "setup", setup)
    with pytest.raises(_SetUp):
        resident.main(["--log-format", "json", "--log-level", "WARNING"])
    assert made == [("resident", "warning", "json")]


def test_a_failed_resident_call_is_one_line_for_its_caller(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What escapes the hook is a bug: the caller's stderr (the child's, once it has taken
    the call on) gets one line in the one format, not a traceback (before: the traceback
    alone); --log-level debug adds where it failed."""

    def broken(argv: list[str]) -> int:
        raise KeyError("surprise")

    def served_call(level: str) -> tuple[bytes, str]:
        out = io.StringIO()
        logs.setup("resident", level, stream=out)
        caller, conn = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        null = [os.open(os.devnull, os.O_RDWR) for _ in range(4)]
        with caller, conn:
            request = b"\0".join([b"build", b"hook", b"022", b"2", b"gpuwire-hook", b"prestart"])
            socket.send_fds(caller, [request + b"\0"], null)
            for fd in null:
                os.close(fd)
            assert resident.answer(conn, served) == 0
            assert caller.recv(16) == b"r"  # the greeting
            return caller.recv(16), out.getvalue()

    def take_on(request: resident.Request) -> None:  # the test's stdio stays its own
        for fd in request.fds:
            os.close(fd)

    monkeypatch.setattr(hook, "main", broken)
    monkeypatch.setattr(resident, "take_on", take_on)
    monkeypatch.setattr(resident, "let_go", lambda: None)
    monkeypatch.setattr(resident.Served, "refusal", lambda *_: None)  # any caller is served
    served = resident.Served("build")
    reply, said = served_call("info")
    assert reply == b"x1"  # the status a Python launcher ends with
    (line,) = said.splitlines()
    assert LINE.match(line)
    assert line.endswith(
        " ERROR resident: hook call failed: KeyError: 'surprise' "
        "(a bug; --log-level debug shows where)"
    )
    reply, said = served_call("debug")
    assert "Traceback (most recent call last)" in said
    assert said.rstrip().endswith("KeyError: 'surprise'")


def test_the_node_installer_logs_in_the_one_format() -> None:
    """deploy/node/install-node, a shell program, writes the lines the servers write (before:
    `gpuwire-install-node: …`, no time, no level)."""
    installer = Path(__file__).resolve().parents[2] / "deploy/node/install-node"
    done = subprocess.run(
        ["sh", str(installer), "--bogus"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert LINE.match(line)
    assert line.endswith(
        " ERROR install-node: unknown argument --bogus "
        "(usage: gpuwire-install-node [--interval SECONDS | --uninstall])"
    )


def test_log_flags_take_only_what_they_say(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="p")
    logs.add_flags(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format", "xml"])
    assert "argument --log-format: invalid choice: 'xml'" in capsys.readouterr().err


def test_a_server_s_fatal_error_is_a_log_line_with_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulated node, a kubelet directory it cannot use: the line says so, exit 1."""
    root = tmp_path / "node"
    sim.write_node(root, sim.make_machine(gpus=1))
    (tmp_path / "kubelet").write_text("a file, not a directory")
    argv = [
        "device-plugin",
        "serve",
        "--sim",
        str(root),
        "--kubelet-dir",
        str(tmp_path / "kubelet"),
    ]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err
    assert [line for line in err if not LINE.match(line)] == []
    assert " ERROR device-plugin: device plugin stopped: " in err[-1]


def test_lines_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's thread logging after its caller replaced stderr (a test harness closing
    each test's capture) writes to the new one, not into a closed file."""
    logs.setup("webhook", "info")
    now = io.StringIO()
    monkeypatch.setattr("sys.stderr", now)
    logging.getLogger("x").warning("here")
    assert " WARNING webhook: here" in now.getvalue()
    logs.setup("test", "warning", stream=io.StringIO())
