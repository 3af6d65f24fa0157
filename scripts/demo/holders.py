"""The last scene: who holds which GPU once the scenarios' pods run, as `gpuwire inventory` sees it.

On the first node the device plugin's holders job (the node agent) merges the shim's container
records and the kubelet's pod-resources API into the Node's `gpuwire.io/holders` annotation;
on the DRA node the holders are the DRA claims' allocations and the pods they are reserved
for. `gpuwire inventory` reads the Nodes, pods, ResourceClaims and ResourceSlices from the API
server and prints the table. The scene waits until the annotation names every container that
holds GPUs of the first node, with the GPUs the container saw (where containers run) or was
allocated (where they do not), then runs the command; its JSON (`-o json`) is checked for the
DRA node's holders and the memory the shares of its shared GPU hold.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwire import holders
from gpuwire.devices import Device
from scripts.demo import amd, dra
from scripts.demo.base import GPUWIRE, Step, until
from scripts.demo.cluster import NODE, Cluster
from scripts.demo.scenarios import Outcome, Verdict, seen_minors
from testbed.host import LabError

Key = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class Inventory:
    expected: Mapping[Key, tuple[str, ...]]  # who should hold which GPUs (UUIDs)
    published: holders.NodeHolders  # what the node agent published
    step: Step  # the `gpuwire inventory` command
    table: str  # what it printed
    dra_expected: Mapping[Key, tuple[str, ...]] = field(default_factory=dict)  # the DRA node's
    report: Mapping[str, Any] = field(default_factory=dict)  # `-o json`
    shared_mib: int = 0  # what the DRA claims' shares of its shared GPU should hold
    amd_expected: Mapping[Key, tuple[str, ...]] = field(default_factory=dict)  # the AMD node's

    def held_on(self, name: str) -> dict[Key, tuple[str, ...]]:
        """A node's holders, as the inventory's JSON lists them."""
        out: dict[Key, list[str]] = {}
        for node in self.report.get("nodes", ()):
            if node["name"] != name:
                continue
            for g in node["gpus"]:
                for h in g["holders"]:
                    out.setdefault((h["namespace"], h["pod"], h["container"]), []).append(g["uuid"])
        return {k: tuple(sorted(v)) for k, v in out.items()}

    @property
    def dra_held(self) -> dict[Key, tuple[str, ...]]:
        return self.held_on(dra.NODE)

    @property
    def amd_held(self) -> dict[Key, tuple[str, ...]]:
        return self.held_on(amd.NODE)

    @property
    def dra_shared(self) -> dict[str, int]:
        """UUID → MiB used of each shared GPU of the DRA node."""
        return {
            g["uuid"]: g["sharedMemory"]["usedMiB"]
            for node in self.report.get("nodes", ())
            if node["name"] == dra.NODE
            for g in node["gpus"]
            if "sharedMemory" in g
        }

    @property
    def held(self) -> dict[Key, tuple[str, ...]]:
        return {h.key: h.gpus for h in self.published.holders}

    @property
    def conflicts(self) -> list[holders.Conflict]:
        return holders.conflicts(self.published)


def expected_holders(
    outcomes: Sequence[Outcome], devices: Sequence[Device], name: str = NODE
) -> dict[Key, tuple[str, ...]]:
    """Each container on node `name` that holds GPUs: those it saw if it ran, else those it
    was allocated."""
    by_minor = {d.minor: d.uuid for d in devices}
    out = {}
    for outcome in outcomes:
        if outcome.pod is None or outcome.pod["spec"].get("nodeName") != name:
            continue
        meta = outcome.pod["metadata"]
        for started in outcome.containers:
            if started.seen is not None:
                held = tuple(by_minor[m] for m in seen_minors(started.seen))
            else:
                held = tuple(d for a in started.allocations for d in a.devices)
            if held:
                out[(meta["namespace"], meta["name"], started.name)] = tuple(sorted(held))
    return out


def published(cluster: Cluster, name: str = NODE) -> holders.NodeHolders:
    node = cluster.api.get("nodes", name) or {"metadata": {}}
    value = node["metadata"].get("annotations", {}).get(holders.ANNOTATION)
    return holders.decode(value) if value else holders.NodeHolders((), (), False)


def dra_holders(
    outcomes: Sequence[Outcome], devices: Sequence[Device]
) -> tuple[dict[Key, tuple[str, ...]], int]:
    """Each container of a pod bound to the DRA node, with the GPUs its claims were allocated;
    and the MiB the claims' shares consume."""
    by_minor = {d.minor: d.uuid for d in devices}
    out, shared = {}, 0
    for outcome in outcomes:
        if outcome.pod is None or outcome.pod["spec"].get("nodeName") != dra.NODE:
            continue
        meta = outcome.pod["metadata"]
        held = tuple(
            sorted(by_minor[int(n.removeprefix("gpu-"))] for n in dra.allocated(outcome.claims))
        )
        for started in outcome.containers:
            out[(meta["namespace"], meta["name"], started.name)] = held
        for claim in outcome.claims:
            for r in claim["status"]["allocation"]["devices"]["results"]:
                memory = (r.get("consumedCapacity") or {}).get("memory")
                shared += int(memory.removesuffix("Gi")) * 1024 if memory else 0
    return out, shared


