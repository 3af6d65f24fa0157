"""What the GPU inventory costs, each figure against a baseline measured in the same run.

    .venv/bin/python -m bench.inventory [--runs N] [--nodes N]

- On container start (the shim and the hook): building and writing a container record,
  against writing the same bytes atomically by hand (the floor of any record on disk).
- The node agent's pass: sweeping and reading 100 records of running containers and merging
  them with pod-resources for 8 GPUs into the annotation, against only reading those files.
- `gpuwire inventory` on a large cluster (`--nodes`, 8 GPUs each, one holder per GPU):
  building and rendering the table, against parsing the API's node list JSON, which the
  command pays anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Summary, report, summarise, timed
from gpuwire import holders, records, sim
from gpuwire.holders import Assignment, Holder, NodeHolders
from inventory import cli

ANNOTATIONS = {
    "io.kubernetes.cri.sandbox-namespace": "team-a",
    "io.kubernetes.cri.sandbox-name": "trainer-0",
    "io.kubernetes.cri.sandbox-uid": "0d5d2c2a-1111-4b4b-8c8c-123456789abc",
    "io.kubernetes.cri.container-name": "main",
}


def measure(name: str, runs: int, work: Callable[[], object]) -> Summary:
    return summarise(name, timed(work, runs))


def container_start(runs: int, tmp: Path) -> str:
    gpus = [d.uuid for d in sim.make_machine(gpus=2).devices]
    record = records.started(
        "c" * 64, ANNOTATIONS, gpus, path=records.PLUGIN_LESS, whole_node=False,
        capabilities=["compute", "utility"], pid=os.getpid(),
    )  # fmt: skip
    data = records.encode(record).encode()

    def by_hand() -> None:
        path = tmp / "plain"
        fd = os.open(tmp / "plain.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        os.close(fd)
        os.replace(tmp / "plain.tmp", path)

    def recorded() -> None:
        made = records.started(
            "c" * 64, ANNOTATIONS, gpus, path=records.PLUGIN_LESS, whole_node=False,
            capabilities=["compute", "utility"], pid=os.getpid(),
        )  # fmt: skip
        records.write(str(tmp / "records"), made)

    baseline = measure("atomic write of the bytes", runs, by_hand)
    return report(
        "record on container start", baseline, [measure("records.started+write", runs, recorded)]
    )


def agent_pass(runs: int, tmp: Path) -> str:
    devices = sim.make_machine(gpus=8).devices
    root = tmp / "agent"
    for i in range(100):
        gpu = devices[i % 8].uuid
        made = records.started(
            f"c{i:03d}", ANNOTATIONS | {"io.kubernetes.cri.sandbox-name": f"pod-{i}"}, [gpu],
            path=records.PLUGIN_LESS, whole_node=False, capabilities=["compute"], pid=os.getpid(),
        )  # fmt: skip
        records.write(str(root), made)
    assignments = [
        Assignment("team-b", f"job-{i}", "main", "nvidia.com/gpu", (devices[i].uuid,))
        for i in range(4)
    ]
    allocatable = [("nvidia.com/gpu", tuple(d.uuid for d in devices))]

    def read_only() -> None:
        for name in os.listdir(root):
            (root / name).read_bytes()

    def full_pass() -> None:
        live, _ = records.sweep(str(root), 60.0, time.time())
        holders.encode(holders.node_holders(devices, live, assignments, allocatable))

    baseline = measure("read 100 record files", runs, read_only)
    return report(
        "node agent pass (100 records)", baseline, [measure("sweep+merge+encode", runs, full_pass)]
    )


def cluster(nodes: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    devices = sim.make_machine(gpus=8).devices
    objs: list[dict[str, object]] = []
    for n in range(nodes):
        gpus = [
            {"index": d.index, "uuid": f"{d.uuid}-{n}", "product": d.product,
             "memory_mib": d.memory_mib, "healthy": True}
            for d in devices
        ]  # fmt: skip
        held = tuple(
            Holder(
                f"team-{n % 7}", f"pod-{n}-{g['index']}", "main", records.PLUGIN, (str(g["uuid"]),)
            )
            for g in gpus
        )
        annotations = {
            "gpuwire.io/gpus": json.dumps(gpus),
            holders.ANNOTATION: holders.encode(NodeHolders(held, (), True)),
        }
        objs.append({"metadata": {"name": f"gpu-node-{n:04d}", "annotations": annotations}})
    return objs, []


def rendering(runs: int, nodes: int) -> str:
    objs, pods = cluster(nodes)
    listed = json.dumps({"kind": "NodeList", "items": objs})
    baseline = measure(f"json.loads of {nodes} nodes", runs, lambda: json.loads(listed))
    table = measure("build + render the table", runs, lambda: cli.report(objs, pods))
    as_json = measure("build + render -o json", runs, lambda: cli.report(objs, pods, output="json"))
    return report(f"gpuwire inventory, {nodes} nodes × 8 GPUs", baseline, [table, as_json])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inventory")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(container_start(args.runs, Path(tmp)), end="\n\n")
        print(agent_pass(max(args.runs // 10, 5), Path(tmp)), end="\n\n")
    print(rendering(max(args.runs // 20, 3), args.nodes))


if __name__ == "__main__":
    main()
