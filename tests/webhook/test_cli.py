"""`gpuwire mutate`: the offline check of a manifest, through the server's code path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuwire import cli, grant
from tests.webhook.support import EXAMPLES, K8S_VERSION, admit

NODES = str(EXAMPLES / "nodes.yaml")
POLICY = str(EXAMPLES / "policy.yaml")


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    (tmp_path / "k1").write_text("test-secret")
    return tmp_path


def test_prints_the_admitted_pod_as_the_webhook_makes_it(
    capsys: pytest.CaptureFixture[str], keys: Path
) -> None:
    example = EXAMPLES / "explicit-gpus.yaml"
    code = cli.main(["mutate", str(example), "--nodes", NODES, "--grant-key-dir", str(keys)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    printed = yaml.safe_load(out)
    kubernetes_validate.validate(printed, K8S_VERSION, strict=True)
    expected, _ = admit(yaml.safe_load(example.read_text()), "ml-research")
    assert printed == expected


def test_a_denial_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["mutate", str(EXAMPLES / "denied-unknown-model.yaml"), "--nodes", NODES])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith(
        "denied: gpuwire.io/gpu-model: 'B200' matches no GPU node; models present:"
    )


def test_warnings_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["mutate", str(EXAMPLES / "no-request.yaml"), "--policy", POLICY])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == "warning: container 'web': NVIDIA_VISIBLE_DEVICES=all replaced by void\n"
    assert yaml.safe_load(out)["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]


def test_without_keys_the_grant_is_missing_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["mutate", str(EXAMPLES / "daemonset-all-gpus.yaml")])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == f"warning: no grant key loaded: {grant.ENV} not written\n"
    assert grant.ENV not in out


def test_namespace_from_the_manifest_or_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = (EXAMPLES / "trusted-agent.yaml").read_text()
    path = tmp_path / "agent.yaml"
    path.write_text(manifest)
    assert cli.main(["mutate", str(path), "--policy", POLICY]) == 0
    assert "value: all" in capsys.readouterr().out  # monitoring is trusted
    assert cli.main(["mutate", str(path), "--policy", POLICY, "--namespace", "default"]) == 0
    out, err = capsys.readouterr()
    assert "value: void" in out
    assert "NVIDIA_VISIBLE_DEVICES=all replaced by void" in err


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("kind: Deployment\n", [], "expected a Pod (kind: Pod), got 'Deployment'"),
        ("[1, 2]\n", [], "expected a Pod (kind: Pod), got 'list'"),
        ("kind: Pod\n", ["--policy", "/nonexistent/policy.yaml"], "No such file or directory"),
        ("kind: Pod\n", ["--nodes", "/nonexistent/nodes.yaml"], "No such file or directory"),
        ("kind: Pod\nspec: [\n", [], "while parsing"),
    ],
)
def test_bad_input_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, args: list[str], message: str
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(content)
    with pytest.raises(SystemExit) as exited:
        cli.main(["mutate", str(path), *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuwire mutate: ")
    assert message in err


def test_the_console_script_reads_stdin() -> None:
    manifest = (EXAMPLES / "driver-only.yaml").read_text()
    result = subprocess.run(
        [sys.executable, "-m", "gpuwire.cli", "mutate", "-"],
        input=manifest,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "value: none" in result.stdout
