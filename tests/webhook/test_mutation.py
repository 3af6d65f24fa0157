"""Every mutation rule, through the pure function (no socket). Each admitted pod is checked by
`admit`: valid against the Kubernetes schema, and a second mutation changes nothing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwire import annotations as a
from gpuwire import grant
from tests.webhook.support import (
    A100_80,
    ADMISSION,
    H100,
    KEYS,
    NODES,
    OPEN,
    admit,
    container,
    deny,
    env,
    pod,
    required_terms,
    run,
    verifies,
)
from webhook.fleet import Fleet
from webhook.mutation import mutate
from webhook.policy import Policy, Rule
from webhook.warned import kind_of

PLUGINLESS = Policy(device_plugin=False)
VISIBLE = "NVIDIA_VISIBLE_DEVICES"


# --- plugin-less pods


def test_all_gpus_without_a_plugin_gets_all_default_capabilities_and_a_grant() -> None:
    mutated, outcome = admit(pod({a.COUNT: "all"}))
    e = env(mutated)
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert e["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert verifies(e[grant.ENV], "ml", "app", "all", "compute,utility")
    assert outcome.warnings == ()


def test_the_grant_is_bound_to_namespace_container_devices_and_capabilities() -> None:
    mutated, _ = admit(pod({a.COUNT: "all", a.CAPABILITIES: "video,compute,utility"}))
    value = env(mutated)[grant.ENV]
    assert env(mutated)["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility,video"
    assert verifies(value, "ml", "app", "all", "compute,utility,video")
    assert not verifies(value, "other", "app", "all", "compute,utility,video")
    assert not verifies(value, "ml", "sidecar", "all", "compute,utility,video")
    assert not verifies(value, "ml", "app", "0", "compute,utility,video")
    assert not verifies(value, "ml", "app", "all", "all")


def test_a_deployments_pods_each_get_a_grant_of_their_own_admission() -> None:
    """What a grant signs of the request is made once for pods that ask alike; the admission
    and the limits are each pod's own: a second pod's grant is another, and neither verifies
    as the other's (a copy into another pod grants nothing)."""
    asked = pod({a.COUNT: "all", a.MEMORY_LIMIT: "10Gi"})
    values = []
    for admission in ("admission-1", "admission-2"):
        outcome = mutate(asked, "ml", OPEN, NODES, KEYS, admission=admission)
        mutated = jsonpatch.apply_patch(asked, list(outcome.patch))
        assert mutated["metadata"]["annotations"][grant.POD_ANNOTATION] == admission
        values.append(env(mutated)[grant.ENV])
    first, second = values
    assert first != second
    limited = {k: v for k, v in env(mutated).items() if grant.is_limit(k)}
    assert limited  # the limits are bound too

    def signed(value: str, admission: str) -> bool:
        subject = grant.Subject.of(
            "ml", "app", "all", "compute,utility", pod=admission, env=limited
        )
        return KEYS.verify(value, subject)

    assert signed(first, "admission-1")
    assert signed(second, "admission-2")
    assert not signed(first, "admission-2")
    assert not signed(second, "admission-1")


def test_gpu_count_unset_takes_the_policy_default() -> None:
    mutated, _ = admit(pod({a.MODEL: "A100"}))
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == "all"
    mutated, _ = admit(pod({a.MODEL: "A100"}), policy=Policy(gpu_count=1))
    assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_none_gives_driver_files_but_no_gpu() -> None:
    mutated, _ = admit(pod({a.COUNT: "none", a.CAPABILITIES: "utility"}))
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert verifies(env(mutated)[grant.ENV], "ml", "app", "none", "utility")


def test_explicit_gpus_are_written_granted_and_pinned_to_their_node() -> None:
    mutated, _ = admit(pod({a.UUID: f"{A100_80[1].upper()},{A100_80[0]}"}))
    e = env(mutated)
    assert e["NVIDIA_VISIBLE_DEVICES"] == f"{A100_80[1]},{A100_80[0]}"  # as the node spells them
    assert verifies(e[grant.ENV], "ml", "app", f"{A100_80[0]},{A100_80[1]}", None)
    assert required_terms(mutated) == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a100-80g-0"]}
            ]
        }
    ]


