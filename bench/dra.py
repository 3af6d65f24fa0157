"""DRA plugin speed on a simulated node of 8 GPUs and a ninth in MIG mode (a 1g.10gb and a
3g.40gb), the plugin running as `gpuwire dra serve` in its own process, driven over its
DRA socket as the kubelet drives it, against the API stand-in (in this process) for its
claims and slices.

Figures (each a ratio to the baseline, an empty NodePrepareResources on the same socket):
- NodePrepareResources of a new claim with 1 GPU, with 8 GPUs and with 1 MIG device (the
  claim read from the API, checked, the driver discovered, its CDI spec and the checkpoint
  written), and of a claim prepared already (answered from the checkpoint);
- NodeUnprepareResources (spec removed, checkpoint written);
- a prepared shared claim reserved for one more pod (its `status.reservedFor`, as the
  scheduler writes it at PreBind) → its token, signed again by the plugin, binds that pod
  (the kubelet calls no plugin for a claim it prepared: the plugin watches the claim);
- health: from a fault appended to the node's event file to the ResourceSlice in the API
  server carrying the device's taint (and back, after recovery, untimed);
- MIG change: from a MIG device created on the node (as `gpuwire sim mig` makes it) to the
  ResourceSlice in the API server listing it (then destroyed, untimed), made at a random
  moment: the plugin looks at procfs's instances every second (LOOK), so this figure is
  mostly that wait, by design.

    .venv/bin/python -m bench.dra [--calls N]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from bench.common import Summary, report, summarise, timed, wait_for
from deviceplugin.api import dra_v1_pb2, dra_v1_pb2_grpc
from deviceplugin.gpus.discovery import LOOK
from gpuwire import claimtoken, sim
from gpuwire.dra import DRIVER
from testbed.apiserver import ApiServer
from testbed.kubelet_dra import DraKubelet
from testbed.lab import write_keys
from testbed.waiting import until

GPUS = 8
MIG_GPU = GPUS  # the ninth GPU, in MIG mode
NODE = "bench-node"


def start_plugin(tmp: Path, root: Path, kubeconfig: Path) -> subprocess.Popen[str]:
    write_keys(tmp / "keys")  # the claims' tokens are signed with them
    argv = [
        sys.executable, "-m", "gpuwire.cli", "dra", "serve",
        "--sim", str(root), "--kubelet-root", str(tmp / "kubelet"),
        "--cdi-dir", str(tmp / "cdi"), "--hook", "/usr/local/bin/gpuwire-hook",
        "--allocation-dir", str(tmp / "allocations"), "--grant-key-dir", str(tmp / "keys"),
        "--recover-after", "0.2", "--node", NODE, "--kubeconfig", str(kubeconfig),
        "--log-level", "ERROR",
    ]  # fmt: skip
    return subprocess.Popen(argv, text=True)


def claim(api: ApiServer, devices: list[str]) -> Any:
    """A new claim allocated to `devices`, and the kubelet's message naming it."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    kind = "mig.gpu.gpuwire.io" if "-mig-" in devices[0] else "gpu.gpuwire.io"
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": kind, "count": len(devices)}}]}}  # fmt: skip
    stored = api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec,
        "status": {"allocation": {"devices": {"results": results}}},
    })  # fmt: skip
    return dra_v1_pb2.Claim(namespace="default", name=name, uid=stored["metadata"]["uid"])


def prepare_and_unprepare(stub: Any, api: ApiServer, devices: list[str], n: int) -> tuple[
    list[float], list[float]
]:  # fmt: skip
    """New claims, each prepared (timed) and unprepared (timed)."""
    prepare, unprepare = [], []
    for _ in range(n):
        c = claim(api, devices)
        start = time.perf_counter()
        answer = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[c]))
        prepare.append(time.perf_counter() - start)
        assert not answer.claims[c.uid].error, answer.claims[c.uid].error
        start = time.perf_counter()
        stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[c]))
        unprepare.append(time.perf_counter() - start)
    return prepare, unprepare


