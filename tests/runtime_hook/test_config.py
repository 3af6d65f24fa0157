"""The node configuration file: defaults, every key, and clear errors for bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwire import allocation, grant
from runtime_hook.start import config as cfg
from runtime_hook.start.config import ConfigError


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_missing_default_file_means_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cfg.ENV, raising=False)
    monkeypatch.setattr(cfg, "DEFAULT_PATH", "/nonexistent/gpuwire.toml")
    config = cfg.load()
    assert (config.roots.driver, config.roots.dev, config.roots.proc) == ("/", "/", "/")
    assert config.trust == "granted"
    assert config.grant_key_dir == grant.DEFAULT_KEY_DIR == "/etc/gpuwire/keys"
    assert config.allocation_dir == allocation.DEFAULT_DIR
    assert config.runtime == "runc"
    assert config.source == "defaults"


def test_every_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        """
        # node config
        root = "/host"
        dev-root = "/host-dev"
        trust = "any"
        grant-key-dir = "/k"
        allocation-dir = "/a"
        runtime = "/usr/local/sbin/runc"
        ldconfig = "/usr/sbin/ldconfig"
        hook = "/opt/gpuwire/bin/gpuwire-hook"
        log = "stderr"
        """,
    )
    monkeypatch.setenv(cfg.ENV, path)
    config = cfg.load()
    assert (config.roots.driver, config.roots.dev, config.roots.proc) == (
        "/host",
        "/host-dev",
        "/host",
    )
    assert (config.trust, config.grant_key_dir, config.allocation_dir) == ("any", "/k", "/a")
    assert (config.runtime, config.ldconfig, config.hook, config.log) == (
        "/usr/local/sbin/runc",
        "/usr/sbin/ldconfig",
        "/opt/gpuwire/bin/gpuwire-hook",
        "stderr",
    )
    assert config.source == path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('trust = "granted "', "trust = 'granted ' is not accepted: expected 'granted' or 'any'"),
        ("trust = true", "trust = True is not accepted"),
        ('root = "host"', "root = 'host' is not accepted: expected an absolute path"),
        ('log = "syslog"', "log = 'syslog' is not accepted: expected 'stderr' or an absolute"),
        ('runtime = ""', "runtime = '' is not accepted"),
        ('trsut = "any"', "unknown key 'trsut'; accepted keys are root, driver-root"),
        ("[hook]\npath = '/x'", "hook = {'path': '/x'} is not accepted"),
        ('root = "/', "not valid TOML"),
    ],
)
def test_bad_input_names_key_value_and_what_is_accepted(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        cfg.load(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_named_file_must_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cfg.ENV, "/nonexistent/node.toml")
    with pytest.raises(ConfigError, match=r"/nonexistent/node\.toml: no such configuration file"):
        cfg.load()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setattr(cfg, "CACHE_DIR", str(directory))
    return directory


def test_parsed_table_is_reused_only_for_the_same_bytes(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, 'trust = "any"\n')
    assert cfg.load(path).trust == "any"
    assert oct(cache_dir.stat().st_mode & 0o777) == "0o700"

    def no_parsing(data: bytes, source: str) -> dict[str, object]:
        raise AssertionError("parsed again")

    with monkeypatch.context() as m:
        m.setattr(cfg, "parse_toml", no_parsing)
        assert cfg.load(path).trust == "any"  # from the cache
    Path(path).write_text('trust = "granted"\n')  # same size, same inode, same second
    assert cfg.load(path).trust == "granted"


def test_cache_keeps_entries_only_for_live_config_files(tmp_path: Path, cache_dir: Path) -> None:
    """Throwaway configs (tests, the demo) leave nothing behind once another one is read."""

    def config(name: str) -> str:
        (tmp_path / name).mkdir()
        path = write(tmp_path / name, 'trust = "any"\n')
        cfg.load(path)
        return path

    def entry(path: str) -> str:
        st = os.stat(path)
        return f"config-{st.st_dev}-{st.st_ino}"

    kept, gone = config("kept"), config("gone")
    assert {e.name for e in cache_dir.iterdir()} == {entry(kept), entry(gone)}
    Path(gone).unlink()
    newest = config("newest")
    assert {e.name for e in cache_dir.iterdir()} == {entry(kept), entry(newest)}


def test_cache_in_a_directory_others_can_write_is_ignored(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, 'trust = "any"\n')
    cfg.load(path)
    cache_dir.chmod(0o777)
    parsed = []
    original = cfg.parse_toml

    def counting(data: bytes, source: str) -> dict[str, object]:
        parsed.append(source)
        return original(data, source)

    monkeypatch.setattr(cfg, "parse_toml", counting)
    assert cfg.load(path).trust == "any"
    assert parsed == [path]