def test_explicit_gpus_on_two_nodes_are_denied() -> None:
    denial = deny(pod({a.UUID: f"{A100_80[0]},{H100[0]}"}))
    assert denial.code == 400
    assert "names GPUs on different nodes" in denial.message
    assert f"{A100_80[0]} on gpu-a100-80g-0" in denial.message
    assert f"{H100[0]} on gpu-h100-0" in denial.message


def test_an_unknown_gpu_is_denied_listing_the_gpus_that_exist() -> None:
    missing = "GPU-00000000-0000-0000-0000-000000000000"
    denial = deny(pod({a.HAMI_USE_UUID: missing}))
    assert denial.message.startswith(f"nvidia.com/use-gpuuuid: '{missing}' names {missing}")
    assert "which no node has; GPUs present: " in denial.message
    assert A100_80[0] in denial.message
    assert "and 12 more" in denial.message  # 24 GPUs, 12 listed


def test_a_numeric_count_without_a_plugin_becomes_a_resource_limit() -> None:
    for c in (
        container(),
        {**container(), "resources": {}},
        {**container(), "resources": {"requests": {"cpu": "1"}}},
        {**container(), "resources": {"limits": {"cpu": "1"}}},
    ):
        mutated, _ = admit(pod({a.COUNT: "2"}, [c]))
        spec = mutated["spec"]["containers"][0]
        assert spec["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert spec["resources"].get("requests", {}).get("cpu") == c.get("resources", {}).get(
            "requests", {}
        ).get("cpu")
        assert "NVIDIA_VISIBLE_DEVICES" not in env(mutated)
        assert verifies(env(mutated)[grant.ENV], "ml", "app", "plugin", None)


def test_a_numeric_count_without_any_plugin_is_denied_with_the_way_out() -> None:
    denial = deny(pod({a.COUNT: "2"}), policy=PLUGINLESS)
    assert denial.code == 400
    assert denial.message.startswith("gpuwire.io/gpu-count: '2' asks for 2 GPU(s)")
    assert "devicePlugin: false" in denial.message
    assert denial.message.endswith(
        "accepted here: no GPU (gpuwire.io/gpu-count: none); an admin allows more with a rule "
        "of the gpuwire policy for the namespace: allGpus: true or explicitDevices: true"
    )


# --- pods with a GPU resource


def test_the_device_plugin_chooses_devices_the_webhook_grants_plugin() -> None:
    mutated, _ = admit(pod({a.CAPABILITIES: "all"}, [container(gpus=1)]))
    e = env(mutated)
    assert "NVIDIA_VISIBLE_DEVICES" not in e
    assert e["NVIDIA_DRIVER_CAPABILITIES"] == "all"
    assert verifies(e[grant.ENV], "ml", "app", grant.PLUGIN_DEVICES, "all")


def test_a_gpu_resource_alone_gets_capabilities_and_a_grant() -> None:
    mutated, _ = admit(pod({}, [container(gpus=1), container("sidecar")]))
    assert verifies(env(mutated)[grant.ENV], "ml", "app", "plugin", "compute,utility")
    assert env(mutated, "sidecar") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_a_hand_written_device_list_next_to_the_plugin_is_removed() -> None:
    c = container(gpus=1, env={"NVIDIA_VISIBLE_DEVICES": "all", "KEEP": "1"})
    mutated, outcome = admit(pod({}, [c]))
    assert "NVIDIA_VISIBLE_DEVICES" not in env(mutated)
    assert env(mutated)["KEEP"] == "1"
    assert "container 'app': NVIDIA_VISIBLE_DEVICES=all removed" in outcome.warnings


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({a.COUNT: "all"}, "gpuwire.io/gpu-count: 'all' disagrees with container 'app'"),
        ({a.COUNT: "2"}, "'2' disagrees with container 'app''s nvidia.com/gpu: 1; accepted: 1"),
        ({a.UUID: "GPU-508d3ed8-9227-5b4a-b0e4-1a5370c5eb4e"}, "gets its GPUs from the device"),
    ],
)
def test_a_plugin_container_cannot_also_choose_its_gpus(
    annotations: dict[str, str], expected: str
) -> None:
    denial = deny(pod(annotations, [container(gpus=1)]))
    assert expected in denial.message
    assert denial.code == 400