def rebind_latency(stub: Any, api: ApiServer, allocations: Path, n: int) -> list[float]:
    """A prepared claim reserved for a new pod → its token names that pod (after one untimed
    round: the plugin's watch of the claim is up)."""
    c = claim(api, ["gpu-6"])
    assert not stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[c])).claims[c.uid].error  # fmt: skip
    token = Path(claimtoken.path(str(allocations), c.uid))
    samples = []
    for _ in range(n + 1):
        pod = str(uuid.uuid4())
        stored = api.get("resourceclaims", c.name, "default")
        assert stored is not None
        stored["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod}]
        start = time.perf_counter()
        api.put(stored)
        wait_for(lambda p=pod: p in token.read_text(), f"token for {pod}")  # type: ignore[misc]
        samples.append(time.perf_counter() - start)
    return samples[1:]


def published(api: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in api.objects("resourceslices") for d in s["spec"]["devices"]}


def tainted(api: ApiServer, device: str) -> bool:
    return bool(published(api).get(device, {}).get("taints"))


def taint_latency(api: ApiServer, root: Path, machine: sim.Machine, n: int) -> list[float]:
    """Fault → the slice in the API server has the device's taint; then wait for recovery."""
    samples = []
    for i in range(n):
        gpu = machine.devices[i % GPUS]
        name = f"gpu-{gpu.minor}"
        start = time.perf_counter()
        sim.inject_fault(root, gpu.uuid, 79)
        wait_for(lambda name=name: tainted(api, name), f"{name} tainted")  # type: ignore[misc]
        samples.append(time.perf_counter() - start)
        until(lambda name=name: not tainted(api, name), timeout=30)  # type: ignore[misc]
    return samples


def mig_latency(api: ApiServer, root: Path, machine: sim.Machine, n: int) -> list[float]:
    """A MIG device created → the slice in the API server lists it; then it is destroyed."""
    samples = []
    for _ in range(n):
        before = set(published(api))
        time.sleep(random.uniform(0, LOOK))  # at any moment of the plugin's look, not just after
        made = sim.create_mig(machine, MIG_GPU, "1g.10gb")
        sim.write_node(root, made)  # the node's files written whole: then procfs shows it
        start = time.perf_counter()
        wait_for(lambda b=before: set(published(api)) - b, "a new MIG device")  # type: ignore[misc]
        samples.append(time.perf_counter() - start)
        (gi,) = {m.gi for m in made.gpus[MIG_GPU].mig or ()} - {
            m.gi for m in machine.gpus[MIG_GPU].mig or ()
        }
        machine = sim.destroy_mig(made, MIG_GPU, gi)
        sim.write_node(root, machine)
        until(lambda before=before: set(published(api)) == before, timeout=30)  # type: ignore[misc]
    return samples


def measure(
    stub: Any, api: ApiServer, tmp: Path, root: Path, machine: sim.Machine, calls: int
) -> list[Summary]:
    empty = dra_v1_pb2.NodePrepareResourcesRequest()
    timed(lambda: stub.NodePrepareResources(empty), 200)  # warm up
    baseline = summarise("empty NodePrepareResources", timed(
        lambda: stub.NodePrepareResources(empty), calls))  # fmt: skip
    one_p, one_u = prepare_and_unprepare(stub, api, ["gpu-3"], calls)
    all_p, _ = prepare_and_unprepare(stub, api, [f"gpu-{i}" for i in range(GPUS)], calls // 2)
    mig_p, _ = prepare_and_unprepare(stub, api, [f"gpu-{MIG_GPU}-mig-1g10gb-19-0"], calls)
    kept = claim(api, ["gpu-5"])
    again = dra_v1_pb2.NodePrepareResourcesRequest(claims=[kept])
    stub.NodePrepareResources(again)
    rebound = rebind_latency(stub, api, tmp / "allocations", 100)
    return [
        baseline,
        summarise("prepare, new claim, 1 GPU", one_p),
        summarise(f"prepare, new claim, {GPUS} GPUs", all_p),
        summarise("prepare, new claim, 1 MIG", mig_p),
        summarise(
            "prepare, prepared claim", timed(lambda: stub.NodePrepareResources(again), calls)
        ),
        summarise("unprepare, 1 GPU", one_u),
        summarise("reservedFor → token rebound", rebound),
        summarise("fault → taint in the API", taint_latency(api, root, machine, 30)),
        summarise("MIG change → slice in API", mig_latency(api, root, machine, 20)),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as name:
        tmp = Path(name)
        root = tmp / "node"
        machine = sim.make_machine(gpus=GPUS + 1, nvlink="mesh")
        machine = sim.with_mig(machine, MIG_GPU, ("1g.10gb", "3g.40gb"))
        sim.write_node(root, machine)
        with ApiServer() as api:
            api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
            with DraKubelet(tmp / "kubelet", NODE) as kubelet:
                plugin = start_plugin(tmp, root, kubeconfig)
                try:
                    endpoint = kubelet.wait_registered(DRIVER, timeout=60).endpoint
                    until(lambda: bool(api.objects("resourceslices")))
                    with grpc.insecure_channel(f"unix:{endpoint}") as channel:
                        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
                        baseline, *figures = measure(stub, api, tmp, root, machine, args.calls)
                finally:
                    plugin.terminate()
                    plugin.wait(timeout=30)
    title = (
        f"DRA plugin: {GPUS} GPUs and one in MIG mode, plugin in its own process "
        f"({os.cpu_count()} CPUs)"
    )
    print(report(title, baseline, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
