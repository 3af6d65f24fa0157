"""`gpuwire cdi generate`: a CDI spec engines accept, from the same edits the shim applies.

Fields are checked against the CDI spec (cncf-tags/container-device-interface `SPEC.md`
v1.1.0, `specs-go/config.go`, `specs-go/version.go`); podman reads the spec
for real in tests/system/test_podman.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwire import cdi, exits, sim
from gpuwire import cli as gpuwire_cli
from gpuwire.driver import Driver, discover
from gpuwire.edits import HOOK_ENV
from gpuwire.roots import Roots
from runtime_hook.setup import cli

HOOK, LDCONFIG = "/usr/local/bin/gpuwire-hook", "/sbin/ldconfig"
VERSION = sim.DEFAULT_DRIVER
# Every field CDI v0.5.0 defines, per object: an engine refuses any other.
FIELDS = {
    "spec": {"cdiVersion", "kind", "devices", "containerEdits"},
    "device": {"name", "containerEdits"},
    "edits": {"env", "deviceNodes", "mounts", "hooks"},
    "deviceNode": {
        "path",
        "hostPath",
        "type",
        "major",
        "minor",
        "fileMode",
        "permissions",
        "uid",
        "gid",
    },
    "mount": {"hostPath", "containerPath", "options", "type"},
    "hook": {"hookName", "path", "args", "env", "timeout"},
}


@pytest.fixture
def node(sim_node: tuple[Path, sim.Machine]) -> tuple[Path, sim.Machine]:
    return sim_node


@pytest.fixture
def driver(node: tuple[Path, sim.Machine]) -> Driver:
    return discover(Roots(str(node[0])))


def check_fields(spec: dict[str, Any]) -> None:
    assert set(spec) <= FIELDS["spec"]
    for edits in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]:
        assert set(edits) <= FIELDS["edits"]
        for kind, items in (("deviceNode", "deviceNodes"), ("mount", "mounts"), ("hook", "hooks")):
            for item in edits.get(items, []):
                assert set(item) <= FIELDS[kind], item
    for device in spec["devices"]:
        assert set(device) <= FIELDS["device"]
        assert device["containerEdits"], device["name"]  # CDI refuses a device without edits


def test_devices_by_index_uuid_and_all(driver: Driver, node: tuple[Path, sim.Machine]) -> None:
    root, machine = node
    spec = cdi.generate(driver, HOOK, LDCONFIG)
    check_fields(spec)
    assert spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    expected = [name for d in machine.devices for name in (str(d.index), d.uuid)]
    assert names == [*expected, "all"]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for d in machine.devices:
        (gpu,) = by_name[str(d.index)]["deviceNodes"]
        assert by_name[d.uuid]["deviceNodes"] == [gpu]
        assert gpu == {
            "path": f"/dev/nvidia{d.minor}",
            "hostPath": f"{root}/dev/nvidia{d.minor}",
            "type": "c",  # type, major and minor make the engine write the cgroup rule
            "major": 195,
            "minor": d.minor,
            "fileMode": 0o666,
            "permissions": "rwm",
            "uid": 0,
            "gid": 0,
        }
    assert [n["minor"] for n in by_name["all"]["deviceNodes"]] == [0, 1, 2, 3]


def test_common_edits_are_those_the_shim_applies(driver: Driver) -> None:
    common = cdi.generate(driver, HOOK, LDCONFIG)["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ]
    assert common["deviceNodes"][1]["major"] == sim.UVM_MAJOR  # from /proc/devices
    targets = {m["containerPath"] for m in common["mounts"]}
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" in targets
    assert f"/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.{VERSION}" in targets  # all caps
    assert "/usr/bin/nvidia-smi" in targets
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in targets
    assert all(m["options"] == ["ro", "nosuid", "nodev", "bind"] for m in common["mounts"])
    (hook,) = common["hooks"]
    assert hook["hookName"] == "createRuntime"  # runtime namespaces: the resident serves it
    assert hook["path"] == HOOK
    assert hook["env"] == list(HOOK_ENV)  # explicit: never the image's env
    assert hook["args"][:4] == ["gpuwire-hook", "ldcache", "--ldconfig", LDCONFIG]
    assert "--folder" in hook["args"]
    assert f"libcuda.so.{VERSION}::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in hook["args"]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=all"]


def test_capabilities_limit_the_files(driver: Driver) -> None:
    common = cdi.generate(driver, HOOK, LDCONFIG, ("utility",))["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl"]
    targets = {m["containerPath"] for m in common["mounts"]}
    assert f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}" in targets
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" not in targets


def test_libraries_go_where_the_host_keeps_them(tmp_path: Path) -> None:
    """A RHEL-layout host: lib64 in the spec too (the ld-cache hook adds it for any image)."""
    sim.write_node(tmp_path, sim.make_machine(1), layout="rhel")
    common = cdi.generate(discover(Roots(str(tmp_path))), HOOK, LDCONFIG)["containerEdits"]
    assert f"/usr/lib64/libcuda.so.{VERSION}" in {m["containerPath"] for m in common["mounts"]}
    assert common["hooks"][0]["args"][4:6] == ["--folder", "/usr/lib64"]


def test_host_paths_are_clean_with_the_real_root() -> None:
    driver = Driver(Roots("/"), VERSION, sim.make_machine(1).devices, 195, {}, {}, {}, {}, ())
    (gpu,) = cdi.generate(driver, HOOK, LDCONFIG)["devices"][0]["containerEdits"]["deviceNodes"]
    assert gpu["hostPath"] == "/dev/nvidia0"


@pytest.mark.parametrize(
    ("extra", "version"),
    [
        ({}, "0.3.0"),
        ({"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]}, "0.4.0"),
        ({"deviceNodes": [{"path": "/dev/x", "hostPath": "/h/dev/x"}]}, "0.5.0"),
        ({"additionalGids": [5]}, "0.7.0"),
        ({"intelRdt": {"closID": "x"}}, "0.7.0"),
        ({"netDevices": [{"hostInterfaceName": "eth1", "name": "eth1"}]}, "1.1.0"),
    ],
)
def test_lowest_version_the_fields_allow(extra: dict[str, Any], version: str) -> None:
    spec = {"kind": "example.com/dev", "devices": [{"name": "a", "containerEdits": extra}]}
    assert cdi.minimum_version(spec) == version


def test_version_rules_on_names_kinds_and_annotations() -> None:
    def spec(kind: str = "example.com/dev", name: str = "a", **more: Any) -> dict[str, Any]:
        return {"kind": kind, "devices": [{"name": name, "containerEdits": {}}], **more}

    assert cdi.minimum_version(spec(name="0")) == "0.5.0"  # a digit-leading name
    assert cdi.minimum_version(spec(kind="example.com/gpu.mig")) == "0.6.0"  # dot in class
    assert cdi.minimum_version(spec(annotations={"a": "b"})) == "0.6.0"


def test_a_node_without_gpus_has_no_spec(tmp_path: Path) -> None:
    sim.write_node(tmp_path, sim.make_machine(0))
    with pytest.raises(cdi.CdiError, match="lists no GPU"):
        cdi.generate(discover(Roots(str(tmp_path))), HOOK, LDCONFIG)


# The command.


@pytest.fixture
def command(
    node: tuple[Path, sim.Machine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A gpuwire config naming an executable hook; returns the node root."""
    config = tmp_path / "gpuwire.toml"
    config.write_text(f'hook = "/bin/true"\nldconfig = "{LDCONFIG}"\n')
    monkeypatch.setenv("GPUWIRE_CONFIG", str(config))
    return node[0]


