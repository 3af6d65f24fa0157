"""Settings: the YAML file, flags on top, and bad input refused with key, value and what is
accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin import cli
from deviceplugin.config import Config, ConfigError, load, parse
from deviceplugin.plugin.resources import Rule
from gpuwire import cli as gpuwire_cli
from gpuwire import exits

FULL = """
version: v1
kubeletDir: /var/lib/kubelet/device-plugins
resourceName: example.com/gpu
resources:
  - pattern: "*A100*"
    name: example.com/a100
    replicas: 2
  - pattern: "*L4"
    name: example.com/l4
sharing:
  timeSlicing:
    replicas: 4
    failRequestsGreaterThanOne: true
    renameByDefault: true
allocate:
  deviceSpecs: true
  cdi: index
  cdiKind: example.com/gpu
  devRoot: /run/nvidia/driver
  allocationDir: /var/lib/gpuwire/alloc
  grantKeyDir: /etc/gpuwire/grant
  preStartCheck: true
health:
  ignoreXids: [13, 43]
  recoverAfter: never
sweep:
  interval: 30
  grace: 120
labels:
  enabled: true
  interval: 15
"""


def test_every_file_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(FULL)
    config = load(str(path), {})
    assert config == Config(
        kubelet_dir="/var/lib/kubelet/device-plugins",
        resource="example.com/gpu",
        rules=(Rule("*A100*", "example.com/a100", 2), Rule("*L4", "example.com/l4")),
        replicas=4,
        fail_requests_greater_than_one=True,
        rename_by_default=True,
        device_specs=True,
        cdi="index",
        cdi_kind="example.com/gpu",
        dev_root="/run/nvidia/driver",
        allocation_dir="/var/lib/gpuwire/alloc",
        grant_key_dir="/etc/gpuwire/grant",
        pre_start_check=True,
        ignored_xids=frozenset({13, 43}),
        recover_after=None,
        sweep_interval=30,
        sweep_grace=120,
        labels=True,
        label_interval=15,
    )
    assert config.default_resource == "example.com/gpu.shared"


def test_empty_file_is_the_defaults() -> None:
    assert parse("") == {}
    assert Config().default_resource == "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2", "version 'v2' is not supported: expected v1"),
        ("resourceNmae: x", "unknown key 'resourceNmae'; known keys: version, kubeletDir"),
        (
            "sharing: {timeSlicing: {replicas: 0}}",
            "sharing.timeSlicing.replicas: 0: expected a whole number from 1 to 1000",
        ),
        ("sharing: {timeSlicing: {replicas: two}}", "replicas: 'two': expected a whole number"),
        ("resourceName: gpu", "resourceName: 'gpu': 'gpu' is not an extended resource name"),
        ("allocate: {cdi: name}", "allocate.cdi: 'name': expected one of none, uuid, index"),
        ("health: {ignoreXids: 13}", "health.ignoreXids: 13: expected a list of XID numbers"),
        (
            "health: {recoverAfter: 0}",
            "health.recoverAfter: 0: expected a number of seconds above 0",
        ),
        (
            "allocate: {deviceSpecs: yes please}",
            "allocate.deviceSpecs: 'yes please': expected true or false",
        ),
        ("resources: [{pattern: '*'}]", "resources: .*entry 0: expected {pattern, name"),
        ("resources: [{pattern: '*', name: a/b, extra: 1}]", "entry 0: unknown key 'extra'"),
        ("- a list", "expected a mapping at the top level"),
        ("key: [unclosed", "not valid YAML"),
    ],
)
def test_bad_file_says_key_value_and_accepted(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(text, "f.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sharing: {mps: {replicas: 4}, timeSlicing: {replicas: 2}}",
            "a GPU is shared one way; accepted: one of them",
        ),
        ("sharing: {mps: {replicas: 4}}", "sharing.mps.replicas needs mps.root"),
        ("sharing: {timeSlicing: {replicas: 4, limits: hami}}", "limits: hami needs hami.library"),
        (
            "sharing: {mps: {replicas: 4}}\nmps: {root: /run/gpuwire/mps}\nallocate: {cdi: uuid}",
            "allocate.cdi: uuid with replicas held to their share: containerd applies a CDI "
            "device without gpuwire's runtime",
        ),
    ],
)
def test_a_share_nothing_would_hold_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(str(path), {})


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("sharing: {timeSlicing: {replicas: 4}}\nresourceName: example.com/gpu\n")
    config = load(str(path), {"replicas": 2, "resource": None})
    assert (config.replicas, config.resource) == (2, "example.com/gpu")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*/nope.yaml: No such file"):
        load(str(tmp_path / "nope.yaml"), {})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "0"], "--replicas: '0': expected a whole number from 1 to 1000"),
        (["--resource", "gpu"], "--resource: 'gpu': 'gpu' is not an extended resource name"),
        (["--cdi", "names"], "--cdi: 'names': expected one of none, uuid, index"),
        (["--ignore-xids", "13,x"], "--ignore-xids: '13,x'"),
        (["--recover-after", "soon"], "--recover-after: 'soon'"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.serve(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_config_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sharing: {timeSlicing: {replicas: 0}}\n")
    assert gpuwire_cli.main(["device-plugin", "serve", "--config", str(path)]) == exits.INPUT
    assert f"{path}: sharing.timeSlicing.replicas: 0" in capsys.readouterr().err
