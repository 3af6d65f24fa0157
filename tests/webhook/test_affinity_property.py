"""Every admitted pod can run: its node affinity, read as the kube-scheduler reads it, admits at
least one node of the inventory, and every node it admits (with the GPU resource the pod asks
for) has what the annotations asked for. Random clusters are labelled by the real labeler
(mixed nodes, per-model resources, replicas, limit profiles enforced); random pods combine
every placement annotation. The evaluator here is the test's own: node affinity semantics
from the Kubernetes API reference (NodeSelectorRequirement), not the webhook's code."""

from __future__ import annotations

from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.agent import labels
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from gpuwire import annotations as a
from gpuwire import limits, sim
from tests.webhook.support import (
    KEYS,
    OPEN,
    Node,
    admit,
    container,
    deny,
    env,
    labelled_node,
    pod,
    required_terms,
)
from webhook.fleet import Fleet
from webhook.mutation import mutate

PRODUCTS = (
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA L4",
    "Tesla T4",
)
WORDS = ("A100", "H100", "L4", "T4", "80GB", "40GB", "NVIDIA")
OWN_RESOURCE = ("L4", "T4", "A100", "H100")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    products = draw(st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=4))
    own = draw(st.lists(st.sampled_from(OWN_RESOURCE), unique=True))
    replicas = draw(st.sampled_from((1, 2)))
    enforced = draw(st.lists(st.sampled_from(limits.ENFORCED), unique=True))
    return labelled_node(name, products, own, replicas, enforced)


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 4))
    return [draw(nodes(f"node-{i}")) for i in range(count)]


@st.composite
def pods(draw: st.DrawFn, cluster: list[Node]) -> dict[str, Any]:
    notes: dict[str, str] = {}
    words = draw(st.lists(st.sampled_from(WORDS), max_size=2, unique=True))
    if words:
        notes[a.MODEL] = ",".join(("!" if draw(st.booleans()) else "") + w for w in words)
    memory = draw(st.sampled_from((None, "16Gi", "40Gi", "80G")))
    if memory:
        notes[a.MIN_MEMORY] = memory
    uuids = [g.device.uuid for n in cluster for g in _gpus(n)]
    excluded = draw(st.lists(st.sampled_from(uuids), max_size=2, unique=True))
    shape = draw(st.sampled_from(("plugin", "count", "named")))
    gpus = draw(st.sampled_from((1, 2))) if shape == "plugin" else None
    if shape == "count":
        notes[a.COUNT] = draw(st.sampled_from(("all", "none", "1", "2")))
    named = draw(st.lists(st.sampled_from(uuids), min_size=1, max_size=2, unique=True))
    chosen = [u for u in named if u not in excluded] if shape == "named" else []
    if chosen or excluded:
        notes[a.UUID] = ",".join([*chosen, *(f"!{u}" for u in excluded)])
    if draw(st.booleans()):
        notes[a.MEMORY_LIMIT] = "4Gi"
        profile = draw(st.sampled_from((None, "hami", "mps", "pytorch", "mps,pytorch")))
        if profile:
            notes[a.LIMIT_PROFILE] = profile
    return pod(notes, [container(gpus=gpus)])


def _gpus(node: Node) -> list[Any]:
    from gpuwire import nodegpus

    return [
        type("G", (), {"device": g})
        for g in nodegpus.decode(node["metadata"]["annotations"][labels.GPUS_ANNOTATION])
    ]


def _matches(expression: dict[str, Any], node_labels: dict[str, str]) -> bool:
    """One NodeSelectorRequirement against a node's labels, as the scheduler reads it."""
    key, op, values = expression["key"], expression["operator"], expression.get("values", [])
    present = key in node_labels
    value = node_labels.get(key)
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not (present and value is not None and value.lstrip("-").isdigit()):
            return False
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    raise AssertionError(f"unknown operator {op}")


