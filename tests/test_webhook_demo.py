"""`make demo` (the webhook part): every example goes through the served webhook over TLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import demo


def test_the_scenario_admits_and_denies_every_example(tmp_path: Path) -> None:
    with demo.webhook_scenario(tmp_path) as hook:
        results = {r.example: r for r in demo.admit_examples(hook)}
    assert set(results) == {name for name, _ in demo.example_pods()}
    denied = sorted(name for name, r in results.items() if not r.allowed)
    assert denied == ["denied-bad-annotations.yaml", "denied-unknown-model.yaml"]
    assert all(results[name].code == 400 for name in denied)
    assert results["no-request.yaml"].patch == [
        {
            "op": "replace",
            "path": "/spec/containers/0/env/0",
            "value": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        }
    ]


def test_the_printout_says_what_changed(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "13 pods: 11 admitted, 2 denied" in out
    assert "+ required node affinity: kubernetes.io/hostname In ['gpu-a100-80g-0']" in out
    assert "- env jupyter: CUDA_DEVICE_MEMORY_LIMIT_0" in out
    assert "DENIED (400): gpuwire.io/gpu-model: 'B200' matches no GPU node" in out
