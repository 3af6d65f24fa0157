"""One log format for every gpuwire server and command, uvicorn's lines included.

Each line is `<UTC time, ms> <LEVEL> <component>: <message>`, the component being the
program that logs (`webhook`, `device-plugin`, `dra-plugin`, `node-agent`, `certs`,
`resident`; the node installer, a shell program, writes the same: `install-node`), so the
lines of `kubectl logs` read alike whichever pod they come from:

    2025-05-01T10:00:00.123Z INFO webhook: admitted ml-research/trainer (uid 1f0c…): …

`--log-format json` writes the same as one JSON object a line (`time`, `level`,
`component`, `logger`, `message`, and the fields a line carries, such as an admission's
`namespace`, `pod` and `uid`), for a log shipper. The standard library only: `gpuwire/` is
the contract, and every component sets its logging up here. (The container-start path
keeps its own one-line records, `runtime_hook.start.log`: it imports nothing it does not
need.)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, TextIO

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
FIELDS = "fields"  # a record's structured fields: logging's `extra={"fields": {...}}`
# Third-party loggers that configure themselves unless told otherwise: they go through the
# root logger's one handler instead (uvicorn is given no log_config: webhook/server.py).
ADOPTED = ("uvicorn", "uvicorn.error", "uvicorn.access")
# Third-party loggers whose warnings retell what gpuwire's own line says, written at debug
# level only: the kubernetes client's connection retries (urllib3's `Retrying (Retry(…))
# after connection broken by …`), which end in gpuwire's line naming the server and why.
QUIETED = ("urllib3",)


_last = (-1, "")  # the last second formatted, and its text: a server logs many a second


def _stamp(record: logging.LogRecord) -> str:
    global _last
    second, text = _last  # one read: another thread may replace it meanwhile
    if second != int(record.created):
        second = int(record.created)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _last = (second, text)
    return f"{text}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_stamp(record)} {record.levelname} {self.component}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _stamp(record),
            "level": record.levelname,
            "component": self.component,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler `setup` installs (a second `setup` replaces it, and only it). Given
    no stream it writes to the stderr of the moment, not the one it was made with (which a
    test harness, or a daemonizing caller, may have closed and replaced since)."""

    def __init__(self, stream: TextIO | None) -> None:
        logging.Handler.__init__(self)
        self._given = stream

    @property
    def stream(self) -> TextIO:
        return self._given or sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.setStream
        self._given = value


def setup(
    component: str, level: str = "info", fmt: str = "text", stream: TextIO | None = None
) -> None:
    """Every record of this process, to `stream` (stderr), in `fmt`, at `level` and above."""
    formatter = (JsonFormatter if fmt == "json" else TextFormatter)(component)
    handler = _Handler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ADOPTED:
        adopted = logging.getLogger(name)
        adopted.handlers.clear()
        adopted.propagate = True
    for name in QUIETED:
        logging.getLogger(name).setLevel(logging.NOTSET if root.level <= logging.DEBUG else "ERROR")
    logging.captureWarnings(True)
    # What no line here shows, not gathered for each record (the Logging HOWTO's
    # "Optimization"): the webhook writes one an admission, ~20 % less for each.
    logging._srcfile = None  # the caller's file and line
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


def add_flags(
    parser: argparse.ArgumentParser, level: str | None = "info", said: str = "%(default)s"
) -> None:
    """`--log-level` and `--log-format`, with the one help every server shows; `level` None
    leaves the default to the command (`said` says what it is)."""
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LEVELS,
        default=level,
        help=f"the least severe lines written (default {said})",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text: time, level, component, message a line; json: one object a line "
        "(default %(default)s)",
    )


def from_args(component: str, args: argparse.Namespace) -> None:
    """`setup` from the flags `add_flags` added."""
    setup(component, args.log_level, args.log_format)