def take(
    cluster: Cluster,
    outcomes: Sequence[Outcome],
    dra_devices: Sequence[Device] = (),
    amd_devices: Sequence[Device] = (),
) -> Inventory:
    """Wait (a few of the agents' rounds at most) for the holders to be published, then
    `gpuwire inventory`, as a table and as JSON."""
    expected = expected_holders(outcomes, cluster.devices)
    dra_expected, shared = dra_holders(outcomes, dra_devices)
    amd_expected = expected_holders(outcomes, amd_devices, amd.NODE)

    def current(name: str) -> dict[Key, tuple[str, ...]]:
        return {h.key: h.gpus for h in published(cluster, name).holders}

    def both() -> bool:
        return current(NODE) == expected and (not amd_devices or current(amd.NODE) == amd_expected)

    with contextlib.suppress(LabError):  # the verdict shows the difference
        until(both, "the node agents to publish the holders", 15)
    argv = (GPUWIRE, "inventory", "--kubeconfig", str(cluster.kubeconfig))
    out = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    as_json = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    report = json.loads(as_json.stdout) if as_json.returncode == 0 else {}
    step = Step("who holds which GPU", argv)
    return Inventory(expected, published(cluster), step, out.stdout + out.stderr, dra_expected,
                     report, shared, amd_expected)  # fmt: skip


def judge(inventory: Inventory) -> Verdict:
    """Right when the published holders are the expected ones, and a GPU held twice is flagged
    (only then)."""
    held, expected = inventory.held, inventory.expected
    pods = len({k[:2] for k in held})
    seen = f"{pods} pods on {len({u for g in held.values() for u in g})} GPUs"
    kinds = sorted({c.kind for c in inventory.conflicts})
    if kinds:
        seen += f"; flagged {', '.join(kinds)}"
    shared = [u for gpus in expected.values() for u in gpus]
    overlap = len(shared) != len(set(shared))
    if held != expected:
        missing = sorted(set(expected.items()) - set(held.items()))
        extra = sorted(set(held.items()) - set(expected.items()))
        seen += f"; missing {missing}, unexpected {extra}"
    return Verdict(seen, held == expected and bool(kinds) == overlap)


def judge_dra(inventory: Inventory) -> Verdict:
    """Right when the inventory lists each DRA pod's container on the GPUs its claim was
    allocated, and the shared GPU's shares hold what the claims consumed."""
    held, expected = inventory.dra_held, inventory.dra_expected
    used = sum(inventory.dra_shared.values())
    seen = f"{len({k[:2] for k in held})} pods on {len({u for g in held.values() for u in g})} GPUs"
    seen += f"; shares hold {used // 1024} GiB"
    if held != expected:
        missing = sorted(set(expected.items()) - set(held.items()))
        extra = sorted(set(held.items()) - set(expected.items()))
        seen += f"; missing {missing}, unexpected {extra}"
    return Verdict(seen, bool(expected) and held == expected and used == inventory.shared_mib)


def judge_amd(inventory: Inventory) -> Verdict:
    """Right when the inventory lists each AMD pod's container on the GPUs it saw (or was
    allocated)."""
    held, expected = inventory.amd_held, inventory.amd_expected
    seen = f"{len({k[:2] for k in held})} pods on {len({u for g in held.values() for u in g})} GPUs"
    if held != expected:
        missing = sorted(set(expected.items()) - set(held.items()))
        extra = sorted(set(held.items()) - set(expected.items()))
        seen += f"; missing {missing}, unexpected {extra}"
    return Verdict(seen, bool(expected) and held == expected)