@pytest.mark.parametrize("name", ["nvidia.json", "nvidia.yaml", "nvidia.yml"])
def test_format_follows_the_extension(command: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / "cdi" / name
    assert cli.cdi_generate(["--root", str(command), "--output", str(out)]) == 0
    text = out.read_text()
    spec = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"]["hooks"][0]["path"] == "/bin/true"
    assert spec == cdi.generate(discover(Roots(str(command))), "/bin/true", LDCONFIG)
    if not name.endswith(".json"):
        assert "&id" not in text  # no YAML anchors: each device spelled out


def test_stdout_is_yaml_unless_told(command: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.cdi_generate(["--root", str(command), "--kind", "example.com/gpu"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "example.com/gpu"
    assert cli.cdi_generate(["--root", str(command), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "nvidia.com/gpu"


def test_format_for_a_file_renamed_later(command: Path, tmp_path: Path) -> None:
    out = tmp_path / "nvidia.yaml.new"
    assert cli.cdi_generate(["--root", str(command), "--output", str(out), "--format", "yaml"]) == 0
    assert yaml.safe_load(out.read_text())["cdiVersion"] == "0.5.0"


def test_an_unchanged_spec_is_not_rewritten(
    command: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nvidia.yaml"
    assert cli.cdi_generate(["--root", str(command), "--output", str(out)]) == 0
    first = out.stat()
    assert cli.cdi_generate(["--root", str(command), "--output", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"no change: {out}")
    assert out.stat().st_ino == first.st_ino  # not replaced


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "spec.txt"], "extension '.txt' is not one CDI engines load"),
        (["--kind", "nvidia"], "kind 'nvidia' is not a CDI kind"),
        (["--kind", "nvidia.com/-gpu"], "kind 'nvidia.com/-gpu' is not a CDI kind"),
        (["--capabilities", "compute,warp"], "unknown driver capability warp"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    command: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    argv = ["cdi", "generate", "--root", str(command), "--output", "nvidia.yaml", *args]
    assert gpuwire_cli.main(argv) == exits.USAGE
    assert message in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == before


def test_no_driver_is_exit_3_naming_where_it_looked(
    command: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    argv = ["cdi", "generate", "--root", str(command), "--proc-root", "/nonexistent"]
    assert gpuwire_cli.main([*argv, "--output", "nvidia.yaml"]) == exits.INPUT
    assert "gpuwire cdi generate: no NVIDIA driver: /nonexistent/proc/driver" in (
        capsys.readouterr().err
    )
    assert sorted(tmp_path.iterdir()) == before


def test_a_hook_that_is_not_there_is_refused(
    command: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gpuwire.toml"
    config.write_text('hook = "/nonexistent/gpuwire-hook"\n')
    assert gpuwire_cli.main(["cdi", "generate", "--root", str(command)]) == exits.INPUT
    assert "hook '/nonexistent/gpuwire-hook'" in capsys.readouterr().err


def test_roots_combine_as_the_runtime_config_does(
    command: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--root sets all three roots; --dev-root then moves only the device nodes."""
    devs = tmp_path / "devroot"
    (devs / "dev").mkdir(parents=True)
    args = ["--root", str(command), "--dev-root", str(devs), "--output", str(tmp_path / "s.json")]
    assert cli.cdi_generate(args) == 0
    spec = json.loads((tmp_path / "s.json").read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == (
        f"{devs}/dev/nvidia0"
    )
    assert spec["containerEdits"]["deviceNodes"] == []  # no control nodes under that dev root
    assert spec["containerEdits"]["mounts"][0]["hostPath"].startswith(str(command))


def test_the_hook_is_gpuwire_call_where_the_install_built_it(tmp_path: Path) -> None:
    """No /bin/sh on a CDI start: the spec names gpuwire-call (called as gpuwire-hook)
    beside the launcher, found where the host keeps it; the launcher where none was built."""
    libexec = tmp_path / "host/opt/gpuwire/current/libexec"
    libexec.mkdir(parents=True)
    (libexec / "gpuwire-hook").write_text("#!/bin/sh\n")
    host_launcher = "/opt/gpuwire/current/libexec/gpuwire-hook"
    assert cdi.hook_program(host_launcher, str(tmp_path / "host")) == host_launcher
    (libexec / "gpuwire-call").write_bytes(b"\x7fELF")
    assert cdi.hook_program(host_launcher, str(tmp_path / "host")) == host_launcher  # not +x
    (libexec / "gpuwire-call").chmod(0o755)
    call = "/opt/gpuwire/current/libexec/gpuwire-call"
    assert cdi.hook_program(host_launcher, str(tmp_path / "host")) == call
    assert cdi.hook_program(str(libexec / "gpuwire-hook")) == str(libexec / "gpuwire-call")
