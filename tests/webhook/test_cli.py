"""`gpuwire mutate`: the offline check of a manifest, through the server's code path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwire import cli, exits, grant
from tests.webhook.support import EXAMPLES, K8S_VERSION, admit
from webhook import policy

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
    argv = ["mutate", str(example), "--nodes", NODES, "--grant-key-dir", str(keys)]
    code = cli.main([*argv, "--policy", POLICY])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    printed = yaml.safe_load(out)
    kubernetes_validate.validate(printed, K8S_VERSION, strict=True)
    expected, _ = admit(yaml.safe_load(example.read_text()), "benchmarks", policy.load(POLICY))
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
    code = cli.main(["mutate", str(EXAMPLES / "daemonset-all-gpus.yaml"), "--policy", POLICY])
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
        (
            "kind: Deployment\n",
            [],
            "pod.yaml: Deployment (document 1) has no spec.template (the pod template of a "
            "Deployment)",
        ),
        (
            "[1, 2]\n",
            [],
            "pod.yaml: no Pod or workload in it (it holds document 1 (list, not an object)); "
            "accepted: Pod, Deployment, StatefulSet, "
            "DaemonSet, ReplicaSet, Job, CronJob (or a List of them), in one or more YAML "
            "documents",
        ),
        (
            "kind: Service\nmetadata: {name: web}\n",
            [],
            "pod.yaml: no Pod or workload in it (it holds Service web); accepted: Pod,",
        ),
        (
            "kind: Pod\n",
            ["--policy", "/nonexistent/policy.yaml"],
            "policy /nonexistent/policy.yaml: No such file or directory",
        ),
        (
            "kind: Pod\n",
            ["--nodes", "/nonexistent/nodes.yaml"],
            "/nonexistent/nodes.yaml: No such file or directory",
        ),
        ("kind: Pod\nspec: [\n", [], "pod.yaml: not YAML at line 3, column 1: expected"),
    ],
)
def test_bad_input_exits_3_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, args: list[str], message: str
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(content)
    assert cli.main(["mutate", str(path), *args]) == exits.INPUT
    err = capsys.readouterr().err
    assert "gpuwire mutate: " in err
    assert message in err
    assert "Traceback" not in err


def test_a_missing_manifest_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mutate", "/nonexistent/pod.yaml"]) == exits.INPUT
    assert capsys.readouterr().err == (
        "gpuwire mutate: /nonexistent/pod.yaml: No such file or directory\n"
    )


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


TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "train"}, "annotations": {"gpuwire.io/gpu-model": "A100"}},
    "spec": {"containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]},
}


def workload(kind: str, name: str) -> dict[str, Any]:
    """A `kind` of apps/v1 or batch/v1 whose pods ask for an A100 by annotation alone."""
    if kind == "CronJob":
        spec: dict[str, Any] = {
            "schedule": "@daily",
            "jobTemplate": {"spec": {"template": {**TEMPLATE, "spec": {
                **TEMPLATE["spec"], "restartPolicy": "Never"}}}},
        }  # fmt: skip
    elif kind == "Job":
        spec = {"template": {**TEMPLATE, "spec": {**TEMPLATE["spec"], "restartPolicy": "Never"}}}
    else:
        spec = {"selector": {"matchLabels": {"app": "train"}}, "template": TEMPLATE}
        if kind == "StatefulSet":
            spec["serviceName"] = "train"
    group = "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"
    meta = {"name": name, "namespace": "ml-research"}
    return copy.deepcopy({"apiVersion": group, "kind": kind, "metadata": meta, "spec": spec})


KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")


def test_workloads_and_several_documents_are_checked_each(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, keys: Path
) -> None:
    """Before: `expected a Pod (kind: Pod), got 'Deployment'`; several documents: a YAML
    error."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}}
    documents = [*(workload(k, k.lower()) for k in KINDS), service]
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    argv = ["mutate", str(path), "--nodes", NODES, "--policy", POLICY, "--grant-key-dir", str(keys)]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "skipped: Service web: makes no pod\n"
    printed = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in printed] == list(KINDS)
    for admitted in printed:
        kubernetes_validate.validate(admitted, K8S_VERSION, strict=True)
        spec = admitted["spec"]
        template = (spec["jobTemplate"]["spec"] if admitted["kind"] == "CronJob" else spec)[
            "template"
        ]
        (trainer,) = template["spec"]["containers"]
        assert trainer["resources"] == {"limits": {"nvidia.com/gpu": "1"}}  # the policy's gpuCount
        assert template["metadata"] == TEMPLATE["metadata"]  # no namespace, no generateName
        expressions = template["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]
        assert expressions["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"  # fmt: skip


def test_of_several_objects_each_denial_names_its_own_and_the_rest_are_printed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    wishful = workload("Deployment", "wishful")
    wishful["spec"]["template"]["metadata"]["annotations"] = {"gpuwire.io/gpu-model": "B200"}
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all([workload("Job", "fine"), wishful]))
    assert cli.main(["mutate", str(path), "--nodes", NODES, "--policy", POLICY]) == exits.NO
    out, err = capsys.readouterr()
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == ["fine"]
    assert (
        "\ndenied: Deployment ml-research/wishful: gpuwire.io/gpu-model: 'B200' matches no GPU "
        "node; models present: "
    ) in err


def test_without_nodes_a_denial_says_how_to_give_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `models present: none`, and nothing said of --nodes."""
    assert cli.main(["mutate", str(EXAMPLES / "model-select.yaml"), "--policy", POLICY]) == 1
    err = capsys.readouterr().err
    assert "models present: none" in err
    assert err.endswith(
        "hint: no --nodes given, so the pod was checked against a cluster without GPU nodes; "
        "give --nodes NODES.yaml (kubectl get nodes -o yaml; examples/nodes.yaml is an example "
        "cluster) and, for the DRA path, --slices SLICES.yaml (kubectl get resourceslices -o "
        "yaml; examples/slices.yaml)\n"
    )


def test_without_nodes_a_denial_the_nodes_did_not_decide_gives_no_hint_of_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An unknown annotation is denied whatever the cluster has: no word of --nodes (before:
    the hint followed every denial)."""
    path = tmp_path / "typo.yaml"
    typo = workload("Job", "typo")
    typo["spec"]["template"]["metadata"]["annotations"] = {"gpuwire.io/gpu-modle": "A100"}
    path.write_text(yaml.safe_dump(typo))
    assert cli.main(["mutate", str(path), "--policy", POLICY]) == exits.NO
    err = capsys.readouterr().err
    assert "did you mean gpuwire.io/gpu-model?" in err
    assert "hint:" not in err
