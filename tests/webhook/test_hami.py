"""A pod written for HAMi works unchanged: `nvidia.com/gpumem`, `gpumem-percentage` and
`gpucores` become gpuwire's limits and leave the container's resources (else, without
HAMi's device plugin, the pod stays Pending); what gpuwire cannot hold is denied, saying
what to write instead. Before: they passed through unchanged, and the pod stayed Pending."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpuwire import annotations as a
from tests.webhook.support import OPEN, admit, container, deny, env, pod, required_terms
from tests.webhook.test_examples import POLICY, SLICES
from webhook.warned import kind_of


def hami(resources: dict[str, Any], section: str = "limits", name: str = "app") -> dict[str, Any]:
    c = container(name)
    c["resources"] = {section: resources}
    return c


def test_a_hami_pod_gets_its_limits_from_hami_core_and_no_resource_it_cannot_have() -> None:
    asks = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10240, "nvidia.com/gpucores": 30}
    mutated, outcome = admit(pod({a.HAMI_USE_TYPE: "A100"}, [hami(asks)]))
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    e = env(mutated)
    assert (e["CUDA_DEVICE_MEMORY_LIMIT"], e["CUDA_DEVICE_SM_LIMIT"]) == ("10240m", "30")
    assert {"key": "gpuwire.io/limits.hami", "operator": "In", "values": ["true"]} in (
        required_terms(mutated)[0]["matchExpressions"]
    )
    (warning,) = [w for w in outcome.warnings if kind_of(w) == "hami-resources"]
    assert warning == (
        "gpuwire.io/gpu-memory-limit: 10240Mi (HAMi's nvidia.com/gpumem: 10240); "
        "gpuwire.io/gpu-cores-limit: 30% (HAMi's nvidia.com/gpucores: 30): out of the "
        "container's resources, which no node advertises without HAMi's device plugin"
    )


def test_without_a_gpu_count_it_asks_one_gpu_as_hami_does() -> None:
    mutated, _ = admit(pod({}, [hami({"nvidia.com/gpumem": "4096"}, "requests")]))
    resources = mutated["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {}, "limits": {"nvidia.com/gpu": "1"}}
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"


@pytest.mark.parametrize(
    ("asks", "memory", "cores"),
    [
        ({"nvidia.com/gpumem-percentage": "50"}, "40960m", None),  # of an 80 GiB A100
        ({"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"}, "1000m", None),
        ({"nvidia.com/gpumem-percentage": "0", "nvidia.com/gpucores": "0"}, None, None),
        ({"nvidia.com/gpucores": "100"}, None, None),  # HAMi's whole GPU: no cap
        ({"nvidia.com/gpucores": "150", "nvidia.com/gpumem": "0"}, None, None),
        ({"nvidia.com/gpucores": "20"}, None, "20"),
    ],
)
def test_hami_s_semantics(asks: dict[str, str], memory: str | None, cores: str | None) -> None:
    c = hami({"nvidia.com/gpu": "1", **asks})
    mutated, _ = admit(pod({a.MODEL: "A100-SXM4-80GB"}, [c]))
    e = env(mutated)
    assert (e.get("CUDA_DEVICE_MEMORY_LIMIT"), e.get("CUDA_DEVICE_SM_LIMIT")) == (memory, cores)
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}


def test_the_policy_s_profile_holds_them() -> None:
    mps = replace(OPEN, limit_profiles=("mps",))
    c = hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"})
    mutated, _ = admit(pod({a.MODEL: "H100"}, [c]), policy=mps)
    assert env(mutated)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_on_the_dra_path_they_are_the_claim_s_share() -> None:
    c = hami({"nvidia.com/gpumem": "30720"})
    mutated, outcome = admit(pod({a.MODEL: "H100"}, [c]), "ml-dra", POLICY, pools=SLICES)
    assert "resources" not in mutated["spec"]["containers"][0] or (
        mutated["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuwire-app"}]}
    )
    (template,) = outcome.templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"] == {"requests": {"memory": "30Gi"}}


@pytest.mark.parametrize(
    ("containers", "annotations", "message"),
    [
        (
            [hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10Gi"})],
            {},
            "container 'app': nvidia.com/gpumem: '10Gi': HAMi reads this resource as a whole "
            "number of MiB, so a unit would make it bytes taken for MiB; accepted: "
            "nvidia.com/gpumem: 10240, or gpuwire.io/gpu-memory-limit: 10Gi",
        ),
        (
            [hami({"nvidia.com/gpu": "1", "nvidia.com/priority": "0"})],
            {},
            "container 'app': nvidia.com/priority: 0: gpuwire sets no HAMi-core task priority; "
            "accepted: the container without nvidia.com/priority",
        ),
        (
            [hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})],
            {},
            "container 'app': nvidia.com/gpumem-percentage: 150 is more than the whole GPU; "
            "accepted: a percentage, 0 to 100",
        ),
        (
            [
                hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, name="a"),
                hami({"nvidia.com/gpu": "1"}, name="b"),
            ],
            {},
            "HAMi's resources ask different limits of this pod's GPU containers (container "
            "'a': nvidia.com/gpumem: 1000; container 'b': nvidia.com/gpu "
            "alone); gpuwire holds one memory and cores limit for every GPU container of a pod",
        ),
        (
            [hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"})],
            {a.MEMORY_LIMIT: "2Gi"},
            "gpuwire.io/gpu-memory-limit: '2Gi' disagrees with the GPU containers' "
            "nvidia.com/gpumem: 1000; accepted: one of them, or both saying the same",
        ),
    ],
)
def test_what_gpuwire_cannot_hold_is_denied_with_the_fix(
    containers: list[dict[str, Any]], annotations: dict[str, str], message: str
) -> None:
    denial = deny(pod(annotations, containers))
    assert denial.code == 400
    assert denial.message.startswith(message)


def test_the_same_limits_from_annotations_and_resources_agree() -> None:
    c = hami({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"})
    mutated, _ = admit(pod({a.MEMORY_LIMIT: "2Gi"}, [c]))
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "2048m"


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("nvidia.com/gpucore", "nvidia.com/gpucores"),
        ("nvidia.com/gpumemory", "nvidia.com/gpumem"),
        ("nvidia.com/GPUMem", "nvidia.com/gpumem"),
        ("nvidia.com/gpumem-percent", "nvidia.com/gpumem-percentage"),
        ("nvidia.co/gpucores", "nvidia.com/gpucores"),
    ],
)
def test_a_near_miss_of_a_hami_resource_name_says_what_was_meant(written: str, meant: str) -> None:
    """As an annotation's typo: denied under the policy's unknownAnnotations: deny, a warning
    under warn; other vendors' resources are not. Before: it passed through unchanged and the
    pod stayed Pending forever."""
    c = hami({"nvidia.com/gpu": "1", "example.com/gpumem": "1", "cpu": "1", written: "30"})
    denial = deny(pod({}, [c]))
    assert denial.code == 400
    assert denial.message == (
        f"container 'app': {written}: 30: unknown resource, which no node advertises (the pod "
        f"would stay Pending): did you mean {meant}? (the gpuwire policy denies resource names "
        "it does not know: unknownAnnotations: deny; docs/annotations.md)"
    )
    warn = replace(OPEN, unknown_annotations="warn")
    mutated, outcome = admit(pod({}, [c]), policy=warn)
    (warning,) = [w for w in outcome.warnings if kind_of(w) == "unknown-resource"]
    assert warning.endswith(f"did you mean {meant}? (left as written)")
    assert mutated["spec"]["containers"][0]["resources"]["limits"][written] == "30"


def test_an_annotation_s_typo_and_a_resource_s_come_in_one_denial() -> None:
    c = hami({"nvidia.com/gpu": "1", "nvidia.com/gpucore": "30"})
    denial = deny(pod({"gpuwire.io/gpu-modle": "A100"}, [c]))
    assert "did you mean gpuwire.io/gpu-model?; container 'app': " in denial.message
    assert denial.message.endswith(
        "did you mean nvidia.com/gpucores? (the gpuwire policy denies annotations and resource "
        "names it does not know: unknownAnnotations: deny; docs/annotations.md)"
    )
