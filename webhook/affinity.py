"""Merging required node affinity into a pod that may already have its own.

Required node selector terms are ORed, the expressions inside a term ANDed. To add a
constraint without widening or dropping the pod's own, every existing term gets the new
expressions; a pod without terms gets one term holding just them. Expressions already present
are not added again, so a second run changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.patch import Op, pointer, set_path
from webhook.placement import Expression
from webhook.pod import MalformedPod

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _object(value: object, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):  # decoded JSON: objects are dicts
        raise MalformedPod(f"{where} is {type(value).__name__}, not an object")
    return value


def require(spec: Mapping[str, Any], expressions: Sequence[Expression]) -> list[Op]:
    """Ops that AND `expressions` into the required node affinity of the pod `spec`."""
    if not expressions:
        return []
    new_term: dict[str, Any] = {"matchExpressions": list(expressions)}
    affinity = _object(spec.get("affinity"), "spec.affinity") or {}
    node = _object(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity") or {}
    required = _object(node.get(REQUIRED), f"spec.affinity.nodeAffinity.{REQUIRED}")
    if required is None:
        op = set_path(
            spec, "/spec", ("affinity", "nodeAffinity", REQUIRED), {"nodeSelectorTerms": [new_term]}
        )
        return [op] if op else []
    base = pointer("/spec/affinity/nodeAffinity", REQUIRED)
    terms = required.get("nodeSelectorTerms") or []
    if not isinstance(terms, list):
        raise MalformedPod("spec.affinity.nodeAffinity…nodeSelectorTerms is not a list")
    if not terms:
        return [{"op": "add", "path": base + "/nodeSelectorTerms", "value": [new_term]}]
    ops: list[Op] = []
    for i, raw in enumerate(terms):
        term = _object(raw, f"nodeSelectorTerms[{i}]")
        if term is None:
            raise MalformedPod(f"nodeSelectorTerms[{i}] is null, not an object")
        have = term.get("matchExpressions") or []
        if not isinstance(have, list):
            raise MalformedPod(f"nodeSelectorTerms[{i}].matchExpressions is not a list")
        missing = [e for e in expressions if e not in have]
        path = pointer(base, "nodeSelectorTerms", i, "matchExpressions")
        if missing and term.get("matchExpressions") is None:
            ops.append({"op": "add", "path": path, "value": missing})
        else:
            ops += [{"op": "add", "path": path + "/-", "value": e} for e in missing]
    return ops