def admits(p: dict[str, Any], node: Node) -> bool:
    """Required node affinity, and the extended resources the containers ask for."""
    affinity = ((p["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)
    node_labels = node["metadata"]["labels"]
    if affinity is not None:
        terms = affinity["nodeSelectorTerms"]
        if not any(all(_matches(e, node_labels) for e in t["matchExpressions"]) for t in terms):
            return False
    allocatable = node["status"]["allocatable"]
    for c in p["spec"]["containers"]:
        for name, value in ((c.get("resources") or {}).get("limits") or {}).items():
            if "/" in name and int(allocatable.get(name, 0)) < int(value):
                return False
    return True


def fits(request: a.GpuRequest, product: str, memory: int) -> bool:
    name = a.normalise_model(product)
    if request.models and not any(w in name for w in request.models):
        return False
    if any(w in name for w in request.excluded_models):
        return False
    return request.min_memory_mib is None or memory >= request.min_memory_mib


def has_what_was_asked(request: a.GpuRequest, p: dict[str, Any], node: Node) -> bool:
    from gpuwire import nodegpus

    gpus = nodegpus.decode(node["metadata"]["annotations"][labels.GPUS_ANNOTATION])
    node_labels = node["metadata"]["labels"]
    here = {g.uuid.lower() for g in gpus}
    if any(u.lower() not in here for u in request.uuids):
        return False
    # an excluded GPU rules its node out, unless GPUs are named: the container gets exactly
    # those, which leave the excluded ones out (the grammar refuses one both named and not)
    if not request.uuids and any(u.lower() in here for u in request.excluded_uuids):
        return False
    if request.wants_limits:
        for profile in request.profiles or OPEN.limit_profiles:
            if (
                profile in limits.ENFORCED
                and node_labels.get(limits.enforcement_label(profile)) != "true"
            ):
                return False
    asked = [
        name
        for c in p["spec"]["containers"]
        for name in ((c.get("resources") or {}).get("limits") or {})
        if name.startswith("nvidia.com/")
    ]
    if not (request.models or request.excluded_models or request.min_memory_mib):
        return True
    fitting = [fits(request, g.product, g.memory_mib) for g in gpus]
    if asked:  # the device plugin may hand any GPU of the resource
        return all(fits(request, g.product, g.memory_mib) for g in gpus if g.resource in asked)
    if request.count == "all":
        return all(fitting)
    return any(fitting)


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_every_admitted_pod_can_run_on_a_node_that_has_what_it_asked_for(
    data: st.DataObject,
) -> None:
    cluster = data.draw(clusters())
    raw = data.draw(pods(cluster))
    outcome = mutate(raw, "ml", OPEN, Fleet.of(cluster), KEYS)  # every path open to it
    if outcome.denial is not None:
        return
    admitted = jsonpatch.apply_patch(raw, list(outcome.patch))
    request = a.parse(raw["metadata"]["annotations"])
    constrained = request.models or request.excluded_models or request.min_memory_mib
    if not (constrained or request.uuids or request.excluded_uuids or request.wants_limits):
        return  # nothing placed it: any node will do (the scheduler still needs the resource)
    runnable = [n for n in cluster if admits(admitted, n)]
    assert runnable, f"no node admits {admitted['spec'].get('affinity')}"
    for node in runnable:
        assert has_what_was_asked(request, admitted, node), node["metadata"]["name"]


def one_node(gpus: int) -> tuple[Fleet, list[str]]:
    """A cluster of one node, n1, of `gpus` A100s, and their UUIDs."""
    machine = sim.make_machine(gpus, seed="n1")
    found = NodeGpus("550.54.15", "12.4", tuple(Gpu(g.device, (8, 0)) for g in machine.gpus))
    node = {
        "metadata": {
            "name": "n1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "annotations": {labels.GPUS_ANNOTATION: labels.gpus_annotation(found)},
        }
    }
    return Fleet.of([node]), [d.uuid for d in machine.devices]


def test_named_gpus_beside_an_excluded_one_of_their_node_are_exactly_those() -> None:
    """HAMi's `use-gpuuuid: A,B` with `nouse-gpuuuid: C`, all on one node: the named GPUs
    leave C out already. Before: denied (the exclusion kept the pod off the node); before
    that (the UUID bug), admitted with `hostname In [n] ∧ hostname NotIn [n]`, Pending."""
    cluster, (a1, b1, c1) = one_node(3)
    asks = {a.HAMI_USE_UUID: f"{a1},{b1}", a.HAMI_NOUSE_UUID: c1}
    admitted, _ = admit(pod(asks), nodes=cluster)
    assert env(admitted)["NVIDIA_VISIBLE_DEVICES"] == f"{a1},{b1}"
    (term,) = required_terms(admitted)
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    ]


def test_an_excluded_gpu_keeps_a_device_plugin_pod_off_its_node() -> None:
    """The device plugin may hand any GPU of the node: the exclusion is "not that node"."""
    cluster, (_, avoid) = one_node(2)
    denial = deny(pod({a.HAMI_NOUSE_UUID: avoid}, [container(gpus=1)]), nodes=cluster)
    assert denial.code == 400
    assert denial.message == (
        f"nvidia.com/nouse-gpuuuid: {avoid!r} keeps the pod off n1 (holds {avoid}), and no "
        "other GPU node satisfies the pod's GPU annotations (nvidia.com/nouse-gpuuuid: "
        f"{avoid!r}); accepted: exclusions of GPUs on nodes other than the ones the pod can "
        "run on"
    )
