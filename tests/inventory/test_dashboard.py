"""The Grafana dashboard asks only for what the node agent exports, and the manifests ship it
and let Prometheus find the agent's endpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.agent.metrics import NAMES, Metrics, Snapshot
from gpuwire import sim
from gpuwire.holders import SHARED_GPU, Conflict, Holder, NodeHolders
from tests.deploy.test_deploy import KUSTOMIZATIONS, containers, find, render

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpuwire.json"


def exported_labels() -> dict[str, set[str]]:
    """Each metric family and its labels, as the agent's collector yields them."""
    gpus = sim.make_machine(gpus=1).devices
    holder = Holder("ns", "pod", "c", "plugin", (gpus[0].uuid,))
    metrics = Metrics()
    conflict = Conflict(SHARED_GPU, (gpus[0].uuid,), ("ns/pod", "ns/other"))
    metrics.update(Snapshot("n", gpus, frozenset(), NodeHolders((holder,), (), True), (conflict,)))
    families: dict[str, set[str]] = {}
    for family in metrics.collect():
        families[family.name] = {label for s in family.samples for label in s.labels}
    return families


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return []


def test_every_query_uses_exported_metrics_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = expressions(dashboard["panels"])
    variables = [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    assert len(queries) >= 8
    labels = exported_labels()
    assert set(labels) == set(NAMES)
    for expr in [*queries, *variables]:
        metrics = set(re.findall(r"gpuwire_\w+", expr))
        assert metrics <= set(NAMES), expr
        known = set().union(*(labels[m] for m in metrics))
        grouped = re.findall(r"(?:by|on|group_left)\s*\(([^)]*)\)", expr)
        matched = re.findall(r"[{,]\s*(\w+)\s*(?:=~|!=|=)", expr)
        named = re.findall(r"label_values\(\w+,\s*(\w+)\)", expr)
        used = {w.strip() for g in grouped for w in g.split(",") if w.strip()}
        assert used | set(matched) | set(named) <= known, expr


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_manifests_ship_the_dashboard_and_expose_the_metrics(kustomization: str) -> None:
    objs = render(kustomization)
    config_map = find(objs, "ConfigMap", "gpuwire-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["gpuwire.json"]) == json.loads(DASHBOARD.read_text())
    (agent,) = [o for o in objs if o["kind"] == "DaemonSet"
                and "--holders" in containers(o)[-1].get("args", [])]  # fmt: skip
    template = agent["spec"]["template"]
    [container] = containers(agent)
    [port] = [a.split("=")[1] for a in container["args"] if a.startswith("--metrics-port=")]
    assert "--holders" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": int(port)}]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == port
    assert template["spec"]["hostPID"] is True  # the records name host pids
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/pod-resources", "/run/gpuwire/containers"} <= mounts
