"""Property: every pod the DRA path admits can be allocated on the empty cluster it was
checked against, and every allocation the scheduler's allocator (testbed/allocator.py) can
make of its claim gives what the annotations mean: the models asked (and none excluded), at
least the memory asked, exactly the GPUs named and none excluded, the count, one NVLink
island where the policy requires it, shared GPUs exactly where limits are asked."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import kubernetes_validate
from hypothesis import HealthCheck, given, settings

from gpuwire import annotations as keys
from gpuwire import grant, quantity
from gpuwire.annotations import normalise_model
from testbed import dracluster
from testbed.allocator import allocate
from webhook.fleet import Fleet
from webhook.mutation import mutate
from webhook.policy import Policy
from webhook.pools import Pools

CLUSTER = (
    dracluster.node("a100-40", 4, ("NVIDIA A100-PCIE-40GB",), nvlink="none"),
    dracluster.node("h100", 4, ("NVIDIA H100 80GB HBM3",)),
    dracluster.node("mixed", 4, ("NVIDIA A100-SXM4-80GB", "Tesla T4"), shared=("*T4*",)),
)
SLICES = dracluster.all_slices(CLUSTER)
POOLS = Pools.of(SLICES)
CLASSES = {c["metadata"]["name"]: c for c in dracluster.device_classes()}
UUIDS = [g.uuid for n in CLUSTER for g in n.machine.devices]
WORDS = ["a100", "h100", "t4", "pcie", "sxm4", "80gb", "v100"]

asks = st.fixed_dictionaries(
    {},
    optional={
        keys.MODEL: st.lists(st.sampled_from(WORDS), min_size=1, max_size=3, unique=True).flatmap(
            lambda ws: st.lists(st.booleans(), min_size=len(ws), max_size=len(ws)).map(
                lambda negate: ",".join(
                    ("!" if n else "") + w for w, n in zip(ws, negate, strict=True)
                )
            )
        ),
        keys.COUNT: st.sampled_from(["1", "2", "3", "4", "all"]),
        keys.MIN_MEMORY: st.sampled_from(["16Gi", "40Gi", "80G", "80Gi"]),
        keys.UUID: st.lists(st.sampled_from(UUIDS), min_size=1, max_size=2, unique=True).flatmap(
            lambda us: st.booleans().map(
                lambda negate: ",".join(("!" if negate else "") + u for u in us)
            )
        ),
        keys.MEMORY_LIMIT: st.sampled_from(["2Gi", "25%"]),
        keys.CORES_LIMIT: st.sampled_from(["30"]),
    },
)


def _value(entry: dict[str, Any], name: str) -> Any:
    return next(iter(entry["attributes"][name].values()))


ENTRIES = {(s["spec"]["nodeName"], d["name"]): d for s in SLICES for d in s["spec"]["devices"]}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(asks, st.sampled_from(["required", "preferred"]))
def test_an_admitted_pod_gets_what_it_asked_for(asked: dict[str, str], nvlink: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": asked},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    policy = Policy(allocation="dra", nvlink=nvlink)  # type: ignore[arg-type]
    outcome = mutate(pod, "team-a", policy, Fleet(), grant.KeyRing({}), POOLS)
    request = keys.parse(asked) if outcome.allowed else None
    if request is None or not request.asks:  # denied, or asking nothing: no claim
        assert not outcome.templates
        return
    (template,) = outcome.templates
    kubernetes_validate.validate(template, "1.37", strict=True)
    claim = {"metadata": {"name": "c", "uid": "u"}, "spec": template["spec"]["spec"]}
    placed = {n.name: allocate(n.name, [claim], CLASSES, SLICES) for n in CLUSTER}
    feasible = {n: a[0] for n, a in placed.items() if a}
    assert feasible, f"admitted, but no node can allocate {asked}"
    for node, allocation in feasible.items():
        entries = [ENTRIES[(node, r["device"])] for r in allocation["devices"]["results"]]
        products = [normalise_model(_value(e, "productName")) for e in entries]
        if request.models:
            assert all(any(w in p for w in request.models) for p in products)
        assert not any(w in p for w in request.excluded_models for p in products)
        if request.min_memory_mib:
            memory = [quantity.api_value(e["capacity"]["memory"]["value"]) for e in entries]
            assert all(n // d // quantity.MIB >= request.min_memory_mib for n, d in memory)
        uuids = {_value(e, "uuid").lower() for e in entries}
        if request.uuids:
            assert uuids == {u.lower() for u in request.uuids}
        assert not uuids & {u.lower() for u in request.excluded_uuids}
        assert all(_value(e, "shared") is request.wants_limits for e in entries)
        count = request.count or ("all" if not request.uuids else len(request.uuids))
        if isinstance(count, int):
            assert len(entries) == count
            if count > 1 and nvlink == "required":
                assert len({_value(e, "nvlinkIsland") for e in entries}) == 1
