"""`gpuwire containerd configure` as an admin meets it: the drop-in containerd will read, the
main file left as written (comments too), idempotence, dry runs, and refusals that write nothing.

containerd itself reads these configs in tests/system/test_containerd.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from gpuwire import cli as gpuwire_cli
from gpuwire import exits
from gpuwire.edits import HOOK_ENV
from gpuwire.grant import POD_ANNOTATION
from runtime_hook.setup import cli
from runtime_hook.setup.containerd_config import (
    ContainerdConfigError,
    Overlay,
    Runtime,
    Source,
    base_spec_text,
    plan,
    without_import,
)

SHIM = "/usr/local/bin/gpuwire-runtime"
HOOK = "/usr/local/bin/gpuwire-hook"
V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"

ADMIN_V2 = """\
# Managed by the platform team. Ask #infra before editing.
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"  # pinned: see INC-1234
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        pod_annotations = ["*", "example.com/*"]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
"""

ADMIN_V3 = """\
version = 3

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""


def files_reader(files: dict[Path, str]) -> Overlay:
    """Only `files` exist (an overlay over an empty disk)."""
    return Overlay(Empty(), files)


class Empty:
    def read(self, path: Path) -> str | None:
        return None

    def glob(self, pattern: str) -> list[Path]:
        return []


def applied(files: dict[Path, str], main: Path, runtime: Runtime) -> dict[Path, str]:
    result = plan(main, main.parent / "conf.d/99-gpuwire.toml", runtime, files_reader(files))
    return {**files, **{c.path: c.new for c in result.changes}}


def cri(text: str, plugin: str = V2) -> dict[str, Any]:
    section: dict[str, Any] = tomlkit.parse(text).unwrap()["plugins"][plugin]
    return section


@pytest.fixture
def main() -> Path:
    return Path("/etc/containerd/config.toml")


