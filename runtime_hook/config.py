"""The node's gpuwire configuration: `$GPUWIRE_CONFIG`, else /etc/gpuwire/config.toml.

A missing default file means the defaults; a file named by `$GPUWIRE_CONFIG` must exist.
Unknown keys and bad values are errors naming the file, the key, the value and what is
accepted, because a typo in `trust` must not silently fall back to another policy.
"""

from __future__ import annotations

import os
import sys

from gpuwire import allocation, grant
from runtime_hook.discovery import Roots

ENV = "GPUWIRE_CONFIG"
DEFAULT_PATH = "/etc/gpuwire/config.toml"
DEFAULT_LOG = "/var/log/gpuwire.log"
DEFAULT_LDCONFIG = "/sbin/ldconfig"
TRUST_MODES = ("granted", "any")

ABSOLUTE = "an absolute path"
KEYS = {
    "root": ABSOLUTE + " (the host root; the three roots below default to it)",
    "driver-root": ABSOLUTE + " (driver libraries, binaries, firmware)",
    "dev-root": ABSOLUTE + " (holds dev/nvidia*)",
    "proc-root": ABSOLUTE + " (holds proc/driver/nvidia)",
    "trust": " or ".join(repr(m) for m in TRUST_MODES),
    "grant-key-dir": ABSOLUTE,
    "allocation-dir": ABSOLUTE,
    "runtime": "the low-level runtime: a command name or an absolute path",
    "ldconfig": ABSOLUTE + " to the host's static ldconfig",
    "hook": ABSOLUTE + " to gpuwire-hook",
    "log": "'stderr' or " + ABSOLUTE,
}


class ConfigError(ValueError):
    """A configuration file that cannot be used."""


def default_hook() -> str:
    """gpuwire-hook installed beside this interpreter (the same package installation)."""
    return os.path.join(os.path.dirname(sys.executable), "gpuwire-hook")


class Config:
    __slots__ = (
        "allocation_dir",
        "grant_key_dir",
        "hook",
        "ldconfig",
        "log",
        "roots",
        "runtime",
        "source",
        "trust",
    )

    def __init__(
        self,
        *,
        roots: Roots | None = None,
        trust: str = "granted",
        grant_key_dir: str = grant.DEFAULT_KEY_DIR,
        allocation_dir: str = allocation.DEFAULT_DIR,
        runtime: str = "runc",
        ldconfig: str = DEFAULT_LDCONFIG,
        hook: str | None = None,
        log: str = DEFAULT_LOG,
        source: str = "defaults",
    ) -> None:
        self.roots = roots or Roots("/")
        self.trust = trust
        self.grant_key_dir = grant_key_dir
        self.allocation_dir = allocation_dir
        self.runtime = runtime
        self.ldconfig = ldconfig
        self.hook = hook or default_hook()
        self.log = log
        self.source = source


def from_table(table: dict[str, object], source: str) -> Config:
    """Validate a parsed TOML table; every error names the key, value and what is accepted."""
    for key in table:
        if key not in KEYS:
            raise ConfigError(f"{source}: unknown key {key!r}; accepted keys are {', '.join(KEYS)}")
    values: dict[str, str] = {}
    for key, value in table.items():
        if not (isinstance(value, str) and _accepts(key, value)):
            raise ConfigError(f"{source}: {key} = {value!r} is not accepted: expected {KEYS[key]}")
        values[key] = value
    root = values.get("root", "/")
    return Config(
        roots=Roots(
            root,
            driver=values.get("driver-root"),
            dev=values.get("dev-root"),
            proc=values.get("proc-root"),
        ),
        trust=values.get("trust", "granted"),
        grant_key_dir=values.get("grant-key-dir", grant.DEFAULT_KEY_DIR),
        allocation_dir=values.get("allocation-dir", allocation.DEFAULT_DIR),
        runtime=values.get("runtime", "runc"),
        ldconfig=values.get("ldconfig", DEFAULT_LDCONFIG),
        hook=values.get("hook"),
        log=values.get("log", DEFAULT_LOG),
        source=source,
    )


def _accepts(key: str, value: str) -> bool:
    if "\0" in value:
        return False
    if key == "trust":
        return value in TRUST_MODES
    if key == "log":
        return value == "stderr" or value.startswith("/")
    if key == "runtime":
        return value != ""
    return value.startswith("/")


def parse(data: bytes, source: str) -> Config:
    import tomllib  # only when a file exists: it costs more than the rest of a hook run

    try:
        table = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return from_table(table, source)


def load(path: str | None = None) -> Config:
    """The configuration from `path`, `$GPUWIRE_CONFIG` or the default file."""
    explicit = path or os.environ.get(ENV)
    source = explicit or DEFAULT_PATH
    try:
        with open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{source}: no such configuration file") from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    return parse(data, source)