def test_a_zero_gpu_resource_is_no_gpu() -> None:
    mutated, _ = admit(pod({}, [container(gpus=0)]))
    assert env(mutated) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_requests_only_count_as_a_gpu_resource() -> None:
    c = {**container(), "resources": {"requests": {"nvidia.com/gpu": "1"}}}
    mutated, _ = admit(pod({}, [c]))
    assert verifies(env(mutated)[grant.ENV], "ml", "app", "plugin", None)


# --- which containers


def test_by_default_resource_holders_are_the_gpu_containers() -> None:
    p = pod({a.MODEL: "A100"}, [container("a", gpus=1), container("b")])
    mutated, _ = admit(p)
    assert grant.ENV in env(mutated, "a")
    assert env(mutated, "b") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_by_default_an_annotated_pod_gives_every_app_container_gpus_not_init() -> None:
    p = pod({a.COUNT: "all"}, [container("a"), container("b")], init=[container("setup")])
    mutated, _ = admit(p)
    assert env(mutated, "a")["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(mutated, "b")["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(mutated, "setup") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_containers_annotation_picks_app_and_init_containers() -> None:
    p = pod(
        {a.CONTAINERS: "trainer,check", a.COUNT: "all"},
        [container("trainer"), container("sidecar")],
        init=[container("check")],
    )
    mutated, _ = admit(p)
    assert env(mutated, "trainer")["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(mutated, "check")["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(mutated, "sidecar") == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_containers_annotation_naming_a_missing_container_lists_the_real_ones() -> None:
    denial = deny(
        pod({a.CONTAINERS: "trainer,ghost"}, [container("trainer")], init=[container("i")])
    )
    assert denial.message == (
        "gpuwire.io/containers: 'trainer,ghost' names ghost, which this pod does not have; "
        "accepted: i, trainer"
    )


# --- no request, no GPU


def test_containers_that_ask_for_nothing_get_void() -> None:
    mutated, outcome = admit(pod({}, [container("a"), container("b")], init=[container("i")]))
    for name in ("a", "b", "i"):
        assert env(mutated, name) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert outcome.warnings == ()


def test_a_hand_written_device_list_is_replaced_where_not_trusted() -> None:
    c = container(env={"NVIDIA_VISIBLE_DEVICES": "0,1", "OTHER": "x"})
    mutated, outcome = admit(pod({}, [c]))
    assert env(mutated) == {"NVIDIA_VISIBLE_DEVICES": "void", "OTHER": "x"}
    assert outcome.warnings == ("container 'app': NVIDIA_VISIBLE_DEVICES=0,1 replaced by void",)


def test_a_device_list_from_value_from_is_replaced_too() -> None:
    c = container()
    c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    mutated, outcome = admit(pod({}, [c]))
    assert mutated["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]
    assert "NVIDIA_VISIBLE_DEVICES=(valueFrom) replaced by void" in outcome.warnings[0]


def test_every_duplicate_entry_is_replaced() -> None:
    c = container()
    c["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    mutated, _ = admit(pod({}, [c]))
    assert [e["value"] for e in mutated["spec"]["containers"][0]["env"]] == ["void", "void"]


def test_without_void_unrequested_only_hand_written_lists_change() -> None:
    policy = Policy(void_unrequested=False)
    mutated, _outcome = admit(pod({}, [container()]), policy=policy)
    assert "env" not in mutated["spec"]["containers"][0]
    mutated, _ = admit(pod({}, [container(env={"NVIDIA_VISIBLE_DEVICES": "all"})]), policy=policy)
    assert env(mutated) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_a_hand_written_grant_is_removed_or_replaced() -> None:
    forged = {"GPUWIRE_GRANT": "k1:" + "0" * 64}
    mutated, outcome = admit(pod({}, [container(env=forged)]))
    assert env(mutated) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert "container 'app': GPUWIRE_GRANT=(hand-written) removed" in outcome.warnings
    mutated, outcome = admit(pod({a.COUNT: "all"}, [container(env=forged)]))
    assert verifies(env(mutated)[grant.ENV], "ml", "app", "all", None)
    assert any("GPUWIRE_GRANT=(hand-written) replaced by k1:" in w for w in outcome.warnings)


# --- trusted namespaces


TRUSTING = Policy(rules=(Rule(match=("gpu-operator",), trust_visible_devices=True), Rule()))


def test_a_trusted_namespace_keeps_and_grants_its_hand_written_device_list() -> None:
    c = container(env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"})
    mutated, outcome = admit(pod({}, [c]), "gpu-operator", TRUSTING)
    e = env(mutated)
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert verifies(e[grant.ENV], "gpu-operator", "app", "all", "utility")
    assert outcome.warnings == ()
    mutated, _ = admit(pod({}, [c]), "elsewhere", TRUSTING)
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == "void"


# --- cdi.k8s.io annotations: containerd and CRI-O inject what they name

CDI_ALL = {"cdi.k8s.io/mine": "nvidia.com/gpu=all", "cdi.k8s.io/also": "k8s.gpu.gpuwire.io/claim=x"}


def test_cdi_annotations_are_removed_outside_trusted_namespaces() -> None:
    for asked in (CDI_ALL, {**CDI_ALL, a.COUNT: "all"}):
        mutated, outcome = admit(pod(dict(asked)))
        left = mutated["metadata"]["annotations"]
        assert not [k for k in left if k.startswith("cdi.k8s.io/")]
        kept = {k: v for k, v in asked.items() if not k.startswith("cdi.k8s.io/")}
        granted = {grant.POD_ANNOTATION: ADMISSION} if a.COUNT in asked else {}
        assert left == kept | granted
        assert any("cdi.k8s.io/also='k8s.gpu.gpuwire.io/claim=x'" in w and "removed" in w
                   for w in outcome.warnings)  # fmt: skip


def test_cdi_annotations_deny_or_stay_as_the_policy_says() -> None:
    policy = Policy(
        rules=(Rule(match=("gpu-operator",), cdi_annotations="allow"),
               Rule(cdi_annotations="deny"))
    )  # fmt: skip
    denial = deny(pod(dict(CDI_ALL)), "team-a", policy=policy)
    assert denial.code == 403
    assert "cdi.k8s.io/mine='nvidia.com/gpu=all'" in denial.message
    assert "'team-a' may not" in denial.message
    mutated, outcome = admit(pod(dict(CDI_ALL)), "gpu-operator", policy)
    assert mutated["metadata"]["annotations"] == CDI_ALL
    assert not [w for w in outcome.warnings if "cdi.k8s.io" in w]


def test_trust_cannot_grant_what_it_cannot_read() -> None:
    c = container()
    c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    _, outcome = admit(pod({}, [c]), "gpu-operator", TRUSTING)
    assert outcome.warnings == (
        "container 'app': NVIDIA_VISIBLE_DEVICES from valueFrom cannot be granted",
    )
    bad = container(env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "cuda"})
    denial = deny(pod({}, [bad]), "gpu-operator", policy=TRUSTING)
    assert denial.message.startswith("container 'app': NVIDIA_DRIVER_CAPABILITIES='cuda'")


def test_a_trusted_container_asking_by_annotation_gets_what_it_asked_for() -> None:
    c = container(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    mutated, outcome = admit(pod({a.COUNT: "none"}, [c]), "gpu-operator", TRUSTING)
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert "NVIDIA_VISIBLE_DEVICES=all replaced by none" in outcome.warnings[0]


# --- limits


def test_limits_follow_the_policy_profile_and_close_its_escapes() -> None:
    c = container(gpus=1, env={"CUDA_DEVICE_MEMORY_LIMIT_0": "80g", "CUDA_DISABLE_CONTROL": "true"})
    p = pod({a.MODEL: "A100-SXM4-80GB", a.MEMORY_LIMIT: "25%", a.CORES_LIMIT: "30"}, [c])
    mutated, outcome = admit(p)
    e = env(mutated)
    assert e["CUDA_DEVICE_MEMORY_LIMIT"] == "20480m"
    assert e["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in e
    assert "CUDA_DISABLE_CONTROL" not in e
    assert "container 'app': CUDA_DISABLE_CONTROL=true removed" in outcome.warnings


def test_a_hand_written_limit_cannot_raise_the_granted_one() -> None:
    c = container(gpus=1, env={"CUDA_DEVICE_MEMORY_LIMIT": "80g"})
    mutated, _ = admit(pod({a.MEMORY_LIMIT: "10Gi"}, [c]))
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "10240m"


def test_mps_limits_are_for_a_container_with_one_gpu() -> None:
    p = pod({a.MODEL: "H100", a.COUNT: "1", a.MEMORY_LIMIT: "10Gi", a.CORES_LIMIT: "20"})
    mps = replace(OPEN, limit_profiles=("mps",))
    mutated, _ = admit(p, policy=mps)
    assert env(mutated)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env(mutated)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    denial = deny(pod({a.MODEL: "H100", a.COUNT: "all", a.MEMORY_LIMIT: "10Gi"}), policy=mps)
    assert denial.message == (
        "gpuwire.io/gpu-memory-limit: '10Gi': profile 'mps' joins a container to one GPU's MPS "
        "control daemon, and this container sees 8 GPUs; give it one GPU (gpuwire.io/gpu-count: "
        "1, or nvidia.com/gpu: 1)"
    )


def test_a_profile_annotation_overrides_the_policy_default() -> None:
    p = pod({a.MEMORY_LIMIT: "50%", a.LIMIT_PROFILE: "jax", a.MODEL: "H100"}, [container(gpus=1)])
    mutated, _ = admit(p)
    e = env(mutated)
    assert e["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in e


def test_a_share_against_different_gpus_takes_the_smallest_with_a_warning() -> None:
    p = pod({a.MODEL: "A100", a.MEMORY_LIMIT: "50%"}, [container(gpus=1)])
    mutated, outcome = admit(p)
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "20480m"
    assert "taken against the smallest candidate GPU (40960 MiB)" in outcome.warnings[0]


# A node that enforces HAMi-core limits and does not say how large its GPUs are.
UNSIZED = Fleet.of(
    [
        {
            "metadata": {
                "name": "unsized",
                "labels": {"nvidia.com/gpu.product": "Tesla-T4", "gpuwire.io/limits.hami": "true"},
            }
        }
    ]
)


def test_an_enforced_limit_that_cannot_be_resolved_is_denied() -> None:
    p = pod({a.MEMORY_LIMIT: "25%"}, [container(gpus=1)])
    denial = deny(p, nodes=UNSIZED)
    assert denial.message.startswith("gpuwire.io/gpu-memory-limit: '25%': profile 'hami' needs")


def test_an_informational_limit_that_cannot_be_resolved_is_a_warning() -> None:
    p = pod({a.MEMORY_LIMIT: "20Gi", a.LIMIT_PROFILE: "hami,pytorch"}, [container(gpus=1)])
    mutated, outcome = admit(p, nodes=UNSIZED)
    assert env(mutated)["CUDA_DEVICE_MEMORY_LIMIT"] == "20480m"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env(mutated)
    assert any("profile 'pytorch' skipped" in w for w in outcome.warnings)


def test_a_profile_without_limits_warns() -> None:
    _, outcome = admit(pod({a.LIMIT_PROFILE: "mps"}))
    assert outcome.warnings == (
        "gpuwire.io/limit-profile has no effect without gpuwire.io/gpu-memory-limit or "
        "gpuwire.io/gpu-cores-limit",
    )


# --- policy


def test_excluded_namespaces_and_mirror_pods_pass_untouched() -> None:
    bad = pod({a.COUNT: "banana"}, [container(env={"NVIDIA_VISIBLE_DEVICES": "all"})])
    assert run(bad, "kube-system").skipped == "namespace kube-system is excluded by the policy"
    assert run(bad, "kube-system").patch == ()
    bad["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc"
    outcome = run(bad, "default")
    assert outcome.skipped == "mirror pod"
    assert outcome.patch == ()
    assert outcome.denial is None


def test_a_namespace_no_rule_matches_may_not_ask() -> None:
    policy = Policy(rules=(Rule(match=("ml-*",), all_gpus=True),))
    denial = deny(pod({a.COUNT: "all"}), "web", policy=policy)
    assert denial.code == 403
    assert denial.message.startswith("namespace 'web' may not ask for GPUs by annotation")
    mutated, _ = admit(pod({a.COUNT: "all"}), "ml-x", policy=policy)
    assert env(mutated)["NVIDIA_VISIBLE_DEVICES"] == "all"
    mutated, _ = admit(pod({}), "web", policy=policy)
    assert env(mutated) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_rules_limit_count_devices_and_capabilities() -> None:
    policy = Policy(
        rules=(
            Rule(
                match=("team",),
                max_gpus=2,
                all_gpus=True,
                explicit_devices=False,
                capabilities=("compute", "utility"),
            ),
        )
    )
    denial = deny(pod({a.COUNT: "all"}), "team", policy=policy)
    assert denial.code == 403
    assert "asks for all GPUs of its node, up to 8 on its nodes" in denial.message
    assert "at most 2 per container" in denial.message
    assert "at most 2" in deny(pod({}, [container(gpus=4)]), "team", policy=policy).message
    denial = deny(pod({a.UUID: A100_80[0]}), "team", policy=policy)
    assert denial.message.startswith(f"gpuwire.io/gpu-uuid: '{A100_80[0]}' names GPUs, which")
    denial = deny(pod({a.COUNT: "2", a.CAPABILITIES: "all"}), "team", policy=policy)
    assert "asks for compat32, display, graphics, ngx, video" in denial.message
    assert "accepted here: compute, utility" in denial.message
    admit(pod({a.COUNT: "2"}), "team", policy=policy)
    admit(pod({a.COUNT: "all", a.MODEL: "T4"}), "team", policy=policy)  # T4 nodes have 2
    assert (
        "asks for all GPUs of its node ("
        in deny(pod({a.COUNT: "all"}), "team", policy=policy, nodes=Fleet()).message
    )


def test_the_runtime_class_is_set_on_gpu_pods_that_name_none() -> None:
    policy = replace(OPEN, runtime_class="gpuwire")
    mutated, _ = admit(pod({a.COUNT: "all"}), policy=policy)
    assert mutated["spec"]["runtimeClassName"] == "gpuwire"
    mutated, _ = admit(pod({a.COUNT: "all"}, runtimeClassName="nvidia"), policy=policy)
    assert mutated["spec"]["runtimeClassName"] == "nvidia"
    mutated, _ = admit(pod({}), policy=policy)
    assert "runtimeClassName" not in mutated["spec"]


def test_without_keys_nothing_is_signed_and_the_pod_is_told() -> None:
    mutated, outcome = admit(
        pod({a.COUNT: "all"}, [container("a"), container("b")]), keyring=grant.KeyRing({})
    )
    assert grant.ENV not in env(mutated, "a")
    assert outcome.warnings == ("no grant key loaded: GPUWIRE_GRANT not written",)


def test_a_typo_is_denied_saying_what_was_meant() -> None:
    """Before: admitted, the model constraint dropped, with a warning only the creating
    client saw."""
    denial = deny(pod({"gpuwire.io/gpu-modle": "A100", "gpuwire.io/GPU-Count": "2"}))
    assert denial.code == 400
    assert denial.message == (
        "gpuwire.io/GPU-Count: '2': unknown annotation gpuwire.io/GPU-Count: did you mean "
        "gpuwire.io/gpu-count?; gpuwire.io/gpu-modle: 'A100': unknown annotation "
        "gpuwire.io/gpu-modle: did you mean gpuwire.io/gpu-model? (the gpuwire policy denies "
        "annotations it does not know: unknownAnnotations: deny; docs/annotations.md)"
    )


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (
            "gpuwire.io/gpu-modle",
            "unknown annotation gpuwire.io/gpu-modle: did you mean gpuwire.io/gpu-model? (ignored)",
        ),
        (
            "nvidia.com/use-gpu-type",
            "unknown annotation nvidia.com/use-gpu-type: did you mean "
            "nvidia.com/use-gputype? (ignored)",
        ),
        (
            "NVIDIA.com/use-gputype",
            "unknown annotation NVIDIA.com/use-gputype: did you mean "
            "nvidia.com/use-gputype? (ignored)",
        ),
        (
            "gpuwire.com/gpu-count",
            "unknown annotation gpuwire.com/gpu-count: did you mean "
            "gpuwire.io/gpu-count? (ignored)",
        ),
        (
            "nvidia.com/gpumem",
            "nvidia.com/gpumem is a resource (a container's "
            "resources.limits), not an annotation: did you mean gpuwire.io/gpu-memory-limit? "
            "(ignored)",
        ),
    ],
)
def test_under_warn_a_typo_is_admitted_with_the_warning(key: str, said: str) -> None:
    warn = replace(OPEN, unknown_annotations="warn")
    _, outcome = admit(pod({key: "2"}, [container(gpus=1)]), policy=warn)
    assert outcome.warnings == (said,)
    assert [kind_of(w) for w in outcome.warnings] == ["unknown-annotation"]


def test_hami_keys_gpuwire_does_not_read_are_a_warning_never_a_denial() -> None:
    _, outcome = admit(pod({"nvidia.com/vgpu-mode": "mig"}, [container(gpus=1)]))
    assert outcome.warnings == (
        "nvidia.com/vgpu-mode is HAMi's choice of hami-core or MIG sharing, which gpuwire "
        "does not read (ignored)",
    )
    assert kind_of(outcome.warnings[0]) == "unread-annotation"


def test_annotations_of_others_pass_unremarked() -> None:
    unrelated = {
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        "prometheus.io/scrape": "true",
        "nvidia.com/gpu.product": "x",  # a label name, not a key of gpuwire's or HAMi's
    }
    _, outcome = admit(pod(unrelated, [container(gpus=1)]))
    assert outcome.warnings == ()


def test_bad_annotations_are_denied_with_every_problem() -> None:
    denial = deny(pod({a.COUNT: "two", a.CORES_LIMIT: "0"}))
    assert denial.code == 400
    assert "gpuwire.io/gpu-count: 'two'" in denial.message
    assert "gpuwire.io/gpu-cores-limit: '0'" in denial.message


# --- patches


def test_patches_add_entries_and_leave_the_rest_of_the_env_alone() -> None:
    c = container(env={"A": "1", "B": "2"})
    outcome = run(pod({a.COUNT: "all"}, [c]))
    assert {op["op"] for op in outcome.patch} == {"add"}
    env_ops = [op for op in outcome.patch if op["path"].startswith("/spec/")]
    assert env_ops
    assert all(op["path"] == "/spec/containers/0/env/-" for op in env_ops)


def test_patch_paths_escape_slashes() -> None:
    outcome = run(pod({a.COUNT: "1"}, [{**container(), "resources": {"limits": {"cpu": "1"}}}]))
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu",
        "value": "1",
    } in outcome.patch


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "object is list, not an object"),
        ({"spec": {"containers": "x"}}, "spec.containers is str, not a list"),
        ({"spec": {"containers": []}}, "spec.containers is empty"),
        ({"spec": {"containers": [{"name": 1}]}}, "spec.containers[0].name is int, not a string"),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "a", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": 3}]}
                    ]
                }
            },
            "env[0].value is int",
        ),
        ({"spec": {"containers": [{"name": "a", "env": {}}]}}, "spec.containers[0].env is dict"),
        ({"metadata": {"annotations": {"a": 1}}, "spec": {}}, "metadata.annotations[a] is int"),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}
                    ]
                }
            },
            "is '1.5', not a whole number",
        ),
        (
            {
                "spec": {
                    "containers": [
                        {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "²"}}}
                    ]
                }
            },
            "resources.requests[nvidia.com/gpu] is '²', not a whole number",
        ),
        (
            {
                "spec": {"containers": [{"name": "a"}], "affinity": {"nodeAffinity": []}},
                "metadata": {"annotations": {a.MODEL: "A100"}},
            },
            "spec.affinity.nodeAffinity is list",
        ),
    ],
)
def test_malformed_pods_are_a_400_naming_the_field(raw: Any, field: str) -> None:
    denial = deny(raw)
    assert denial.code == 400
    assert denial.message.startswith("malformed pod: ")
    assert field in denial.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
pod_like = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "annotations": st.dictionaries(st.sampled_from(a.KNOWN), st.text(max_size=12))
                | json_values
            },
        ),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(
                    st.fixed_dictionaries(
                        {"name": st.sampled_from(["a", "b"]) | json_values},
                        optional={"env": json_values, "resources": json_values},
                    ),
                    max_size=3,
                )
                | json_values,
                "affinity": json_values,
            },
        ),
    },
)


@settings(max_examples=300)
@given(pod_like)
def test_any_json_gets_an_answer_never_an_exception(raw: Any) -> None:
    outcome = run(raw)
    assert outcome.denial is None or 400 <= outcome.denial.code < 500
