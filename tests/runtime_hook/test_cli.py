"""`gpuwire grant verify`: the same decision as the hook, explained, and nothing claimed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwire import allocation, claimtoken, cli, exits
from testbed.lab import (
    ADMISSION,
    OTHER_POD,
    POD_UID,
    SANDBOX,
    Lab,
    container_spec,
    cri_annotations,
    grant_for,
)


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path / "lab")


def verify(
    lab: Lab, spec: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, str]]:
    path = lab.root / "config.json"
    path.write_text(json.dumps(spec))
    code = cli.main(["grant", "verify", "--spec", str(path), "--config", str(lab.config)])
    lines = capsys.readouterr().out.splitlines()
    return code, {line[:12].strip(): line[12:] for line in lines}


def test_valid_grant_is_explained(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0,1", "GPUWIRE_GRANT": grant_for(lab.keys, "0,1")}
    code, out = verify(lab, container_spec(env), capsys)
    assert code == 0
    assert out["container"] == f"team-a/trainer (pod {POD_UID}, sandbox 555555555555)"
    assert out["grant"] == (
        "valid: key '2026-06' signs namespace=team-a container=trainer devices=0,1 "
        f"capabilities=compute,utility pod={ADMISSION} and no limits"
    )
    assert out["decision"] == (
        f"honoured (grant): GPUs 0 ({lab.uuid(0)}), 1 ({lab.uuid(1)}); capabilities compute,utility"
    )


def test_grant_from_another_namespace_is_refused_with_the_reason(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    spec = container_spec(env, cri_annotations(namespace="team-b"))
    code, out = verify(lab, spec, capsys)
    assert code == 1
    assert out["grant"].startswith("invalid: key '2026-06' does not sign namespace=team-b")
    assert out["decision"].startswith("refused: NVIDIA_VISIBLE_DEVICES=0 ")


def test_duplicate_env_and_privilege_are_noted(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = container_spec(
        ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=2"], bounding=["CAP_SYS_ADMIN"]
    )
    code, out = verify(lab, spec, capsys)
    assert code == 0
    assert out["privileged"] == "yes (CAP_SYS_ADMIN)"
    assert out["note"] == "NVIDIA_VISIBLE_DEVICES is set 2 times (all, 2): the last value counts"
    assert (
        out["decision"]
        == f"honoured (privileged): GPUs 2 ({lab.uuid(2)}); capabilities compute,utility"
    )


def test_allocation_is_checked_but_not_claimed(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(3)], lab.keys).token
    mount = {
        "destination": allocation.container_path(token),
        "source": f"{lab.allocations}/{token}",
        "type": "bind",
    }

    def spec(sandbox: str = SANDBOX, pod: str | None = POD_UID) -> dict[str, Any]:
        return container_spec({}, cri_annotations(sandbox=sandbox, pod=pod), mounts=[mount])

    code, out = verify(lab, spec(), capsys)
    assert code == 0
    assert out["allocation"] == (
        f"{token}: valid, GPUs {lab.uuid(3)}; for pod {POD_UID}, in any of its sandboxes"
    )
    assert out["decision"].startswith(f"honoured (allocation): GPUs 3 ({lab.uuid(3)})")
    assert not (lab.allocations / f"{token}.claim").exists()
    code, out = verify(lab, spec(pod=None), capsys)
    assert out["allocation"] == (
        f"{token}: valid, GPUs {lab.uuid(3)}; for sandbox 555555555555 only "
        "(the spec names no pod UID)"
    )
    allocation.claim(lab.allocations, token, "9" * 64, OTHER_POD)
    code, out = verify(lab, spec(), capsys)
    assert code == 1
    assert (
        out["allocation"]
        == f"{token}: allocation {token} belongs to pod {OTHER_POD}, not {POD_UID}"
    )
    code, out = verify(lab, spec(pod=None), capsys)
    assert out["allocation"] == (
        f"{token}: allocation {token} belongs to sandbox 999999999999, not 555555555555"
    )
    code, out = verify(lab, spec(sandbox="8" * 64, pod=OTHER_POD), capsys)
    assert code == 0  # the owner's new sandbox


def test_a_claim_is_explained(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    uid = "3c0ffee0-0000-4000-8000-000000000001"
    devices = (claimtoken.ClaimDevice("gpu-2", lab.uuid(2)),)
    claimtoken.write(str(lab.allocations), claimtoken.ClaimToken(
        uid, "team-a", "gpus", (POD_UID,), devices), lab.keys)  # fmt: skip
    mount = {"destination": claimtoken.container_path(uid, "gpu-2"), "type": "bind",
             "source": claimtoken.path(str(lab.allocations), uid)}  # fmt: skip
    env = {"NVIDIA_VISIBLE_DEVICES": lab.uuid(2)}
    code, out = verify(lab, container_spec(env, mounts=[mount]), capsys)
    assert code == 0
    assert out["claim"] == f"team-a/gpus ({uid}): valid, gpu-2 ({lab.uuid(2)}); for pod {POD_UID}"
    assert out["decision"].startswith(f"honoured (claim): GPUs 2 ({lab.uuid(2)})")
    code, out = verify(lab, container_spec(env, cri_annotations(pod=OTHER_POD), [mount]), capsys)
    assert code == 1
    refusal = f"claim team-a/gpus is reserved for pod {POD_UID}, not {OTHER_POD}"
    assert out["claim"] == f"{uid}: {refusal}"
    assert out["decision"].startswith("cannot start: claim team-a/gpus is reserved for pod")
    elsewhere = {**mount, "source": str(lab.root / "planted")}
    code, out = verify(lab, container_spec(env, mounts=[elsewhere]), capsys)
    token = claimtoken.path(str(lab.allocations), uid)
    assert out["note"] == f"claim mount {uid}/gpu-2 ignored: its source is not {token}"


def test_not_a_gpu_container(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = verify(lab, container_spec({}), capsys)
    assert code == 0
    assert out["decision"] == "not a GPU container: NVIDIA_VISIBLE_DEVICES is unset, empty or void"


def test_bad_input_is_a_clear_error(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    missing = lab.root / "nope"
    argv = ["grant", "verify", "--config", str(lab.config)]
    assert cli.main([*argv, "--bundle", str(missing)]) == exits.INPUT
    assert capsys.readouterr().err == (
        f"gpuwire grant verify: cannot read spec {missing}/config.json: No such file or directory\n"
    )
    (lab.root / "list.json").write_text("[]")
    assert cli.main([*argv, "--spec", str(lab.root / "list.json")]) == exits.INPUT
    assert "not a JSON object" in capsys.readouterr().err
