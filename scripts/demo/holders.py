"""The last scene: who holds which GPU once the scenarios' pods run, as `gpuwire inventory` sees it.

The device plugin's holders job (the node agent) merges the shim's container records and the
kubelet's pod-resources API into the Node's `gpuwire.io/holders` annotation; `gpuwire
inventory` reads the Nodes and pods from the API server and prints the table. The scene waits
until the annotation names every container that holds GPUs, with the GPUs the container saw
(where containers run) or was allocated (where they do not), then runs the command.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwire import holders
from gpuwire.devices import Device
from scripts.demo.base import GPUWIRE, Step, until
from scripts.demo.cluster import Cluster
from scripts.demo.scenarios import Outcome, Verdict, gpus
from testbed.host import LabError

Key = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class Inventory:
    expected: Mapping[Key, tuple[str, ...]]  # who should hold which GPUs (UUIDs)
    published: holders.NodeHolders  # what the node agent published
    step: Step  # the `gpuwire inventory` command
    table: str  # what it printed

    @property
    def held(self) -> dict[Key, tuple[str, ...]]:
        return {h.key: h.gpus for h in self.published.holders}

    @property
    def conflicts(self) -> list[holders.Conflict]:
        return holders.conflicts(self.published)


def expected_holders(
    outcomes: Sequence[Outcome], devices: Sequence[Device]
) -> dict[Key, tuple[str, ...]]:
    """Each container that holds GPUs: those it saw if it ran, else those it was allocated."""
    by_minor = {d.minor: d.uuid for d in devices}
    out = {}
    for outcome in outcomes:
        if outcome.pod is None:
            continue
        meta = outcome.pod["metadata"]
        for started in outcome.containers:
            if started.seen is not None:
                held = tuple(by_minor[m] for m in gpus(started.seen))
            else:
                held = tuple(d for a in started.allocations for d in a.devices)
            if held:
                out[(meta["namespace"], meta["name"], started.name)] = tuple(sorted(held))
    return out


def published(cluster: Cluster) -> holders.NodeHolders:
    value = cluster.node()["metadata"].get("annotations", {}).get(holders.ANNOTATION)
    return holders.decode(value) if value else holders.NodeHolders((), (), False)


def take(cluster: Cluster, outcomes: Sequence[Outcome]) -> Inventory:
    """Wait (a few of the agent's rounds at most) for the holders to be published, then
    `gpuwire inventory`."""
    expected = expected_holders(outcomes, cluster.devices)

    def current() -> dict[Key, tuple[str, ...]]:
        return {h.key: h.gpus for h in published(cluster).holders}

    with contextlib.suppress(LabError):  # the verdict shows the difference
        until(lambda: current() == expected, "the node agent to publish the holders", 15)
    argv = (GPUWIRE, "inventory", "--kubeconfig", str(cluster.kubeconfig))
    out = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    step = Step("who holds which GPU", argv)
    return Inventory(expected, published(cluster), step, out.stdout + out.stderr)


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
