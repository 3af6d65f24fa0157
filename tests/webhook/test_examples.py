"""Every pod in examples/ is admitted (or denied) as its header comment says, under the example
policy and the example cluster (its nodes, and for the DRA examples its slices)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwire import cli, grant
from testbed import dracluster
from tests.webhook.support import A100_80, EXAMPLES, NODES, ROOT, admit, env, required_terms, run
from webhook import policy, pools

POLICY = policy.load(EXAMPLES / "policy.yaml")
SLICES = pools.load(EXAMPLES / "slices.yaml")
Pod = dict[str, Any]


def load(name: str) -> tuple[Pod, str]:
    p: Pod = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return p, p["metadata"]["namespace"]


def expressions(p: Pod) -> list[dict[str, Any]]:
    (term,) = required_terms(p)
    found: list[dict[str, Any]] = term["matchExpressions"]
    return found


def model_select(p: Pod, warnings: tuple[str, ...]) -> None:
    assert expressions(p) == [
        {
            "key": "nvidia.com/gpu.product",
            "operator": "In",
            "values": ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"],
        }
    ]
    assert env(p, "trainer").keys() == {"NVIDIA_DRIVER_CAPABILITIES", grant.ENV}
    assert p["spec"]["runtimeClassName"] == "gpuwire"


def model_exclude(p: Pod, warnings: tuple[str, ...]) -> None:
    assert {"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["Tesla-T4"]} in (
        expressions(p)
    )
    assert {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40959"]} in expressions(p)


def daemonset_all_gpus(p: Pod, warnings: tuple[str, ...]) -> None:
    e = env(p, "transcoder")
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert e["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility,video"
    assert "affinity" not in p["spec"]


def explicit_gpus(p: Pod, warnings: tuple[str, ...]) -> None:
    assert env(p, "bench")["NVIDIA_VISIBLE_DEVICES"] == f"{A100_80[0]},{A100_80[1]}"
    assert expressions(p) == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a100-80g-0"]}
    ]


def limits_hami(p: Pod, warnings: tuple[str, ...]) -> None:
    assert {"key": "gpuwire.io/limits.hami", "operator": "In", "values": ["true"]} in (
        expressions(p)
    )
    e = env(p, "jupyter")
    assert (e["CUDA_DEVICE_MEMORY_LIMIT"], e["CUDA_DEVICE_SM_LIMIT"]) == ("20480m", "30")
    assert e["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in e
    assert "container 'jupyter': CUDA_DEVICE_MEMORY_LIMIT_0=80g removed" in warnings


def limits_mps(p: Pod, warnings: tuple[str, ...]) -> None:
    assert {"key": "gpuwire.io/limits.mps", "operator": "In", "values": ["true"]} in expressions(p)
    assert "profile 'pytorch' is advisory: the framework reads it, nothing enforces it" in warnings
    e = env(p, "server")
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert e["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True,per_process_memory_fraction:0.25"
    )


def containers(p: Pod, warnings: tuple[str, ...]) -> None:
    trainer = p["spec"]["containers"][0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert grant.ENV in env(p, "trainer")
    assert env(p, "log-shipper") == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert env(p, "fetch-dataset") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def hami_aliases(p: Pod, warnings: tuple[str, ...]) -> None:
    assert expressions(p) == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}
    ]


def hami_resources(p: Pod, warnings: tuple[str, ...]) -> None:
    assert p["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    e = env(p, "app")
    assert (e["CUDA_DEVICE_MEMORY_LIMIT"], e["CUDA_DEVICE_SM_LIMIT"]) == ("8192m", "30")
    assert {"key": "gpuwire.io/limits.hami", "operator": "In", "values": ["true"]} in (
        expressions(p)
    )
    assert any("HAMi's nvidia.com/gpumem: 8192" in w for w in warnings)


def no_request(p: Pod, warnings: tuple[str, ...]) -> None:
    assert env(p, "web") == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert warnings == ("container 'web': NVIDIA_VISIBLE_DEVICES=all replaced by void",)


def trusted_agent(p: Pod, warnings: tuple[str, ...]) -> None:
    e = env(p, "exporter")
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert e[grant.ENV].startswith("k1:")
    assert warnings == ()


def driver_only(p: Pod, warnings: tuple[str, ...]) -> None:
    assert env(p, "build")["NVIDIA_VISIBLE_DEVICES"] == "none"


def mixed_node_model(p: Pod, warnings: tuple[str, ...]) -> None:
    assert p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/l4": 1}
    assert "affinity" not in p["spec"]
    assert any("asks for nvidia.com/l4: 1" in w for w in warnings)


def mig_profile(p: Pod, warnings: tuple[str, ...]) -> None:
    notebook = p["spec"]["containers"][0]
    assert notebook["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "2"}
    assert expressions(p) == [
        {"key": "nvidia.com/mig-1g.10gb.count", "operator": "Gt", "values": ["1"]}
    ]
    assert env(p, "notebook").keys() == {"NVIDIA_DRIVER_CAPABILITIES", grant.ENV}


def claim_of(p: Pod, templates: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (entry,) = p["spec"]["resourceClaims"]
    (template,) = templates
    assert entry["resourceClaimTemplateName"] == template["metadata"]["name"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return dict(request)


def dra_linked_pair(p: Pod, templates: tuple[dict[str, Any], ...]) -> None:
    request = claim_of(p, templates)
    assert [r["name"] for r in request["firstAvailable"]] == ["linked", "any"]
    assert request["firstAvailable"][0]["count"] == 2
    assert env(p, "trainer") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def dra_share(p: Pod, templates: tuple[dict[str, Any], ...]) -> None:
    exactly = claim_of(p, templates)["exactly"]
    assert exactly["deviceClassName"] == "shared.gpu.gpuwire.io"
    assert exactly["capacity"] == {"requests": {"memory": "30Gi"}}
    assert exactly["count"] == 1


DRA: dict[str, Callable[[Pod, tuple[dict[str, Any], ...]], None]] = {
    "dra-linked-pair": dra_linked_pair,
    "dra-share": dra_share,
}
ADMITTED: dict[str, Callable[[Pod, tuple[str, ...]], None]] = {
    "model-select": model_select,
    "model-exclude": model_exclude,
    "daemonset-all-gpus": daemonset_all_gpus,
    "explicit-gpus": explicit_gpus,
    "limits-hami": limits_hami,
    "limits-mps": limits_mps,
    "containers": containers,
    "hami-aliases": hami_aliases,
    "hami-resources": hami_resources,
    "no-request": no_request,
    "trusted-agent": trusted_agent,
    "driver-only": driver_only,
    "mixed-node-model": mixed_node_model,
    "mig-profile": mig_profile,
}
DENIED = {
    "denied-unknown-model": [
        "gpuwire.io/gpu-model: 'B200' matches no GPU node; models present: "
        "NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-L4, Tesla-T4"
    ],
    "denied-unenforced-limit": [
        "gpuwire.io/gpu-memory-limit: '8Gi' needs profile mps (gpuwire.io/limit-profile: 'mps'), "
        "which no node with gpuwire.io/gpu-model: 'T4' enforces; nodes enforcing it have: "
        "NVIDIA-H100-80GB-HBM3, NVIDIA-L4; profiles enforced in this cluster: hami (3 nodes), "
        "mps (2 nodes); advisory (allowed, not enforced): jax, pytorch, tensorflow"
    ],
    "denied-unknown-mig-profile": [
        "gpuwire.io/mig-profile: '1g.5gb' is offered by no GPU node; MIG profiles present: "
        "1g.10gb, 2g.20gb, 3g.40gb"
    ],
    "denied-bad-annotations": [
        "gpuwire.io/gpu-count: 'two' is not a GPU count; accepted: all, none",
        "gpuwire.io/gpu-memory-limit: '20' is neither a memory size nor a percentage; accepted:",
    ],
}


def test_every_example_has_an_expectation() -> None:
    pods = {p.stem for p in EXAMPLES.glob("*.yaml")} - {"nodes", "policy", "slices"}
    assert pods == set(ADMITTED) | set(DENIED) | set(DRA)


@pytest.mark.parametrize("name", sorted(DRA))
def test_dra_examples_admit_against_the_example_slices(name: str) -> None:
    p, namespace = load(name)
    mutated, outcome = admit(p, namespace, POLICY, NODES, pools=SLICES)
    DRA[name](mutated, outcome.templates)


def test_the_example_slices_are_what_the_dra_plugin_publishes() -> None:
    """examples/slices.yaml, held to the plugin's own devices and slices (dracluster)."""
    first = dracluster.node("gpu-h100-dra-0", gpus=4, products=("NVIDIA H100 80GB HBM3",))
    shared = (first.machine.gpus[3].device.uuid,)
    node = dracluster.node("gpu-h100-dra-0", 4, ("NVIDIA H100 80GB HBM3",), shared=shared)
    written = yaml.safe_load((EXAMPLES / "slices.yaml").read_text())["items"]
    assert written == dracluster.all_slices([node])


@pytest.mark.parametrize(
    "path",
    [EXAMPLES / f"{n}.yaml" for n in sorted(DRA)]
    + sorted((ROOT / "scripts/demo/pods").glob("dra-*.yaml")),
    ids=lambda p: p.name,
)
def test_every_dra_example_admits_offline(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a reader runs: `gpuwire mutate` with the example files (the demo's too)."""
    argv = ["mutate", str(path), "--policy", str(EXAMPLES / "policy.yaml")]
    argv += ["--nodes", str(EXAMPLES / "nodes.yaml"), "--slices", str(EXAMPLES / "slices.yaml")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == ["Pod", "ResourceClaimTemplate"]


@pytest.mark.parametrize("name", sorted(ADMITTED))
def test_admitted_examples(name: str) -> None:
    p, namespace = load(name)
    mutated, outcome = admit(p, namespace, POLICY, NODES)
    ADMITTED[name](mutated, outcome.warnings)


@pytest.mark.parametrize("name", sorted(DENIED))
def test_denied_examples(name: str) -> None:
    p, namespace = load(name)
    denial = run(p, namespace, POLICY, NODES).denial
    assert denial is not None
    for part in DENIED[name]:
        assert part in denial.message