def test_drop_in_carries_the_whole_cri_section_and_the_runtime(main: Path) -> None:
    files = applied({main: ADMIN_V2}, main, Runtime(shim=SHIM))
    drop_in = files[main.parent / "conf.d/99-gpuwire.toml"]
    section = cri(drop_in)
    # containerd < 2.1 replaces the main file's section with this one: nothing may be lost
    assert section["sandbox_image"] == "registry.k8s.io/pause:3.9"
    runtimes = section["containerd"]["runtimes"]
    assert runtimes["runc"]["options"] == {"SystemdCgroup": True}
    assert runtimes["gpuwire"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["gpuwire"]["options"] == {"SystemdCgroup": True, "BinaryName": SHIM}
    assert section["containerd"]["default_runtime_name"] == "runc"
    assert "enable_cdi" not in section
    assert tomlkit.parse(drop_in)["version"] == 2


def test_main_file_gains_only_the_import_line(main: Path) -> None:
    files = applied({main: ADMIN_V2}, main, Runtime(shim=SHIM))
    new = files[main].splitlines()
    added = [line for line in new if line not in ADMIN_V2.splitlines()]
    assert added == ['imports = ["/etc/containerd/conf.d/99-gpuwire.toml"]']
    assert [line for line in new if line != added[0]] == ADMIN_V2.splitlines()


@pytest.mark.parametrize(
    "text", [ADMIN_V2, ADMIN_V3, 'imports = ["/etc/containerd/a.toml"]  # ours\n' + ADMIN_V2]
)
def test_unconfigure_takes_out_only_the_import_configure_added(main: Path, text: str) -> None:
    other = {Path("/etc/containerd/a.toml"): "version = 2\n"}
    files = applied({main: text, **other}, main, Runtime(shim=SHIM))
    drop_in = main.parent / "conf.d/99-gpuwire.toml"
    assert without_import(main, files[main], drop_in) == text
    assert without_import(main, text, drop_in) == text  # nothing to take out


def test_unconfigure_leaves_the_file_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(ADMIN_V2)
    main.chmod(0o600)
    assert configure("--config", str(main)) == 0
    assert cli.containerd_unconfigure(["--config", str(main)]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {main}\n")
    assert main.read_text() == ADMIN_V2
    assert main.stat().st_mode & 0o777 == 0o600
    assert cli.containerd_unconfigure(["--config", str(main)]) == 0
    assert (
        capsys.readouterr().out
        == f"no change: {main} does not import {tmp_path}/conf.d/99-gpuwire.toml\n"
    )


def test_second_run_changes_nothing(main: Path) -> None:
    runtime = Runtime(shim=SHIM, set_default=True, cdi=True)
    files = applied({main: ADMIN_V2}, main, runtime)
    again = plan(main, main.parent / "conf.d/99-gpuwire.toml", runtime, files_reader(files))
    assert again.changes == []


def test_an_existing_glob_import_is_enough(main: Path) -> None:
    text = ADMIN_V2.replace(
        "version = 2\n", 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    )
    files = applied({main: text}, main, Runtime(shim=SHIM))
    assert files[main] == text


def test_set_default_and_cdi(main: Path) -> None:
    files = applied({main: ADMIN_V2}, main, Runtime(shim=SHIM, set_default=True, cdi=True))
    section = cri(files[main.parent / "conf.d/99-gpuwire.toml"])
    assert section["containerd"]["default_runtime_name"] == "gpuwire"
    assert section["enable_cdi"] is True
    assert section["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


def test_admin_cdi_dirs_are_kept(main: Path) -> None:
    text = ADMIN_V2.replace('"registry.k8s.io/pause:3.9"', '"p"\n    cdi_spec_dirs = ["/opt/cdi"]')
    files = applied({main: text}, main, Runtime(shim=SHIM, cdi=True))
    assert cri(files[main.parent / "conf.d/99-gpuwire.toml"])["cdi_spec_dirs"] == ["/opt/cdi"]


def test_pods_cannot_pass_the_annotations_a_grant_binds(main: Path) -> None:
    """runc's `pod_annotations = ["*"]` would let a pod set io.kubernetes.cri.* itself."""
    result = plan(
        main, main.parent / "conf.d/99.toml", Runtime(shim=SHIM), files_reader({main: ADMIN_V2})
    )
    (warning,) = result.warnings
    assert warning.startswith("runc's pod_annotations ['*'] not copied to 'gpuwire'")
    runtimes = cri(result.changes[0].new)["containerd"]["runtimes"]
    assert runtimes["gpuwire"]["pod_annotations"] == ["example.com/*", POD_ANNOTATION]
    assert runtimes["runc"]["pod_annotations"] == ["*", "example.com/*"]  # runc's stays


@pytest.mark.parametrize(
    "pattern", ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.*", "io.kubernetes.cri-o.*"]
)
def test_pods_cannot_pass_the_pod_uid_or_sandbox_an_allocation_binds(
    main: Path, pattern: str
) -> None:
    """A pod that set its own pod UID could present another pod's allocation token."""
    text = ADMIN_V2.replace('["*", "example.com/*"]', f'["{pattern}", "example.com/*"]')
    result = plan(
        main, main.parent / "conf.d/99.toml", Runtime(shim=SHIM), files_reader({main: text})
    )
    (warning,) = result.warnings
    assert warning.startswith(f"runc's pod_annotations ['{pattern}'] not copied to 'gpuwire'")
    runtimes = cri(result.changes[0].new)["containerd"]["runtimes"]
    assert runtimes["gpuwire"]["pod_annotations"] == ["example.com/*", POD_ANNOTATION]


def test_version_3_uses_the_cri_runtime_plugin(main: Path) -> None:
    files = applied({main: ADMIN_V3}, main, Runtime(shim=SHIM, set_default=True, cdi=True))
    drop_in = files[main.parent / "conf.d/99-gpuwire.toml"]
    doc = tomlkit.parse(drop_in).unwrap()
    assert doc["version"] == 3
    assert list(doc["plugins"]) == [V3]
    section = doc["plugins"][V3]
    assert section["containerd"]["runtimes"]["gpuwire"]["options"] == {
        "SystemdCgroup": True,
        "BinaryName": SHIM,
    }
    assert section["containerd"]["default_runtime_name"] == "gpuwire"
    assert section["enable_cdi"] is True
    assert tomlkit.parse(files[main])["imports"] == ["/etc/containerd/conf.d/99-gpuwire.toml"]


def test_no_main_file_yet(main: Path) -> None:
    files = applied({}, main, Runtime(shim=SHIM))
    assert tomlkit.parse(files[main]).unwrap() == {
        "version": 2,
        "imports": ["/etc/containerd/conf.d/99-gpuwire.toml"],
    }
    runtimes = cri(files[main.parent / "conf.d/99-gpuwire.toml"])["containerd"]["runtimes"]
    assert runtimes == {
        "gpuwire": {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": SHIM},
            "pod_annotations": [POD_ANNOTATION],  # the one the grant binds (gpuwire.grant)
        },
        # the drop-in's runtimes table replaces containerd's built-in one: runc must stay
        "runc": {"runtime_type": "io.containerd.runc.v2"},
    }


def test_section_comes_from_the_last_file_that_has_one(main: Path) -> None:
    """containerd < 2.1 reads a later import's CRI section instead of the main file's."""
    later = Path("/etc/containerd/site.toml")
    text = ADMIN_V2.replace("version = 2\n", 'version = 2\nimports = ["site.toml"]\n')
    site = f'version = 2\n[plugins."{V2}"]\n  sandbox_image = "site/pause:1"\n'
    files = applied({main: text, later: site}, main, Runtime(shim=SHIM))
    section = cri(files[main.parent / "conf.d/99-gpuwire.toml"])
    assert section["sandbox_image"] == "site/pause:1"
    assert tomlkit.parse(files[main])["imports"] == [
        "site.toml",
        "/etc/containerd/conf.d/99-gpuwire.toml",
    ]


def test_warns_about_a_file_that_would_hide_the_runtime(main: Path) -> None:
    conf_d = main.parent / "conf.d"
    files = {
        main: 'version = 2\nimports = ["/etc/containerd/nested.toml"]\n',
        main.parent / "nested.toml": 'version = 2\nimports = ["/etc/containerd/late.toml"]\n',
        main.parent / "late.toml": f'version = 2\n[plugins."{V2}"]\n  sandbox_image = "x"\n',
    }
    result = plan(main, conf_d / "99-gpuwire.toml", Runtime(shim=SHIM), files_reader(files))
    assert len(result.warnings) == 1
    assert "late.toml is imported after" in result.warnings[0]


def test_prestart_hook_path_keeps_runc_and_writes_a_base_spec(main: Path) -> None:
    base = Path("/etc/gpuwire/containerd-base-spec.json")
    runtime = Runtime(hook=HOOK, base_spec=str(base))
    default = {"ociVersion": "1.0.2-dev", "process": {"env": ["PATH=/bin"]}, "root": {}}
    result = plan(
        main,
        main.parent / "conf.d/99-gpuwire.toml",
        runtime,
        files_reader({main: ADMIN_V2}),
        default_spec=lambda: default,
    )
    files = {c.path: c.new for c in result.changes}
    assert list(files) == [base, main.parent / "conf.d/99-gpuwire.toml", main]  # write order
    gpuwire = cri(files[main.parent / "conf.d/99-gpuwire.toml"])["containerd"]["runtimes"][
        "gpuwire"
    ]
    assert gpuwire["base_runtime_spec"] == str(base)
    assert "BinaryName" not in gpuwire["options"]
    spec = json.loads(files[base])
    assert spec["process"] == default["process"]
    for stage in ("prestart", "poststop"):  # poststop forgets the container's GPU record
        assert spec["hooks"][stage] == [
            {
                "path": HOOK,
                "args": ["gpuwire-hook", stage],
                "env": list(HOOK_ENV),  # explicit: never the container's
            }
        ]
    # runc's own base spec, when it has one, is what the hook is added to
    own = {"ociVersion": "1.0.2", "hooks": {"prestart": [{"path": "/opt/audit"}]}}
    with_own = ADMIN_V2.replace(
        'runtime_type = "io.containerd.runc.v2"\n        pod',
        'runtime_type = "io.containerd.runc.v2"\n        base_runtime_spec = "/etc/own.json"\n'
        "        pod",
    )
    result = plan(
        main,
        main.parent / "conf.d/99-gpuwire.toml",
        runtime,
        files_reader({main: with_own, Path("/etc/own.json"): json.dumps(own)}),
    )
    spec = json.loads(next(c.new for c in result.changes if c.path == base))
    assert [h["path"] for h in spec["hooks"]["prestart"]] == ["/opt/audit", HOOK]


def test_switching_from_hook_to_shim_drops_the_base_spec(main: Path) -> None:
    hooked = plan(
        main,
        main.parent / "conf.d/99-gpuwire.toml",
        Runtime(hook=HOOK),
        files_reader({main: ADMIN_V2}),
        default_spec=lambda: {"ociVersion": "1.0.2"},
    )
    files = {main: ADMIN_V2, **{c.path: c.new for c in hooked.changes}}
    files = applied(files, main, Runtime(shim=SHIM))
    gpuwire = cri(files[main.parent / "conf.d/99-gpuwire.toml"])["containerd"]["runtimes"][
        "gpuwire"
    ]
    assert "base_runtime_spec" not in gpuwire
    assert gpuwire["options"]["BinaryName"] == SHIM


def test_hook_is_replaced_not_repeated() -> None:
    once = json.loads(base_spec_text({"ociVersion": "1.0.2"}, HOOK))
    twice = json.loads(base_spec_text(once, HOOK))
    assert twice == once


def test_config_dump_is_the_source_when_given(main: Path) -> None:
    dumped = Source(main, tomlkit.parse(ADMIN_V3).unwrap())
    result = plan(
        main,
        main.parent / "conf.d/99-gpuwire.toml",
        Runtime(shim=SHIM),
        files_reader({main: "version = 2\n"}),
        dump=dumped,
    )
    drop_in = next(c.new for c in result.changes if c.path.name == "99-gpuwire.toml")
    assert tomlkit.parse(drop_in)["version"] == 3  # the dump's version: containerd 2.x migrated
    assert "gpuwire" in cri(drop_in, V3)["containerd"]["runtimes"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version = 2\n[plugins\n", "not valid TOML"),
        ('[plugins."cri".containerd]\n', "config version 1"),
        ("version = 7\n", "version = 7 is not a containerd config version"),
        (f'version = 2\n[plugins."{V2}"]\ncontainerd = "runc"\n', ".containerd = 'runc' is not a"),
        ('version = 2\nimports = "conf.d"\n', "imports = 'conf.d' is not a list"),
        ('version = 2\nimports = ["/nonexistent/x.toml"]\n', "/nonexistent/x.toml: imported by"),
    ],
)
def test_bad_config_is_refused_by_name(main: Path, text: str, message: str) -> None:
    with pytest.raises(
        ContainerdConfigError, match=message.replace(".", r"\.").replace("[", r"\[")
    ):
        plan(main, main.parent / "conf.d/99.toml", Runtime(shim=SHIM), files_reader({main: text}))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "GPU wire", "shim": SHIM}, "runtime name 'GPU wire' is not a RuntimeClass"),
        ({"shim": "gpuwire-runtime"}, "runtime path 'gpuwire-runtime' must be absolute"),
        ({"hook": "gpuwire-hook"}, "hook path 'gpuwire-hook' must be absolute"),
    ],
)
def test_bad_runtime_is_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ContainerdConfigError, match=message):
        Runtime(**kwargs)


