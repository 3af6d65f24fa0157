"""The shipped policies' defaults are safe, and the docs say what they are.

In every policy gpuwire ships (deploy/base, each overlay, examples/) a pod that asks by
annotation alone gets its GPUs the way the variant allocates them: one from the device
plugin, or a claim of one; never every GPU of a node by accident. Taking every GPU without
the device plugin, and naming GPUs, go only where a rule names the namespace. The README's
and the docs' stated defaults are the shipped ones (before: the README said the default
limit profile is `hami`, deploy/base ships `mps`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.webhook.support import A100_80, EXAMPLES, KEYS, NODES, ROOT
from webhook import policy, pools
from webhook.mutation import Outcome, mutate
from webhook.policy import Policy

SLICES = pools.load(EXAMPLES / "slices.yaml")
SHIPPED = {
    "base": ROOT / "deploy/base/policy.yaml",
    "cdi": ROOT / "deploy/overlays/cdi/policy.yaml",
    "dra": ROOT / "deploy/overlays/dra/policy.yaml",
    "plugin-less": ROOT / "deploy/overlays/plugin-less/policy.yaml",
}


def shipped(name: str) -> Policy:
    if name == "examples":
        return policy.load(EXAMPLES / "policy.yaml")
    config_map = yaml.safe_load(SHIPPED[name].read_text())
    return policy.parse(config_map["data"]["policy.yaml"], str(SHIPPED[name]))


def asking(annotations: dict[str, str], namespace: str, name: str) -> Outcome:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "cuda"}]},
    }
    return mutate(pod, namespace, shipped(name), NODES, KEYS, SLICES)


def patched(outcome: Outcome, path: str) -> Any:
    return next(op["value"] for op in outcome.patch if op["path"] == path)


@pytest.mark.parametrize("name", ["base", "cdi", "examples"])
def test_an_annotation_alone_gets_one_gpu_from_the_device_plugin(name: str) -> None:
    """Before: NVIDIA_VISIBLE_DEVICES=all and affinity to an 8-GPU node, silently."""
    outcome = asking({"gpuwire.io/gpu-model": "A100"}, "team-x", name)
    assert outcome.denial is None
    limits = patched(outcome, "/spec/containers/0/resources")
    assert limits == {"limits": {"nvidia.com/gpu": "1"}}
    assert "all" not in str(outcome.patch)
    hami = asking({"nvidia.com/use-gputype": "H100"}, "team-x", name)  # HAMi's alias alone
    assert patched(hami, "/spec/containers/0/resources") == {"limits": {"nvidia.com/gpu": "1"}}


def test_on_the_dra_path_an_annotation_alone_is_a_claim_of_one_gpu() -> None:
    outcome = asking({"gpuwire.io/gpu-model": "H100"}, "team-x", "dra")
    assert outcome.denial is None
    (template,) = outcome.templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["firstAvailable" if "firstAvailable" in request else "exactly"]["count"] == 1


@pytest.mark.parametrize("name", ["base", "cdi", "plugin-less", "examples"])
def test_every_gpu_of_a_node_and_named_gpus_only_where_a_rule_names_the_namespace(
    name: str,
) -> None:
    for asked, rule in [
        ({"gpuwire.io/gpu-count": "all"}, "allGpus: true"),
        ({"gpuwire.io/gpu-uuid": A100_80[0]}, "explicitDevices: true"),
        ({"nvidia.com/use-gpuuuid": A100_80[0]}, "explicitDevices: true"),
    ]:
        denial = asking(asked, "team-x", name).denial
        assert denial is not None, (name, asked)
        assert denial.code == 403
        assert denial.message.endswith(f"for the namespace: {rule}")


def test_the_plugin_less_variant_serves_the_namespaces_it_names() -> None:
    outcome = asking({"gpuwire.io/gpu-model": "A100"}, "gpu-node-agents", "plugin-less")
    assert outcome.denial is None
    env = {e["name"]: e["value"] for e in patched(outcome, "/spec/containers/0/env")}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


# What each piece of a plugin-less denial's "accepted here" asks the pod to say instead
ADVICE = {
    "no GPU (gpuwire.io/gpu-count: none)": {"gpuwire.io/gpu-count": "none"},
    "gpuwire.io/gpu-count: all": {"gpuwire.io/gpu-count": "all"},
    "GPU UUIDs in gpuwire.io/gpu-uuid": {"gpuwire.io/gpu-uuid": A100_80[0]},
}
ASKED_WITHOUT_PLUGIN = [
    {"gpuwire.io/gpu-model": "A100"},  # the policy's gpuCount: all
    {"gpuwire.io/gpu-count": "all"},
    {"gpuwire.io/gpu-count": "1"},
    {"gpuwire.io/gpu-uuid": A100_80[0]},
]


def plugin_less(**rule: bool) -> Policy:
    """The shipped plugin-less policy with a rule for team-x first (an admin's)."""
    config_map = yaml.safe_load(SHIPPED["plugin-less"].read_text())
    text = yaml.safe_load(config_map["data"]["policy.yaml"])
    text["namespaces"].insert(0, {"match": ["team-x"], **rule})
    return policy.parse(yaml.safe_dump(text), "plugin-less with a rule for team-x")


def denial_without_plugin(asked: dict[str, str], rules: Policy) -> str | None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": asked},
        "spec": {"containers": [{"name": "app", "image": "cuda"}]},
    }
    denial = mutate(pod, "team-x", rules, NODES, KEYS, SLICES).denial
    return None if denial is None else denial.message


