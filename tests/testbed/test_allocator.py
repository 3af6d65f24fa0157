"""The scheduler stand-in's allocator agrees with the Kubernetes allocator's own tests.

Each case below is one of `TestAllocator`'s, by its name, from kubernetes/kubernetes
`staging/src/k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting/
allocator_testing.go` (the table every allocator variant runs), for the features the stand-in
has: the objects written with the same helpers' shapes (`class`, `device`, `slice…`,
`request`, `subRequest`, `claimWithRequests`), the expected results as there: per claim the
(request, driver, pool, device) of each result in any order, consumed capacity where a shared
device is allocated, tolerations and configs where the case checks them; `None` where the
case expects no allocation (nil or empty results), a substring where it expects an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest

from testbed.allocator import AllocationError, Features, InUse, allocate
from testbed.dracel import Quantity

Obj = dict[str, Any]
NODE1, NODE2 = "node-1", "node-2"
A, B = "driver-a", "driver-b"
CLASS_A, CLASS_B = "class-a", "class-b"
P1, P2 = "pool-1", "pool-2"
D0, D1, D2, D3, D4 = "device-0", "device-1", "device-2", "device-3", "device-4"
R0, R1, R2, R3 = "req-0", "req-1", "req-2", "req-3"
CAP0, CAP1 = "capacity-0", "capacity-1"
TAINT_NO_SCHEDULE = {"key": "taint-key", "value": "taint-value", "effect": "NoSchedule"}
TAINT_NO_EXECUTE = {"key": "taint-key", "value": "taint-value-2", "effect": "NoExecute"}
TAINT_NONE = {"key": "taint-key", "value": "taint-value", "effect": "None"}
TOLERATE_NO_SCHEDULE = {"operator": "Exists", "key": "taint-key", "effect": "NoSchedule"}
TOLERATE_NO_EXECUTE = {"operator": "Equal", "key": "taint-key", "value": "taint-value-2",
                       "effect": "NoExecute"}  # fmt: skip


def memory_at_least(size: str, driver: str = A) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{size}")) >= 0'


def cls(name: str, driver: str, multi: bool | None = None, config: str | None = None) -> Obj:
    expression = f'device.driver == "{driver}"'
    if multi is not None:
        expression += f" && device.allowMultipleAllocations == {str(multi).lower()}"
    spec: Obj = {"selectors": [{"cel": {"expression": expression}}]}
    if config:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": {config: config + "Value"}}}]
    return {"metadata": {"name": name}, "spec": spec}


def device(name: str, capacity: dict[str, str] | None = None, **attributes: Any) -> Obj:
    entry: Obj = {"name": name}
    if attributes:
        entry["attributes"] = {k: v for k, v in attributes.items()}
    if capacity:
        entry["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return entry


def multi(entry: Obj, policy: Obj | None = None) -> Obj:
    """withAllowMultipleAllocations, and a request policy on every capacity."""
    entry = {**entry, "allowMultipleAllocations": True}
    if policy is not None:
        entry["capacity"] = {
            k: {**v, "requestPolicy": policy} for k, v in entry["capacity"].items()
        }
    return entry


RANGE_2_2_4 = {"default": "2", "validRange": {"min": "2", "step": "2", "max": "4"}}  # its helper


def valid_values(default: str, *more: str) -> Obj:
    return {"default": default, "validValues": [default, *more]}


def slice_(name: str, node: str, pool: str, driver: str, *devices: Obj, count: int = 1,
           generation: int = 1) -> Obj:  # fmt: skip
    pool_of = {"name": pool, "generation": generation, "resourceSliceCount": count}
    spec: Obj = {"driver": driver, "pool": pool_of, "devices": list(devices)}
    if node == "*":
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def one(name: str, node: str, pool: str, driver: str) -> Obj:
    return slice_(name, node, pool, driver, device(D1))


def exactly(class_name: str, count: int = 1, *selectors: str, mode: str = "ExactCount",
            capacity: str | None = None, tolerations: tuple[Obj, ...] = ()) -> Obj:  # fmt: skip
    e: Obj = {"deviceClassName": class_name, "allocationMode": mode}
    if mode == "ExactCount":
        e["count"] = count
    if selectors:
        e["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity is not None:
        e["capacity"] = {"requests": {CAP0: capacity}}
    if tolerations:
        e["tolerations"] = list(tolerations)
    return e


def request(name: str, class_name: str, count: int = 1, *selectors: str, **kw: Any) -> Obj:
    return {"name": name, "exactly": exactly(class_name, count, *selectors, **kw)}


def prioritized(name: str, *subs: Obj) -> Obj:
    return {"name": name, "firstAvailable": list(subs)}


def sub(name: str, class_name: str, count: int = 1, *selectors: str, **kw: Any) -> Obj:
    return {"name": name, **exactly(class_name, count, *selectors, **kw)}


def claim(name: str, *requests: Obj, constraints: list[Obj] | None = None,
          config: list[Obj] | None = None) -> Obj:  # fmt: skip
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"metadata": {"name": name}, "spec": {"devices": devices}}


def attr(kind: str, value: Any) -> Obj:
    return {kind: value}


@dataclass(frozen=True)
class Case:
    claims: list[Obj]
    classes: list[Obj]
    slices: list[Obj]
    expected: list[list[tuple[str, ...]]] | str | None = None  # results per claim | none | error
    node: str = NODE1
    in_use: InUse = field(default_factory=InUse)
    features: Features = field(default_factory=Features)
    consumed: list[list[dict[str, str]]] | None = None  # per claim, per result (in order)
    check: str = ""  # "tolerations", "config": also compared


C0, C1 = "claim-0", "claim-1"
CASES: dict[str, Case] = {
    "simple": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        [[(R0, A, P1, D1)]],
    ),
    "other-node": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, B), one("slice-2", NODE2, P2, A)],
        [[(R0, A, P2, D1)]],
        node=NODE2,
    ),
    "small-and-large": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, 1, memory_at_least("1Gi")),
                request(R1, CLASS_A, 1, memory_at_least("2Gi")),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, {"memory": "1Gi"}),
                device(D2, {"memory": "2Gi"}),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D2)]],
    ),
    "small-and-large-backtrack-requests": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, 1, memory_at_least("1Gi")),
                request(R1, CLASS_A, 1, memory_at_least("2Gi")),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D2, {"memory": "2Gi"}),
                device(D1, {"memory": "1Gi"}),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D2)]],
    ),
    "small-and-large-backtrack-claims": Case(
        [
            claim(C0, request(R0, CLASS_A, 1, memory_at_least("1Gi"))),
            claim(C1, request(R1, CLASS_A, 1, memory_at_least("2Gi"))),
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D2, {"memory": "2Gi"}),
                device(D1, {"memory": "1Gi"}),
            )
        ],
        [[(R0, A, P1, D1)], [(R1, A, P1, D2)]],
    ),
    "devices-split-across-different-slices": Case(
        [claim(C0, request(R0, CLASS_A, 2))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, A)],
        [[(R0, A, P1, D1), (R0, A, P2, D1)]],
    ),
    "obsolete-slice": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_("slice-1-obsolete", NODE1, P1, A, device(D1), count=2),
            slice_("slice-1-obsolete", NODE1, P1, A, device(D2), count=2, generation=2),
        ],
    ),
    "duplicate-slice": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_("slice-1", NODE1, P1, A, device(D1), count=2),
            slice_("slice-1-2", NODE1, P1, A, device(D1), count=2),
        ],
        "invalid resource pools were encountered",
    ),
    "no-slices": Case([claim(C0, request(R0, CLASS_A))], [cls(CLASS_A, A)], []),
    "not-enough-suitable-devices": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C0, request(R1, CLASS_A))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
    ),
    "no-classes": Case(
        [claim(C0, request(R0, CLASS_A))],
        [],
        [one("slice-1", NODE1, P1, A)],
        "could not retrieve device class class-a",
    ),
    "unknown-class": Case(
        [claim(C0, request(R0, "unknown-class"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "could not retrieve device class unknown-class",
    ),
    "empty-class": Case(
        [claim(C0, request(R0, ""))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "claim claim-0, request req-0: missing device class name (unsupported request type?)",
    ),
    "no-claims-to-allocate": Case([], [cls(CLASS_A, A)], [one("slice-1", NODE1, P1, A)], []),
    "all-devices-single": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        [[(R0, A, P1, D1)]],
    ),
    "all-devices-many": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A), one("slice-1", NODE1, P2, A)],
        [[(R0, A, P1, D1), (R0, A, P2, D1)]],
    ),
    "all-devices-of-the-incomplete-pool": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, device(D1), count=2)],
        "claim claim-0, request req-0: asks for all devices, but resource pool "
        "driver-a/pool-1 is currently being updated",
    ),
    "all-devices-plus-another": Case(
        [claim(C0, request(R0, CLASS_A, mode="All")), claim(C1, request(R0, CLASS_B))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [one("slice-1", NODE1, P1, A), one("slice-1", NODE1, P1, B)],
        [[(R0, A, P1, D1)], [(R0, B, P1, D1)]],
    ),
    "all-devices-many-plus-another-reversed": Case(
        [claim(C1, request(R0, CLASS_B)), claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [slice_("slice-1", NODE1, P1, A, device(D1), device(D2)), one("slice-1", NODE1, P1, B)],
        [[(R0, B, P1, D1)], [(R0, A, P1, D1), (R0, A, P1, D2)]],
    ),
    "all-devices-no-solution": Case(
        [claim(C1, request(R0, CLASS_A)), claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
    ),
    "all-devices-no-solution-reversed": Case(
        [claim(C0, request(R0, CLASS_A, mode="All")), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
    ),
    "all-devices-slice-without-devices": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A)],
    ),
    "all-devices-some-allocated": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, device(D1), device(D2))],
        in_use=InUse({(A, P1, D1)}),
    ),
    "all-devices-slice-without-devices-prioritized-list": Case(
        [
            claim(
                C0, prioritized(R0, sub("subReq-0", CLASS_A, mode="All"), sub("subReq-1", CLASS_B))
            )
        ],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [slice_("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, B)],
        [[("req-0/subReq-1", B, P2, D1)]],
    ),
    "all-devices-some-allocated-prioritized-list": Case(
        [
            claim(
                C0, prioritized(R0, sub("subReq-0", CLASS_A, mode="All"), sub("subReq-1", CLASS_B))
            )
        ],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [slice_("slice-1", NODE1, P1, A, device(D1), device(D2)), one("slice-2", NODE1, P2, B)],
        [[("req-0/subReq-1", B, P2, D1)]],
        in_use=InUse({(A, P1, D1)}),
    ),
    "several-different-drivers": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C0, request(R0, CLASS_B))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [slice_("slice-1", NODE1, P1, A, device(D1), device(D2)), one("slice-1", NODE1, P1, B)],
        [[(R0, A, P1, D1)], [(R0, B, P1, D1)]],
    ),
    "already-allocated-devices": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        in_use=InUse({(A, P1, D1), (A, P1, D2)}),
    ),
    "with-constraint": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A),
                request(R1, CLASS_A),
                constraints=[
                    {"matchAttribute": f"{A}/{n}"}
                    for n in ("numa", "driverVersion", "stringAttribute", "boolAttribute")
                ],
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                *(
                    device(
                        d,
                        driverVersion=attr("version", "1.0.0"),
                        numa=attr("int", 1),
                        stringAttribute=attr("string", "stringAttributeValue"),
                        boolAttribute=attr("bool", True),
                    )
                    for d in (D1, D2)
                ),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D2)]],
    ),
    "with-constraint-non-existent-attribute": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A),
                constraints=[{"matchAttribute": f"{A}/NonExistentAttribute"}],
            )
        ],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
    ),
    "with-constraint-not-matching-int-attribute": Case(
        [claim(C0, request(R0, CLASS_A, 2), constraints=[{"matchAttribute": f"{A}/numa"}])],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, numa=attr("int", 1)),
                device(D2, numa=attr("int", 2)),
            )
        ],
    ),
    "with-constraint-not-matching-int-attribute-all-devices": Case(
        [
            claim(
                C0, request(R0, CLASS_A, mode="All"), constraints=[{"matchAttribute": f"{A}/numa"}]
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, numa=attr("int", 1)),
                device(D2, numa=attr("int", 2)),
            )
        ],
        "claim claim-0, request req-0: cannot add device driver-a/pool-1/device-2 because a "
        "claim constraint would not be satisfied",
    ),
    "with-constraint-not-matching-version-attribute": Case(
        [
            claim(
                C0, request(R0, CLASS_A, 2), constraints=[{"matchAttribute": f"{A}/driverVersion"}]
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, driverVersion=attr("version", "1.0.0")),
                device(D2, driverVersion=attr("version", "2.0.0")),
            )
        ],
    ),
    "with-constraint-for-request": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A),
                request(R1, CLASS_A),
                constraints=[{"requests": [R0], "matchAttribute": f"{A}/driverVersion"}],
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, driverVersion=attr("version", "1.0.0")),
                device(D2, driverVersion=attr("version", "2.0.0")),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D2)]],
    ),
    "with-constraint-for-request-retry": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A),
                request(R1, CLASS_A),
                constraints=[
                    {"requests": [R0], "matchAttribute": f"{A}/driverVersion"},
                    {"matchAttribute": f"{A}/stringAttribute"},
                ],
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(
                    D1, driverVersion=attr("version", "1.0.0"), stringAttribute=attr("string", "a")
                ),
                device(
                    D2, driverVersion=attr("version", "2.0.0"), stringAttribute=attr("string", "b")
                ),
                device(
                    D3, driverVersion=attr("version", "3.0.0"), stringAttribute=attr("string", "b")
                ),
            )
        ],
        [[(R0, A, P1, D2), (R1, A, P1, D3)]],
    ),
    "with-class-device-config": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A, config="classAttribute")],
        [one("slice-1", NODE1, P1, A)],
        [[(R0, A, P1, D1)]],
        check="config",
    ),
    "claim-with-device-config": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A),
                config=[
                    {
                        "opaque": {
                            "driver": A,
                            "parameters": {"deviceAttribute": "deviceAttributeValue"},
                        }
                    }
                ],
            )
        ],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        [[(R0, A, P1, D1)]],
        check="config",
    ),
    "unknown-selector": Case(
        [claim(C0, {"name": R0, "exactly": {"deviceClassName": CLASS_A, "selectors": [{}]}})],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "CEL expression empty (unsupported selector type?)",
    ),
    "unknown-allocation-mode": Case(
        [claim(C0, request(R0, CLASS_A, mode="future-mode"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "unsupported count mode future-mode",
    ),
    "unknown-constraint": Case(
        [claim(C0, request(R0, CLASS_A), constraints=[{}])],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "empty constraint (unsupported constraint type?)",
    ),
    "invalid-CEL-one-device": Case(
        [claim(C0, request(R0, CLASS_A, 1, "noSuchVar"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "undeclared reference",
    ),
    "invalid-CEL-all-devices": Case(
        [claim(C0, request(R0, CLASS_A, 1, "noSuchVar", mode="All"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "undeclared reference",
    ),
    "too-many-devices-single-request": Case(
        [claim(C0, request(R0, CLASS_A, 500))], [cls(CLASS_A, A)], [], "exceeds the claim limit"
    ),
    "too-many-devices-total": Case(
        [claim(C0, request(R0, CLASS_A, 32), request(R1, CLASS_A, 1))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, *(device(f"device-{i}") for i in range(33)))],
        "exceeds the claim limit",
    ),
    "prioritized-list-first-unavailable": Case(
        [claim(C0, prioritized(R0, sub("subReq-0", CLASS_B), sub("subReq-1", CLASS_A)))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [one("slice-1", NODE1, P1, A)],
        [[("req-0/subReq-1", A, P1, D1)]],
    ),
    "prioritized-list-non-available": Case(
        [claim(C0, prioritized(R0, sub("subReq-0", CLASS_B, 2), sub("subReq-1", CLASS_A, 2)))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [one("slice-1", NODE1, P1, A), one("slice-2", NODE1, P2, B)],
    ),
    "prioritized-list-device-config": Case(
        [
            claim(
                C0,
                prioritized(R0, sub("subReq-0", CLASS_A), sub("subReq-1", CLASS_B, 2)),
                config=[
                    {
                        "requests": ["req-0/subReq-0"],
                        "opaque": {"driver": A, "parameters": {"foo": "fooValue"}},
                    },
                    {
                        "requests": ["req-0/subReq-1"],
                        "opaque": {"driver": B, "parameters": {"bar": "barValue"}},
                    },
                ],
            )
        ],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [slice_("slice-1", NODE1, P1, B, device(D1), device(D2))],
        [[("req-0/subReq-1", B, P1, D1), ("req-0/subReq-1", B, P1, D2)]],
        check="config",
    ),
    "prioritized-list-class-config": Case(
        [claim(C0, prioritized(R0, sub("subReq-0", CLASS_A, 2), sub("subReq-1", CLASS_B, 2)))],
        [cls(CLASS_A, A, config="foo"), cls(CLASS_B, B, config="bar")],
        [
            slice_("slice-1", NODE1, P1, B, device(D1), device(D2)),
            slice_("slice-2", NODE1, P2, A, device(D3)),
        ],
        [[("req-0/subReq-1", B, P1, D1), ("req-0/subReq-1", B, P1, D2)]],
        check="config",
    ),
    "prioritized-list-subrequests-with-expressions": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, 1, memory_at_least("1Gi")),
                prioritized(
                    R1,
                    sub("subReq-0", CLASS_A, 1, memory_at_least("4Gi")),
                    sub("subReq-1", CLASS_A, 2, memory_at_least("2Gi")),
                ),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, {"memory": "2Gi"}),
                device(D2, {"memory": "2Gi"}),
                device(D3, {"memory": "1Gi"}),
            )
        ],
        [[(R0, A, P1, D3), ("req-1/subReq-1", A, P1, D1), ("req-1/subReq-1", A, P1, D2)]],
    ),
    "prioritized-list-subrequests-with-constraints-ref-parent-request": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, 1, memory_at_least("8Gi")),
                prioritized(
                    R1,
                    sub("subReq-0", CLASS_A, 1, memory_at_least("2Gi")),
                    sub("subReq-1", CLASS_A, 1, memory_at_least("1Gi")),
                ),
                constraints=[{"requests": [R0, R1], "matchAttribute": f"{A}/driverVersion"}],
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, {"memory": "8Gi"}, driverVersion=attr("version", "1.0.0")),
            ),
            slice_(
                "slice-2",
                NODE1,
                P2,
                A,
                device(D2, {"memory": "2Gi"}, driverVersion=attr("version", "2.0.0")),
                device(D3, {"memory": "1Gi"}, driverVersion=attr("version", "1.0.0")),
            ),
        ],
        [[(R0, A, P1, D1), ("req-1/subReq-1", A, P2, D3)]],
    ),
    "prioritized-list-subrequests-with-constraints-ref-sub-request": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, 1, memory_at_least("8Gi")),
                prioritized(
                    R1,
                    sub("subReq-0", CLASS_A, 1, memory_at_least("2Gi")),
                    sub("subReq-1", CLASS_A, 1, memory_at_least("1Gi")),
                ),
                constraints=[
                    {"requests": [R0, "req-1/subReq-0"], "matchAttribute": f"{A}/driverVersion"}
                ],
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                device(D1, {"memory": "8Gi"}, driverVersion=attr("version", "1.0.0")),
            ),
            slice_(
                "slice-2",
                NODE1,
                P2,
                A,
                device(D2, {"memory": "2Gi"}, driverVersion=attr("version", "2.0.0")),
            ),
        ],
        [[(R0, A, P1, D1), ("req-1/subReq-1", A, P2, D2)]],
    ),
    "prioritized-list-subrequests-with-allocation-mode-all": Case(
        [
            claim(
                C0, prioritized(R0, sub("subReq-0", CLASS_A, mode="All"), sub("subReq-1", CLASS_A))
            )
        ],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, device(D1), device(D2))],
        [[("req-0/subReq-1", A, P1, D2)]],
        in_use=InUse({(A, P1, D1)}),
    ),
    "prioritized-list-disabled": Case(
        [claim(C0, prioritized(R0, sub("subReq-0", CLASS_A)))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "claim claim-0, request req-0: has subrequests, but the DRAPrioritizedList feature is "
        "disabled",
        features=Features(prioritized_list=False),
    ),
    "prioritized-list-with-backtracking": Case(
        [
            claim(
                C0,
                prioritized(
                    R0,
                    sub("subReq-0", CLASS_A, 1, memory_at_least("8Gi")),
                    sub("subReq-1", CLASS_A, 1, memory_at_least("4Gi")),
                ),
                request(R1, CLASS_A, 1, memory_at_least("8Gi")),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_("slice-1", NODE1, P1, A, device(D1, {"memory": "8Gi"})),
            slice_("slice-2", NODE1, P2, A, device(D2, {"memory": "4Gi"})),
        ],
        [[("req-0/subReq-1", A, P2, D2), (R1, A, P1, D1)]],
    ),
    "prioritized-list-too-many-in-first-subrequest": Case(
        [claim(C0, prioritized(R0, sub("subReq-0", CLASS_B, 500), sub("subReq-1", CLASS_A)))],
        [cls(CLASS_A, A), cls(CLASS_B, B)],
        [one("slice-1", NODE1, P1, A)],
        [[("req-0/subReq-1", A, P1, D1)]],
    ),
    "tainted-two-devices": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                {**device(D1), "taints": [TAINT_NO_SCHEDULE]},
                {**device(D2), "taints": [TAINT_NO_EXECUTE]},
            )
        ],
    ),
    "tainted-two-devices-tolerated": Case(
        [claim(C0, request(R0, CLASS_A, tolerations=(TOLERATE_NO_EXECUTE,)))],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                {**device(D1), "taints": [TAINT_NO_SCHEDULE]},
                {**device(D2), "taints": [TAINT_NO_EXECUTE]},
            )
        ],
        [[(R0, A, P1, D2)]],
        check="tolerations",
    ),
    "tainted-two-devices-prioritized-list-tolerated": Case(
        [
            claim(
                C0,
                prioritized(
                    R0,
                    sub("subReq-0", CLASS_A),
                    sub("subReq-1", CLASS_A, tolerations=(TOLERATE_NO_EXECUTE,)),
                ),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                {**device(D1), "taints": [TAINT_NO_SCHEDULE]},
                {**device(D2), "taints": [TAINT_NO_EXECUTE]},
            )
        ],
        [[("req-0/subReq-1", A, P1, D2)]],
        check="tolerations",
    ),
    "tainted-no-effect": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, {**device(D1), "taints": [TAINT_NONE]})],
        [[(R0, A, P1, D1)]],
    ),
    "tainted-one-device-two-taints-both-tolerated": Case(
        [claim(C0, request(R0, CLASS_A, tolerations=(TOLERATE_NO_SCHEDULE, TOLERATE_NO_EXECUTE)))],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                {**device(D1), "taints": [TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]},
            )
        ],
        [[(R0, A, P1, D1)]],
        check="tolerations",
    ),
    "tainted-disabled": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                {**device(D1), "taints": [TAINT_NO_SCHEDULE, TAINT_NO_EXECUTE]},
            )
        ],
        [[(R0, A, P1, D1)]],
        features=Features(device_taints=False),
    ),
    "tainted-all-devices-single": Case(
        [claim(C0, request(R0, CLASS_A, mode="All"))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, {**device(D1), "taints": [TAINT_NO_SCHEDULE]})],
    ),
    "prioritized-list-allocation-mode-all-with-selectors": Case(
        [
            claim(
                C0,
                prioritized(
                    R0,
                    sub(
                        "subReq-0",
                        CLASS_A,
                        1,
                        f'device.attributes["{A}"].generation == "v6"',
                        mode="All",
                    ),
                    sub(
                        "subReq-1",
                        CLASS_A,
                        1,
                        f'device.attributes["{A}"].generation == "v5"',
                        mode="All",
                    ),
                ),
            )
        ],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, device(D1, generation=attr("string", "v5")))],
        [[("req-0/subReq-1", A, P1, D1)]],
    ),
    "consumable-capacity-disabled-feature": Case(
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A)],
        [one("slice-1", NODE1, P1, A)],
        "claim claim-0, request req-0: has capacity requests, but the DRAConsumableCapacity "
        "feature is disabled",
        features=Features(consumable_capacity=False),
    ),
    "consumable-capacity-multi-allocatable-device-with-missing-capacity-request": Case(
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP1: "1"})))],
    ),
    "consumable-capacity-multi-allocatable-device-without-capacity-without-capacity-request": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1)))],
        [[(R0, A, P1, D1)], [(R0, A, P1, D1)]],
        consumed=[[{}], [{}]],
    ),
    "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A, multi=True)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(device(D1, {CAP0: "1"})),
                multi(device(D2, {CAP0: "1"})),
            )
        ],
        [[(R0, A, P1, D1)], [(R0, A, P1, D2)]],
        consumed=[[{CAP0: "1"}], [{CAP0: "1"}]],
    ),
    "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request-block": Case(  # noqa: E501 - the upstream case's name
        [claim(C0, request(R0, CLASS_A)), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"})))],
    ),
    "consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request": Case(
        [
            claim(C0, request(R0, CLASS_A, capacity="1")),
            claim(C1, request(R0, CLASS_A, capacity="1")),
        ],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"})))],
        [[(R0, A, P1, D1)], [(R0, A, P1, D1)]],
        consumed=[[{CAP0: "1"}], [{CAP0: "1"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-policy-without-capacity-request": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "4"}), RANGE_2_2_4))],
        [[(R0, A, P1, D1)], [(R0, A, P1, D1)]],
        consumed=[[{CAP0: "2"}], [{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-zero-request-policy": Case(
        [claim(C0, request(R0, CLASS_A)), claim(C1, request(R0, CLASS_A))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "1"}), valid_values("0")))],
        [[(R0, A, P1, D1)], [(R0, A, P1, D1)]],
        consumed=[[{CAP0: "0"}], [{CAP0: "0"}]],
    ),
    "consumable-capacity-multi-allocatable-device-violates-zero-request-policy": Case(
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "1"}), valid_values("0")))],
    ),
    "consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request": Case(
        [
            claim(C0, request(R0, CLASS_A, capacity="1")),
            claim(C1, request(R0, CLASS_A, capacity="1")),
        ],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "4"}), RANGE_2_2_4))],
        [[(R0, A, P1, D1)], [(R0, A, P1, D1)]],
        consumed=[[{CAP0: "2"}], [{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-range-policy-step": Case(
        [claim(C0, request(R0, CLASS_A, capacity="3"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "4"}), RANGE_2_2_4))],
        [[(R0, A, P1, D1)]],
        consumed=[[{CAP0: "4"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-valid-values-policy": Case(
        [claim(C0, request(R0, CLASS_A, capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "4"}), valid_values("1", "2")))],
        [[(R0, A, P1, D1)]],
        consumed=[[{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up": Case(
        [claim(C0, request(R0, CLASS_A, capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "3"}), valid_values("1", "3")))],
        [[(R0, A, P1, D1)]],
        consumed=[[{CAP0: "3"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request": Case(
        [
            claim(C0, request(R0, CLASS_A, capacity="1")),
            claim(C1, request(R0, CLASS_A, capacity="2")),
        ],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"}), RANGE_2_2_4))],
    ),
    "consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy": Case(
        [claim(C0, request(R0, CLASS_A, capacity="6"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "10"}), RANGE_2_2_4))],
    ),
    "consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining": Case(
        [claim(C0, request(R0, CLASS_A, capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "4"}), RANGE_2_2_4))],
        [[(R0, A, P1, D1)]],
        consumed=[[{CAP0: "2"}]],
        in_use=InUse(consumed={(A, P1, D1): {CAP0: Fraction(2)}}),
    ),
    "consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device": Case(
        [claim(C0, request(R0, CLASS_A, capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(device(D1, {CAP0: "2"}), RANGE_2_2_4),
                multi(device(D2, {CAP0: "2"}), RANGE_2_2_4),
            )
        ],
        [[(R0, A, P1, D2)]],
        consumed=[[{CAP0: "2"}]],
        in_use=InUse(consumed={(A, P1, D1): {CAP0: Fraction(2)}}),
    ),
    "consumable-capacity-with-multi-allocatable-device-backtrack": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, capacity="2"),
                request(R1, CLASS_A, capacity="2"),
                constraints=[{"matchAttribute": f"{A}/stringAttribute"}],
            ),
            claim(C1, request(R0, CLASS_A, capacity="2")),
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(
                    device(
                        D2, {CAP0: "2"}, stringAttribute=attr("string", "stringAttributeValue1")
                    ),
                    RANGE_2_2_4,
                ),
                multi(
                    device(
                        D1, {CAP0: "4"}, stringAttribute=attr("string", "stringAttributeValue2")
                    ),
                    RANGE_2_2_4,
                ),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D1)], [(R0, A, P1, D2)]],
        consumed=[[{CAP0: "2"}, {CAP0: "2"}], [{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-subrequest": Case(
        [
            claim(
                C0,
                prioritized(
                    R0,
                    sub("subReq-0", CLASS_A, capacity="4"),
                    sub("subReq-1", CLASS_A, capacity="2"),
                    sub("subReq-1", CLASS_A),
                ),
            )
        ],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"}), RANGE_2_2_4))],
        [[("req-0/subReq-1", A, P1, D1)]],
        consumed=[[{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-with-no-available-consumable-capacity": Case(
        [claim(C0, request(R0, CLASS_A, capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"}), RANGE_2_2_4))],
        in_use=InUse(consumed={(A, P1, D1): {CAP0: Fraction(2)}}),
    ),
    "consumable-capacity-multi-allocatable-device-allocation-mode-all-filter-out-no-capacity": Case(
        [claim(C0, request(R0, CLASS_A, mode="All", capacity="2"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"})), multi(device(D2)))],
        [[(R0, A, P1, D1)]],
        consumed=[[{CAP0: "2"}]],
    ),
    "consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-sufficient": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, capacity="1"),
                request(R1, CLASS_A, mode="All", capacity="1"),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(device(D1, {CAP0: "2"})),
                multi(device(D2, {CAP0: "1"})),
            )
        ],
        [[(R0, A, P1, D1), (R1, A, P1, D1), (R1, A, P1, D2)]],
        consumed=[[{CAP0: "1"}, {CAP0: "1"}, {CAP0: "1"}]],
    ),
    "consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-insufficient": Case(  # noqa: E501 - the upstream case's name
        [
            claim(
                C0,
                request(R0, CLASS_A, capacity="1"),
                request(R1, CLASS_A, mode="All", capacity="1"),
            )
        ],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(device(D1, {CAP0: "1"})),
                multi(device(D2, {CAP0: "1"})),
            )
        ],
    ),
    "consumable-capacity-multi-allocatable-device-allocation-mode-all-in-use-insufficient": Case(
        [claim(C0, request(R0, CLASS_A, mode="All", capacity="1"))],
        [cls(CLASS_A, A)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(device(D1, {CAP0: "1"})),
                multi(device(D2, {CAP0: "1"})),
            )
        ],
        [[(R0, A, P1, D2)]],
        consumed=[[{CAP0: "1"}]],
        in_use=InUse(consumed={(A, P1, D1): {CAP0: Fraction(1)}}),
    ),
    "consumable-capacity-dedicated-device-with-consumable-capacity-request": Case(
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A, multi=False)],
        [slice_("slice-1", NODE1, P1, A, device(D1, {CAP0: "1"}))],
        [[(R0, A, P1, D1)]],
    ),
    "allow-multiple-allocations-exclude-multi-allocatable-device-by-class-selector": Case(
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A, multi=False)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "1"})))],
    ),
    "allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated": Case(  # noqa: E501 - the upstream case's name
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, multi(device(D1, {CAP0: "2"}), RANGE_2_2_4))],
        in_use=InUse({(A, P1, D1)}),
    ),
    "allow-multiple-allocations-not-allocate-dedicated-device-which-change-from-multi-allocatable": Case(  # noqa: E501 - the upstream case's name
        [claim(C0, request(R0, CLASS_A, capacity="1"))],
        [cls(CLASS_A, A, multi=True)],
        [slice_("slice-1", NODE1, P1, A, {**device(D1, {CAP0: "2"})})],
        in_use=InUse(consumed={(A, P1, D1): {CAP0: Fraction(1)}}),
    ),
    "distinct-constraint-one-multi-allocatable-device-with-distinct-constraint": Case(
        [
            claim(
                C0,
                request(R0, CLASS_A, capacity="1"),
                request(R1, CLASS_A, capacity="1"),
                constraints=[{"distinctAttribute": f"{A}/stringAttribute"}],
            )
        ],
        [cls(CLASS_A, A, multi=True)],
        [
            slice_(
                "slice-1",
                NODE1,
                P1,
                A,
                multi(
                    device(D1, {CAP0: "2"}, stringAttribute=attr("string", "stringAttributeValue")),
                    RANGE_2_2_4,
                ),
            )
        ],
    ),
    "multi-host-resource-pool-complete-update-from-node-1-to-node-2": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_("slice-1", NODE1, P1, A, device(D1), count=2),
            slice_("slice-1", NODE1, P1, A, device(D2), count=2),
            slice_("slice-2", NODE2, P1, A, device(D1), count=2, generation=2),
            slice_("slice-2", NODE2, P1, A, device(D2), count=2, generation=2),
        ],
        [[(R0, A, P1, D1)]],
    ),
    "multi-host-resource-pool-incomplete-update-from-node-2-to-node-1": Case(
        [claim(C0, request(R0, CLASS_A))],
        [cls(CLASS_A, A)],
        [
            slice_("slice-1", NODE2, P1, A, device(D1), count=2),
            slice_("slice-1", NODE2, P1, A, device(D2), count=2),
            slice_("slice-2", NODE1, P1, A, device(D1), count=2, generation=2),
        ],
    ),
}


def _results(allocation: Obj) -> list[tuple[str, ...]]:
    return sorted(
        (r["request"], r["driver"], r["pool"], r["device"])
        for r in allocation["devices"]["results"]
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_allocator_agrees_with_the_kubernetes_allocators_table(name: str) -> None:
    case = CASES[name]
    classes = {c["metadata"]["name"]: c for c in case.classes}
    if isinstance(case.expected, str):
        with pytest.raises(AllocationError, match=re.escape(case.expected)):
            allocate(case.node, case.claims, classes, case.slices, case.in_use, case.features)
        return
    found = allocate(case.node, case.claims, classes, case.slices, case.in_use, case.features)
    if not case.expected:
        assert not found
        return
    assert found is not None
    assert [_results(a) for a in found] == [sorted(r) for r in case.expected]
    for allocation in found:  # a device from the node's own slice: the allocation is the node's
        terms = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                           "values": [case.node]}]}]  # fmt: skip
    if case.consumed is not None:
        for allocation, wanted in zip(found, case.consumed, strict=True):
            results = allocation["devices"]["results"]
            assert all(r.get("shareID") for r in results)  # a share of a multi-allocatable device
            got = [{k: Quantity(v).value for k, v in (r.get("consumedCapacity") or {}).items()}
                   for r in results]  # fmt: skip
            assert sorted(map(sorted, (g.items() for g in got))) == sorted(
                map(sorted, ({k: Quantity(v).value for k, v in w.items()}.items() for w in wanted))
            )
    if case.check == "tolerations":
        request = case.claims[0]["spec"]["devices"]["requests"][0]
        source = request.get("exactly") or request["firstAvailable"][-1]
        for r in found[0]["devices"]["results"]:
            assert r["tolerations"] == source["tolerations"]
    if case.check == "config":
        assert found[0]["devices"]["config"] == EXPECTED_CONFIG[name]


def _config(source: str, requests: list[str] | None, driver: str, attribute: str) -> Obj:
    parameters = {attribute: attribute + "Value"}
    entry: Obj = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


EXPECTED_CONFIG = {
    "with-class-device-config": [_config("FromClass", [R0], A, "classAttribute")],
    "claim-with-device-config": [_config("FromClaim", None, A, "deviceAttribute")],
    "prioritized-list-device-config": [_config("FromClaim", ["req-0/subReq-1"], B, "bar")],
    "prioritized-list-class-config": [_config("FromClass", ["req-0/subReq-1"], B, "bar")],
}


def test_a_share_of_a_device_gets_its_own_share_id() -> None:
    """Two claims on one multi-allocatable device: each result its own, fresh shareID."""
    case = CASES[
        "consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request"
    ]
    found = allocate(NODE1, case.claims, {CLASS_A: case.classes[0]}, case.slices)
    assert found is not None
    ids = [a["devices"]["results"][0]["shareID"] for a in found]
    assert len(set(ids)) == 2


def test_in_use_counts_what_allocated_claims_hold() -> None:
    held: list[Obj] = [{"status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": A, "pool": P1, "device": D1},
        {"request": "r", "driver": A, "pool": P1, "device": D2, "shareID": "s1",
         "consumedCapacity": {"memory": "20Gi"}},
    ]}}}}, {"status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": A, "pool": P1, "device": D2, "shareID": "s2",
         "consumedCapacity": {"memory": "4Gi"}},
    ]}}}}, {"status": {}}]  # fmt: skip
    in_use = InUse.of(held)
    assert in_use.devices == {(A, P1, D1)}
    assert in_use.consumed == {(A, P1, D2): {"memory": Fraction(24 << 30)}}


ALL_OF_TWO = [
    slice_("slice-1", NODE1, P1, A, {**device(D1), "taints": [TAINT_NO_SCHEDULE]}, device(D2)),
    slice_("slice-2", NODE2, P2, A, device(D1), device(D2)),
]


@pytest.mark.parametrize(
    ("tolerations", "features", "node", "expected"),
    [
        ((), Features(), NODE1, None),  # one tainted device: no allocation on this node
        ((), Features(), NODE2, [(R0, A, P2, D1), (R0, A, P2, D2)]),  # the clean node: all
        ((TOLERATE_NO_SCHEDULE,), Features(), NODE1, [(R0, A, P1, D1), (R0, A, P1, D2)]),
        ((TOLERATE_NO_EXECUTE,), Features(), NODE1, None),  # a toleration of another effect
        ((), Features(device_taints=False), NODE1, [(R0, A, P1, D1), (R0, A, P1, D2)]),
    ],
)
def test_all_takes_its_devices_by_the_selectors_and_then_needs_every_one_untainted(
    tolerations: tuple[Obj, ...], features: Features, node: str, expected: list[Any] | None
) -> None:
    """`allocationMode: All` beside a tainted device, as the Kubernetes allocator has it
    (`allocator_incubating.go`): `validateDeviceRequest` gathers All's devices by the
    selectors alone, then `allocateOne` hands each to `allocateDevice(..., must=true)`, whose
    `taintPreventsAllocation` makes the whole request fail on that node ("If we couldn't get
    all of them, then there is no solution"), not a claim of the healthy rest; the table's
    `tainted-all-devices-single` is the case of one device only."""
    claims = [claim(C0, request(R0, CLASS_A, mode="All", tolerations=tolerations))]
    found = allocate(node, claims, {CLASS_A: cls(CLASS_A, A)}, ALL_OF_TWO, features=features)
    if expected is None:
        assert not found
    else:
        assert found is not None
        assert [_results(a) for a in found] == [sorted(expected)]


MANY = [  # node 1: 33 devices, 17 of them even; node 2: 32
    slice_("slice-1", NODE1, P1, A, *(device(f"device-{i}", even=attr("bool", i % 2 == 0))
                                      for i in range(33))),
    slice_("slice-2", NODE2, P2, A, *(device(f"device-{i}") for i in range(32))),
]  # fmt: skip
EVEN = f'device.attributes["{A}"].even'


@pytest.mark.parametrize(
    ("requests", "node", "expected"),
    [
        ([request(R0, CLASS_A, mode="All")], NODE1,
         f"claim {C0}: number of requested devices 33 exceeds the claim limit of 32"),
        ([request(R0, CLASS_A, mode="All")], NODE2, 32),  # all 32: the most a claim holds
        ([request(R0, CLASS_A, 1, EVEN, mode="All"), request(R1, CLASS_A, 16)], NODE1,
         f"claim {C0}: number of requested devices 33 exceeds the claim limit of 32"),
        ([prioritized(R0, sub("all", CLASS_A, mode="All"), sub("one", CLASS_A))], NODE1, 1),
    ],
)  # fmt: skip
def test_all_over_more_devices_than_a_claim_holds_is_an_error(
    requests: list[Obj], node: str, expected: str | int
) -> None:
    """`allocationMode: All` counts the devices its selectors gather on the node
    (`validateDeviceRequest`: numDevices = len(allDevices)), and `Allocate` sums a claim's
    counts (a firstAvailable list: its smallest) and fails the attempt when that is over
    `AllocationResultsMaxSize` (`allocator_incubating.go`), rather than finding no
    allocation; a subrequest over it is passed over for the next."""
    claims = [claim(C0, *requests)]
    classes = {CLASS_A: cls(CLASS_A, A)}
    if isinstance(expected, str):
        with pytest.raises(AllocationError, match=re.escape(expected)):
            allocate(node, claims, classes, MANY)
        return
    found = allocate(node, claims, classes, MANY)
    assert found is not None
    assert len(found[0]["devices"]["results"]) == expected