# The command, on files.


def configure(*args: str) -> int:
    return cli.containerd_configure([*args, "--runtime-path", "/bin/true"])


def test_dry_run_prints_a_diff_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(ADMIN_V2)
    assert configure("--config", str(main), "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"--- /dev/null\n+++ {tmp_path}/conf.d/99-gpuwire.toml" in out
    assert f'+imports = ["{tmp_path}/conf.d/99-gpuwire.toml"]' in out
    assert '+BinaryName = "/bin/true"' in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]
    assert main.read_text() == ADMIN_V2


def test_writes_then_reports_no_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = tmp_path / "config.toml"
    main.write_text(ADMIN_V2)
    main.chmod(0o600)
    assert configure("--config", str(main), "--set-default") == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path}/conf.d/99-gpuwire.toml\n")
    assert main.stat().st_mode & 0o777 == 0o600
    before = {p: p.read_text() for p in tmp_path.rglob("*.toml")}
    assert configure("--config", str(main), "--set-default") == 0
    assert capsys.readouterr().out.startswith("no change:")
    assert {p: p.read_text() for p in tmp_path.rglob("*.toml")} == before


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--runtime-name", "Bad_Name"], exits.USAGE, "runtime name 'Bad_Name'"),
        (["--drop-in", "{main}"], exits.INPUT, "is the main config itself"),
        (
            ["--config-source", "command", "--containerd", "/nonexistent/containerd"],
            exits.INPUT,
            "config dump`: No such file or directory",
        ),
        (
            ["--runtime-path", "relative/gpuwire-runtime"],
            exits.USAGE,
            "not an executable at an absolute path",
        ),
        (["--runtime-path", "/nonexistent/gpuwire-runtime"], exits.USAGE, "not an executable"),
    ],
)
def test_bad_arguments_exit_2_or_3_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    main = tmp_path / "config.toml"
    main.write_text(ADMIN_V2)
    argv = ["containerd", "configure", "--config", str(main), "--runtime-path", "/bin/true", *args]
    assert gpuwire_cli.main([a.replace("{main}", str(main)) for a in argv]) == code
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]
    assert main.read_text() == ADMIN_V2


def test_invalid_file_exits_3_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main = tmp_path / "config.toml"
    main.write_text("version = 2\nimports = [\n")
    argv = ["containerd", "configure", "--config", str(main), "--runtime-path", "/bin/true"]
    assert gpuwire_cli.main(argv) == exits.INPUT
    assert f"{main}: not valid TOML" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]