@pytest.mark.parametrize(
    "rule", [{}, {"allGpus": True}, {"explicitDevices": True}], ids=["none", "all", "named"]
)
def test_without_a_device_plugin_a_denial_s_advice_is_admitted(rule: dict[str, bool]) -> None:
    """In a plugin-less policy's namespace, what a denial accepts, followed, is admitted, and
    so is the pod once an admin adds the rule it names. Before: the all-GPUs denial offered
    `gpu-count: N` (or nvidia.com/gpu: N), which the next denial refused as "only a device
    plugin can choose", offering all or explicit GPUs, which the namespace may not have."""
    rules = plugin_less(**rule)
    for asked in ASKED_WITHOUT_PLUGIN:
        message = denial_without_plugin(asked, rules)
        if message is None:
            continue
        accepted = re.search(r"; accepted here: (.*?); ", message)
        assert accepted is not None, message
        assert "device plugin would not know" not in message
        for advice in accepted.group(1).split(", or "):
            followed = {k: v for k, v in asked.items() if k == "gpuwire.io/gpu-model"}
            followed.update(ADVICE[advice])
            assert denial_without_plugin(followed, rules) is None, (asked, advice)
        for allowing in re.findall(r"(allGpus|explicitDevices): true", message):
            assert allowing not in rule
            if not message.startswith("gpuwire.io/gpu-count: '1'"):  # that one asks for more
                assert denial_without_plugin(asked, plugin_less(**rule, **{allowing: True})) is None


@pytest.mark.parametrize("name", [*SHIPPED, "examples"])
def test_a_typo_is_denied_in_every_shipped_policy(name: str) -> None:
    denial = asking({"gpuwire.io/gpu-modle": "A100"}, "team-x", name).denial
    assert denial is not None
    assert "did you mean gpuwire.io/gpu-model?" in denial.message


def test_a_limit_larger_than_every_gpu_is_denied_naming_the_sizes() -> None:
    """Before: `gpu-memory-limit: 100Gi` on 80 GiB GPUs was admitted without a word."""
    outcome = asking({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-memory-limit": "100Gi"},
                     "team-x", "examples")  # fmt: skip
    assert outcome.denial is not None
    assert outcome.denial.message == (
        "gpuwire.io/gpu-memory-limit: '100Gi' (= 102400 MiB) is more than any GPU the pod can "
        "get has, so it would cap nothing; GPUs there: NVIDIA A100-SXM4-40GB 40960 MiB, "
        "NVIDIA A100-SXM4-80GB 81920 MiB; accepted: at most 81920 MiB, or a share of the GPU "
        "(e.g. 50%)"
    )
    fits = asking({"gpuwire.io/gpu-model": "A100", "gpuwire.io/gpu-memory-limit": "80Gi"},
                  "team-x", "examples")  # fmt: skip
    assert fits.denial is None


# --- what the docs say the defaults are


def said(path: Path, pattern: str) -> str:
    found = re.search(pattern, " ".join(path.read_text().split()))
    assert found is not None, f"{path.name} no longer says {pattern!r}"
    return found.group(1)


def test_the_readme_and_the_docs_state_the_shipped_defaults() -> None:
    built_in, base = Policy(), shipped("base")
    readme, docs, install = (
        ROOT / "README.md",
        ROOT / "docs/annotations.md",
        ROOT / "docs/install.md",
    )
    assert (
        said(readme, r"built in `(\w+)`, `deploy/base` ships `\w+`") == built_in.limit_profiles[0]
    )
    assert said(readme, r"built in `\w+`, `deploy/base` ships `(\w+)`") == base.limit_profiles[0]
    assert said(docs, r"default from the policy \(built in `(\w+)`") == built_in.limit_profiles[0]
    assert said(docs, r"`deploy/base` ships `(\w+)`\)") == base.limit_profiles[0]
    assert said(install, r"the policy's default limit profile is `(\w+)`") == base.limit_profiles[0]
    assert said(docs, r"CAPABILITIES`; default from the policy \(`([\w,]+)`\)") == (
        built_in.capabilities
    )
    assert said(docs, r"policy's `gpuCount` applies \(default `(\w+)`\)") == str(built_in.gpu_count)
    assert said(readme, r"default `(\w+)`, from the device plugin") == str(base.gpu_count)
    for name in ("base", "cdi", "dra"):
        assert shipped(name).gpu_count == built_in.gpu_count == 1
    assert built_in.unknown_annotations == base.unknown_annotations == "deny"
