"""Device plugin speed on a simulated 8-GPU node with 16 time-slicing replicas per GPU
(128 device IDs), the plugin running as `gpuwire device-plugin serve` in its own process and
driven over its unix socket, as the kubelet does.

Figures (each a ratio to the baseline, an empty unary gRPC call on the same socket):
- Allocate for one replica and for eight GPUs (checks, token written and MAC'd, answer);
- GetPreferredAllocation over all 128 IDs;
- health: from a fault appended to the node's event file to the ListAndWatch snapshot that
  shows the GPU Unhealthy;
- kubelet restart: from the new `kubelet.sock` to the plugin's new registration.

    .venv/bin/python -m bench.deviceplugin [--calls N]
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from bench.common import Summary, report, summarise, timed
from deviceplugin.api import api_pb2, api_pb2_grpc
from gpuwire import sim
from testbed.kubelet import Kubelet

RESOURCE = "nvidia.com/gpu"
GPUS, REPLICAS = 8, 16


def start_plugin(tmp: Path, root: Path, kubelet_dir: Path) -> subprocess.Popen[str]:
    keys = tmp / "keys"
    keys.mkdir()
    (keys / "key-1").write_text("bench secret")
    argv = [
        sys.executable, "-m", "gpuwire.cli", "device-plugin", "serve",
        "--sim", str(root), "--kubelet-dir", str(kubelet_dir),
        "--replicas", str(REPLICAS), "--recover-after", "0.05",
        "--allocation-dir", str(tmp / "alloc"), "--grant-key-dir", str(keys),
        "--sweep-interval", "3600", "--log-level", "ERROR",
    ]  # fmt: skip
    return subprocess.Popen(argv, text=True)


def health_latency(root: Path, stub: Any, uuids: list[str], n: int) -> list[float]:
    """Fault → first snapshot with that GPU Unhealthy; waits for recovery between faults."""
    snapshots: queue.Queue[tuple[float, dict[str, str]]] = queue.Queue()
    stream = stub.ListAndWatch(api_pb2.Empty())

    def read() -> None:
        try:
            for response in stream:
                health = {d.ID.split("::")[0]: d.health for d in response.devices}
                snapshots.put((time.perf_counter(), health))
        except grpc.RpcError:
            pass

    threading.Thread(target=read, daemon=True).start()
    snapshots.get(timeout=10)
    samples = []
    for i in range(n):
        uuid = uuids[i % len(uuids)]
        start = time.perf_counter()
        sim.inject_fault(root, uuid, 79)
        while True:
            at, health = snapshots.get(timeout=10)
            if health[uuid] == "Unhealthy":
                samples.append(at - start)
                break
        while snapshots.get(timeout=10)[1][uuid] != "Healthy":
            pass
    stream.cancel()
    return samples


def restart_latency(kubelet: Kubelet, n: int) -> list[float]:
    """From a kubelet restart (sockets deleted, `kubelet.sock` anew) to the registration."""
    samples = []
    for _ in range(n):
        registered = functools.partial(_at_least, kubelet, len(kubelet.registrations) + 1)
        start = time.perf_counter()
        kubelet.restart()
        kubelet.wait(registered)
        samples.append(time.perf_counter() - start)
    return samples


def _at_least(kubelet: Kubelet, registrations: int) -> bool:
    return len(kubelet.registrations) >= registrations


def measure(stub: Any, kubelet: Kubelet, root: Path, uuids: list[str], calls: int) -> list[Summary]:
    """The baseline first, then each figure."""
    ids = [f"{u}::{r}" for u in uuids for r in range(REPLICAS)]
    empty = api_pb2.Empty()
    timed(lambda: stub.GetDevicePluginOptions(empty), 200)  # warm up
    one = iter(ids * (calls // len(ids) + 1))
    eight = [f"{u}::0" for u in uuids]
    ask = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=4)
        ]
    )
    return [
        summarise("empty unary call", timed(lambda: stub.GetDevicePluginOptions(empty), calls)),
        summarise(
            "Allocate, 1 replica", timed(lambda: stub.Allocate(_allocate([next(one)])), calls)
        ),
        summarise("Allocate, 8 GPUs", timed(lambda: stub.Allocate(_allocate(eight)), calls)),
        summarise(
            "GetPreferredAllocation, 4/128",
            timed(lambda: stub.GetPreferredAllocation(ask), calls // 10),
        ),
        summarise("fault → Unhealthy snapshot", health_latency(root, stub, uuids, 50)),
        summarise("kubelet restart → registered", restart_latency(kubelet, 20)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as name:
        tmp = Path(name)
        root = tmp / "node"
        machine = sim.make_machine(gpus=GPUS, nvlink="mesh")
        sim.write_node(root, machine)
        kubelet_dir = tmp / "dp"
        with Kubelet(kubelet_dir) as kubelet:
            plugin = start_plugin(tmp, root, kubelet_dir)
            try:
                endpoint = kubelet.plugin(RESOURCE, timeout=60).endpoint
                with grpc.insecure_channel(f"unix://{kubelet_dir / endpoint}") as channel:
                    stub = api_pb2_grpc.DevicePluginStub(channel)
                    uuids = [d.uuid for d in machine.devices]
                    baseline, *figures = measure(stub, kubelet, root, uuids, args.calls)
            finally:
                plugin.terminate()
                plugin.wait(timeout=30)
    title = f"device plugin: {GPUS} GPUs × {REPLICAS} replicas, plugin in its own process"
    print(report(f"{title} ({os.cpu_count()} CPUs)", baseline, figures))
    return 0


def _allocate(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )


if __name__ == "__main__":
    sys.exit(main())
