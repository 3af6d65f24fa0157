"""Shared by the webhook tests: pods, the example cluster, `admit`, which checks what every
admitted pod must satisfy (the patch applies, the result is a valid Pod, a second run is a
no-op), and the files a served webhook reads (certificates, keys, policy)."""

from __future__ import annotations

import copy
import shutil
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kubernetes_validate
import pytest

from certs import pki
from deviceplugin.agent import labels
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from deviceplugin.plugin.resources import Rule, assign
from gpuwire import grant, limits, nvidia, sim
from testbed.webhook import WebhookProcess
from webhook import fleet
from webhook import policy as policies
from webhook.mutation import Denial, Outcome, mutate
from webhook.policy import Policy
from webhook.pools import NO_POOLS, Pools

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NODES = fleet.load(EXAMPLES / "nodes.yaml")
KEYS = grant.KeyRing({"k1": b"test-secret"})
ADMISSION = "gpuwire-mutate"  # mutate's admission where none is given (the pod's grants bind it)
# What the tests of a request's meaning run under unless they say otherwise: a policy that
# lets every namespace take a node's every GPU and name GPUs, and gives a container that
# says no count all of its node's (the built-in default before issue 24). The shipped and
# built-in defaults, which are safer, are tested on their own (tests/deploy/).
OPEN = Policy(gpu_count="all", rules=(policies.Rule(all_gpus=True, explicit_devices=True),))
K8S_VERSION = "1.30"

Node = dict[str, Any]


def labelled_node(
    name: str,
    products: Sequence[str],
    own: Sequence[str] = (),
    replicas: int = 1,
    enforced: Sequence[str] = (),
) -> Node:
    """A Node as the real labeler writes it: GPUs of `products`, the models in `own` under
    resources of their own (`nvidia.com/<model>`), the rest under nvidia.com/gpu with
    `replicas`, and the limit profiles it enforces."""
    machine = sim.make_machine(len(products), tuple(products), seed=name, nvlink="none")
    gpus = NodeGpus(
        machine.driver_version,
        machine.cuda_version,
        tuple(Gpu(g.device, g.compute_capability) for g in machine.gpus),
    )
    rules = [Rule(f"*{m}*", f"nvidia.com/{m.lower()}") for m in own]
    resources = assign(gpus.devices, rules, nvidia.RESOURCE, replicas)
    node_labels = {**labels.labels(gpus, resources), "kubernetes.io/hostname": name}
    for profile in enforced:
        node_labels[limits.enforcement_label(profile)] = "true"
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {labels.GPUS_ANNOTATION: labels.gpus_annotation(gpus, resources)},
        },
        "status": {"allocatable": {r.name: str(len(r.ids())) for r in resources}},
    }


# GPUs of the example cluster
A100_80 = [g.uuid for n in NODES.nodes if n.name == "gpu-a100-80g-0" for g in n.gpus]
H100 = [g.uuid for n in NODES.nodes if n.name == "gpu-h100-0" for g in n.gpus]


def container(
    name: str = "app", gpus: int | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}
    if gpus is not None:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if env is not None:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def pod(
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": containers or [container()], **spec},
    }
    if init:
        p["spec"]["initContainers"] = init
    return p


def run(
    raw: Any,
    namespace: str = "ml",
    policy: Policy | None = None,
    nodes: fleet.Fleet = NODES,
    keyring: grant.KeyRing = KEYS,
    pools: Pools = NO_POOLS,
) -> Outcome:
    return mutate(raw, namespace, policy or OPEN, nodes, keyring, pools)


def admit(
    raw: dict[str, Any],
    namespace: str = "ml",
    policy: Policy | None = None,
    nodes: fleet.Fleet = NODES,
    keyring: grant.KeyRing = KEYS,
    pools: Pools = NO_POOLS,
) -> tuple[dict[str, Any], Outcome]:
    """The admitted pod and the outcome; fails the test unless the pod is admitted, the
    patch leaves the input untouched and applies, the result validates against the Kubernetes
    schema (1.34, the first with DRA's v1 pod fields, where claims are made) and mutating it
    again changes nothing."""
    before = copy.deepcopy(raw)
    outcome = run(raw, namespace, policy, nodes, keyring, pools)
    assert outcome.denial is None, outcome.denial
    assert raw == before, "the mutation changed its input"
    mutated = jsonpatch.apply_patch(raw, list(outcome.patch))
    version = "1.34" if outcome.templates else K8S_VERSION
    kubernetes_validate.validate(mutated, version, strict=True)
    again = run(mutated, namespace, policy, nodes, keyring, pools)
    assert again.denial is None
    assert again.patch == (), f"not idempotent: {again.patch}"
    return mutated, outcome


def deny(raw: Any, namespace: str = "ml", **kwargs: Any) -> Denial:
    outcome = run(raw, namespace, **kwargs)
    assert outcome.denial is not None, f"admitted: {outcome.patch}"
    assert outcome.patch == ()
    return outcome.denial


def env(p: dict[str, Any], name: str = "app") -> dict[str, str]:
    """A container's literal env by name (init or app container)."""
    spec = p["spec"]
    for c in spec.get("initContainers", []) + spec["containers"]:
        if c["name"] == name:
            return {e["name"]: e.get("value", "") for e in c.get("env", [])}
    raise KeyError(name)


def eventually(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait for something a background loop (a reload, a watch) makes true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def verifies(
    value: str,
    namespace: str,
    name: str,
    devices: str,
    caps: str | None,
    env: dict[str, str] | None = None,
) -> bool:
    """Whether `value` grants container `name` of the pod `run` admits (its admission:
    mutate's default) `devices` and `caps`, with the limit variables of `env`."""
    subject = grant.Subject.of(namespace, name, devices, caps, pod=ADMISSION, env=env)
    return KEYS.verify(value, subject)


def required_terms(p: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = p["spec"]["affinity"]["nodeAffinity"]
    terms: list[dict[str, Any]] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


@dataclass
class Files:
    tls: pki.TLSFiles
    keys: Path
    policy: Path
    root: Path

    def args(self, *extra: str, nodes: Path | None = EXAMPLES / "nodes.yaml") -> list[str]:
        """`webhook serve` arguments; `nodes=None` watches a cluster instead of a file."""
        return [
            "--tls-cert",
            str(self.tls.cert),
            "--tls-key",
            str(self.tls.key),
            "--grant-key-dir",
            str(self.keys),
            "--policy",
            str(self.policy),
            "--reload-seconds",
            "0.1",
            *(["--nodes", str(nodes)] if nodes else []),
            *extra,
        ]


def make_files(root: Path) -> Files:
    tls = pki.generate(root / "tls", ["localhost", "127.0.0.1"])
    keys = root / "keys"
    keys.mkdir()
    (keys / "2024-01").write_text("first-secret\n")
    policy = root / "policy.yaml"
    shutil.copy(EXAMPLES / "policy.yaml", policy)
    return Files(tls, keys, policy, root)


def client(served: WebhookProcess, ca: Path) -> httpx.Client:
    return httpx.Client(base_url=served.url, verify=ssl.create_default_context(cafile=ca))
