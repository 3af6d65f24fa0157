"""The policy file: what it says, the built-in default, and errors that name key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.webhook.support import EXAMPLES
from webhook import policy
from webhook.policy import Policy, PolicyError, Rule, parse


def test_without_a_file_every_namespace_but_kube_system_may_ask_and_none_is_trusted() -> None:
    default = policy.load(None)
    assert default == Policy()
    assert default.excluded("kube-system")
    for namespace in ("default", "ml", "gpu-operator"):
        rule = default.rule(namespace)
        assert rule is not None
        assert rule.annotations
        assert not rule.trust_visible_devices
        assert rule.cdi_annotations == "strip"


def test_the_example_policy_reads_as_documented() -> None:
    example = policy.load(EXAMPLES / "policy.yaml")
    assert example.runtime_class == "gpuwire"
    assert example.rule("monitoring") == Rule(
        match=("gpu-operator", "monitoring"), trust_visible_devices=True
    )
    sandbox = example.rule("sandbox-42")
    assert sandbox is not None
    assert not sandbox.annotations
    assert example.rule("ml-research") == Rule(match=("*",))
    team = example.rule("team-a")
    assert team is not None
    assert (team.max_gpus, team.explicit_devices) == (2, False)


def test_everything_a_policy_can_say() -> None:
    text = """
excludedNamespaces: []
devicePlugin: false
unknownModel: allow
defaults:
  capabilities: [utility, compute, video]
  limitProfile: [mps, pytorch]
  runtimeClassName: nvidia
  gpuCount: none
  voidUnrequested: false
namespaces:
  - match: "team-*"
    annotations: true
    maxGpus: 2
    explicitDevices: false
    capabilities: all
    trustVisibleDevices: false
    cdiAnnotations: deny
"""
    assert parse(text) == Policy(
        excluded_namespaces=(),
        device_plugin=False,
        unknown_model="allow",
        capabilities="compute,utility,video",
        limit_profiles=("mps", "pytorch"),
        runtime_class="nvidia",
        gpu_count="none",
        void_unrequested=False,
        rules=(
            Rule(match=("team-*",), max_gpus=2, explicit_devices=False, cdi_annotations="deny"),
        ),
    )


def test_first_matching_rule_wins_and_unmatched_namespaces_have_none() -> None:
    p = parse("namespaces: [{match: [a-*], maxGpus: 1}, {match: [a-b], maxGpus: 2}]")
    rule = p.rule("a-b")
    assert rule is not None
    assert rule.max_gpus == 1
    assert p.rule("b") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "devicePlugn: true",
            "policy file: unknown key devicePlugn; accepted: excludedNamespaces, devicePlugin",
        ),
        (
            "devicePlugin: maybe",
            "policy devicePlugin: 'maybe' is not accepted; accepted: true or false",
        ),
        (
            "unknownModel: ignore",
            "policy unknownModel: 'ignore' is not accepted; accepted: deny or allow",
        ),
        (
            "defaults: {capabilities: cuda}",
            "policy defaults.capabilities: 'cuda' is not accepted; accepted: all or",
        ),
        (
            "defaults: {limitProfile: vcuda}",
            "policy defaults.limitProfile: 'vcuda' is not accepted; accepted: hami, mps",
        ),
        (
            "defaults: {gpuCount: 0}",
            "policy defaults.gpuCount: 0 is not accepted; accepted: all or a positive",
        ),
        (
            "defaults: {runtimeClassName: ''}",
            "policy defaults.runtimeClassName: '' is not accepted",
        ),
        (
            "namespaces: {match: x}",
            "policy namespaces: {'match': 'x'} is not accepted; accepted: a list of rules",
        ),
        ("namespaces: [{maxGpus: 1}]", "policy namespaces[0]: a rule needs match:"),
        (
            "namespaces: [{match: x, maxGPUs: 1}]",
            "policy namespaces[0]: unknown key maxGPUs; accepted: match,",
        ),
        (
            "namespaces: [{match: [x, 3]}]",
            "policy namespaces[0].match: ['x', 3] is not accepted; accepted: a name",
        ),
        ("- a\n- b", "policy file: ['a', 'b'] is not accepted; accepted: a mapping"),
        ("a: [", "policy: not YAML"),
    ],
)
def test_errors_name_the_key_the_value_and_what_is_accepted(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse(text)
    assert expected in str(caught.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="No such file or directory"):
        policy.load(tmp_path / "nope.yaml")


def test_an_empty_file_is_the_default() -> None:
    assert parse("") == Policy()
