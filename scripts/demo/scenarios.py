"""The demo's scenarios: a pod each, played through the whole system, and what came of it.

`play` takes a pod from submission to the containers' exit and returns every step's result
as data; each scenario's `judge` reads that data and says what was seen and whether it is
what the scenario expects. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwire import nvidia
from gpuwire.devices import Device
from scripts.demo import amd, dra
from scripts.demo.cluster import Cluster
from scripts.demo.controlplane import Admission, create, review
from scripts.demo.kubelet import Started, run_pod

PODS = Path(__file__).resolve().parent / "pods"


@dataclass(frozen=True)
class Verdict:
    seen: str
    ok: bool | None  # None: not checked (the containers did not run)


@dataclass(frozen=True)
class Outcome:
    """A pod's way through the system."""

    admission: Admission
    pod: dict[str, Any] | None = None  # as stored; None when denied
    pending: str = ""  # why the scheduler did not bind it
    containers: tuple[Started, ...] = ()
    claims: tuple[dict[str, Any], ...] = ()  # its ResourceClaims, as the scheduler left them


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    pod: Path
    expected: str
    judge: Callable[[Outcome, Sequence[Device]], Verdict]  # what was seen, and is it right
    dra: bool = False  # played on the DRA node (scripts/demo/dra.py), judged by its GPUs

    def load(self) -> dict[str, Any]:
        pod: dict[str, Any] = yaml.safe_load(self.pod.read_text())
        return pod


def play(
    cluster: Cluster,
    scenario: Scenario,
    dra_node: dra.DraNode | None = None,
    amd_node: amd.AmdNode | None = None,
) -> Outcome:
    """Submit the scenario's pod; if admitted, store and schedule it; if bound, run it (on
    the DRA node or the AMD node where the scheduler bound it there)."""
    admission = review(cluster, scenario.load())
    if not admission.allowed:
        return Outcome(admission)
    pod, pending = create(cluster, admission)
    claims = tuple(claim for _, claim in dra.claims_of(cluster, pod))
    if pending:
        return Outcome(admission, pod, pending, claims=claims)
    if dra_node is not None and pod["spec"]["nodeName"] == dra.NODE:
        containers = dra.run_pod(cluster, dra_node, pod)
    elif amd_node is not None and pod["spec"]["nodeName"] == amd.NODE:
        containers = run_pod(cluster, pod, amd_node.host)
    else:
        containers = run_pod(cluster, pod)
    return Outcome(admission, pod, containers=containers, claims=claims)


# --- reading what a container saw


def gpus(seen: Mapping[str, list[str]]) -> tuple[int, ...]:
    """The GPU device nodes in the container's /dev, by minor."""
    names = seen.get("devices", [""])[0].split()
    return tuple(sorted(int(n[6:]) for n in names if n[6:].isdigit()))


def capabilities(seen: Mapping[str, list[str]]) -> tuple[str, ...]:
    """The driver capabilities whose libraries the container has."""
    libs = {name.split(".so")[0] + ".so" for name in seen.get("lib", [])}
    return tuple(sorted(c for c, names in nvidia.LIBRARIES.items() if libs & set(names)))


def variables(seen: Mapping[str, list[str]]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in seen.get("var", []))


def listed(seen: Mapping[str, list[str]]) -> int:
    """How many GPUs the fake nvidia-smi -L listed."""
    return sum(line.startswith("GPU ") for line in seen.get("smi", []))


def ran(outcome: Outcome) -> Started | Verdict:
    """The pod's one container, once it has run; otherwise the verdict on why it did not
    (not checked when containers cannot run here)."""
    admission = outcome.admission
    if not admission.allowed:
        return Verdict(f"denied ({admission.code}): {admission.message}", False)
    if outcome.pending:
        return Verdict(f"Pending: {outcome.pending}", False)
    if len(outcome.containers) != 1:
        return Verdict(f"{len(outcome.containers)} containers, expected 1", False)
    started = outcome.containers[0]
    if started.seen is None:
        if started.handler is None:
            return Verdict("not run", None)
        return Verdict(f"failed: {started.error}", False)
    return started


Judge = Callable[[Outcome, Sequence[Device]], Verdict]
View = Mapping[str, list[str]]


def on_view(judge: Callable[[Started, View, Sequence[Device]], Verdict]) -> Judge:
    """A judge of what the pod's one container saw, given that it ran (else `ran`'s verdict)."""

    def judged(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
        started = ran(outcome)
        if isinstance(started, Verdict):
            return started
        return judge(started, started.seen or {}, devices)

    return judged


def _numbers(found: Sequence[int]) -> str:
    return ",".join(map(str, found)) or "none"


@on_view
def judge_all(started: Started, seen: View, devices: Sequence[Device]) -> Verdict:
    found, caps = gpus(seen), capabilities(seen)
    every = found == tuple(d.minor for d in devices) and listed(seen) == len(devices)
    return Verdict(f"GPUs {_numbers(found)}; {', '.join(caps)} files", every and "video" in caps)


def _plugin_allocation(
    outcome: Outcome, devices: Sequence[Device]
) -> tuple[Started, list[Device], bool] | Verdict:
    """The one container's plugin allocation, its devices, and whether two are linked (NVLink
    or XGMI); the verdict instead where nothing was allocated."""
    started = outcome.containers[0] if len(outcome.containers) == 1 else None
    if started is None or not started.allocations:
        verdict = ran(outcome)
        return verdict if isinstance(verdict, Verdict) else Verdict("no allocation", False)
    by_uuid = {d.uuid: d for d in devices}
    chosen = [by_uuid[i] for i in started.allocations[0].devices]
    linked = len(chosen) == 2 and any(peer == chosen[1].index for peer, _ in chosen[0].nvlinks)
    return started, chosen, linked


def judge_pair(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
    """Judged on the allocation where the container cannot run."""
    allocated = _plugin_allocation(outcome, devices)
    if isinstance(allocated, Verdict):
        return allocated
    started, chosen, linked = allocated
    pair = f"GPUs {_numbers([d.index for d in chosen])}" + (" (NVLink)" if linked else "")
    if started.seen is None:
        return Verdict(f"allocated {pair}; not run", None if linked else False)
    found = gpus(started.seen)
    sees = found == tuple(d.minor for d in chosen) and listed(started.seen) == 2
    return Verdict(f"allocated {pair}; sees GPUs {_numbers(found)}", linked and sees)


def judge_denied(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
    admission = outcome.admission
    if admission.allowed:
        return Verdict("admitted", False)
    names = sorted({nvidia.gfd_product(d.product) for d in devices})  # as the labels say
    ok = admission.code == 400 and all(n in admission.message for n in names)
    return Verdict(f"denied ({admission.code}): {admission.message.rpartition('; ')[2]}", ok)


@on_view
def judge_no_gpu(started: Started, seen: View, devices: Sequence[Device]) -> Verdict:
    found = gpus(seen)
    refused = any(": no GPU: " in line for line in started.runtime_log)
    why = "gpuwire-runtime refused: no grant" if refused else "gpuwire-runtime was not asked"
    return Verdict(f"GPUs {_numbers(found)}; {why}", not found and listed(seen) == 0)


@on_view
def judge_mps(started: Started, seen: View, devices: Sequence[Device]) -> Verdict:
    env = variables(seen)
    wanted = {  # a quarter of the node's GPU, and of its SMs
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={devices[0].memory_mib // 4}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    got = {k: env.get(k, "unset") for k in wanted}
    joined = "control" in seen.get("mps", [])  # its GPU's MPS control daemon's pipes
    text = f"GPUs {_numbers(gpus(seen))}; " + ", ".join(f"{k}={v}" for k, v in got.items())
    text += "; joined to its GPU's MPS control daemon" if joined else "; no MPS daemon"
    return Verdict(text, got == wanted and len(gpus(seen)) == 1 and joined)


SCENARIOS = (
    Scenario(
        "all-gpus",
        "A daemonset-style pod takes every GPU of its node, and the video libraries",
        PODS / "all-gpus.yaml",
        "every GPU, video libraries",
        judge_all,
    ),
    Scenario(
        "two-gpus",
        "Two GPUs through the device plugin: an NVLink pair",
        PODS / "two-gpus.yaml",
        "an NVLink pair",
        judge_pair,
    ),
    Scenario(
        "h100",
        "An H100 on a node of A100s",
        PODS / "h100.yaml",
        "denied, listing the models",
        judge_denied,
    ),
    Scenario(
        "baked-in",
        "An image that bakes in NVIDIA_VISIBLE_DEVICES=all, in a pod that asks for no GPU",
        PODS / "baked-in-all.yaml",
        "no GPU",
        judge_no_gpu,
    ),
    Scenario(
        "kube-system",
        "The same image where the webhook does not look (kube-system): no grant",
        PODS / "baked-in-all-kube-system.yaml",
        "no GPU",
        judge_no_gpu,
    ),
    Scenario(
        "mps",
        "A quarter of a GPU through MPS",
        PODS / "mps-limits.yaml",
        "1 GPU, 25 % MPS limits, held by its GPU's MPS daemon",
        judge_mps,
    ),
)


# --- the DRA node's scenes


def _minors(outcome: Outcome) -> tuple[int, ...]:
    return tuple(sorted(int(name.removeprefix("gpu-")) for name in dra.allocated(outcome.claims)))


def _allocated(outcome: Outcome) -> Started | Verdict:
    """The pod's one container once the scheduler allocated its claim; else why not."""
    admission = outcome.admission
    if not admission.allowed:
        return Verdict(f"denied ({admission.code}): {admission.message}", False)
    if outcome.pending:
        return Verdict(f"Pending: {outcome.pending}", False)
    if len(outcome.containers) != 1 or not outcome.claims:
        return Verdict(f"{len(outcome.containers)} containers, {len(outcome.claims)} claims", False)
    return outcome.containers[0]


def judge_linked(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
    """Two GPUs of one NVLink island, of at least 40 GiB, allocated and seen."""
    started = _allocated(outcome)
    if isinstance(started, Verdict):
        return started
    minors = _minors(outcome)
    chosen = [d for d in devices if d.minor in minors]
    linked = len(chosen) == 2 and any(p == chosen[1].index for p, _ in chosen[0].nvlinks)
    big = all(d.memory_mib >= 40 * 1024 for d in chosen)
    pair = f"GPUs {_numbers(minors)}" + (" (NVLink)" if linked else "")
    if started.seen is None:
        if started.handler is None and not started.error.startswith("NodePrepare"):
            return Verdict(f"allocated {pair}; not run", None if linked and big else False)
        return Verdict(f"allocated {pair}; failed: {started.error}", False)
    found = gpus(started.seen)
    sees = found == minors and listed(started.seen) == 2
    return Verdict(f"allocated {pair}; sees GPUs {_numbers(found)}", linked and big and sees)


def judge_share(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
    """30 GiB of the shared GPU, held by HAMi-core's limit in the container."""
    started = _allocated(outcome)
    if isinstance(started, Verdict):
        return started
    shared = devices[dra.SHARED]
    (result,) = [r for c in outcome.claims for r in c["status"]["allocation"]["devices"]["results"]]
    consumed = (result.get("consumedCapacity") or {}).get("memory", "")
    on_it = result["device"] == f"gpu-{shared.minor}" and consumed == "30Gi"
    share = f"{consumed or 'no'} share of GPU {result['device'].removeprefix('gpu-')}"
    if started.seen is None:
        if started.handler is None and not started.error.startswith("NodePrepare"):
            return Verdict(f"allocated a {share}; not run", None if on_it else False)
        return Verdict(f"allocated a {share}; failed: {started.error}", False)
    limit = variables(started.seen).get("CUDA_DEVICE_MEMORY_LIMIT", "unset")
    sees = gpus(started.seen) == (shared.minor,)
    seen = f"a {share}; sees GPUs {_numbers(gpus(started.seen))}, CUDA_DEVICE_MEMORY_LIMIT={limit}"
    return Verdict(seen, on_it and sees and limit == "30720m")


def judge_waiting(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
    """Pending, with the scheduler's reason, its claim left unallocated."""
    if not outcome.admission.allowed:
        return Verdict(f"denied ({outcome.admission.code}): {outcome.admission.message}", False)
    if not outcome.pending:
        return Verdict(f"bound to {outcome.pod and outcome.pod['spec'].get('nodeName')}", False)
    unallocated = not dra.allocated(outcome.claims)
    return Verdict(f"Pending: {outcome.pending}", unallocated and CANNOT in outcome.pending)


CANNOT = "cannot allocate all claims"  # the scheduler's DynamicResources filter's reason

DRA_SCENARIOS = (
    Scenario(
        "dra-linked",
        "DRA: 2 GPUs on one NVLink island, A100 or H100, at least 40 GiB each",
        PODS / "dra-linked.yaml",
        "an NVLink pair of H100s",
        judge_linked,
        dra=True,
    ),
    Scenario(
        "dra-share-a",
        "DRA: 30 GiB of an H100, a share of its shared GPU",
        PODS / "dra-share-a.yaml",
        "30 GiB of GPU 3, held",
        judge_share,
        dra=True,
    ),
    Scenario(
        "dra-share-b",
        "DRA: another 30 GiB beside it, on the same GPU",
        PODS / "dra-share-b.yaml",
        "30 GiB of GPU 3, held",
        judge_share,
        dra=True,
    ),
    Scenario(
        "dra-share-c",
        "DRA: a third 30 GiB, which that GPU no longer has",
        PODS / "dra-share-c.yaml",
        "Pending, the scheduler's reason",
        judge_waiting,
        dra=True,
    ),
)


# --- the AMD node's scenes


def render_nodes(seen: Mapping[str, list[str]]) -> tuple[int, ...]:
    """The render nodes in an AMD container's /dev/dri, by minor."""
    names = seen.get("dri", [""])[0].split()
    return tuple(sorted(int(n[7:]) for n in names if n.startswith("renderD")))


def seen_minors(seen: Mapping[str, list[str]]) -> tuple[int, ...]:
    """The GPU device nodes a container saw, by minor: render nodes in an AMD container."""
    return render_nodes(seen) if "dri" in seen else gpus(seen)


def _amd_seen(seen: View) -> str:
    kfd = ", /dev/kfd" if "open /dev/kfd" in seen else ", no /dev/kfd"
    return "sees " + (" ".join(f"renderD{m}" for m in render_nodes(seen)) or "no GPU") + kfd


def _amd_sees(seen: View, chosen: Sequence[Device]) -> bool:
    return render_nodes(seen) == tuple(sorted(d.minor for d in chosen)) and "open /dev/kfd" in seen


def judge_amd_plugin(count: int) -> Judge:
    """`count` MI300X from AMD's device plugin (one XGMI hive for two), allocated and seen;
    judged on the allocation where the container cannot run."""

    def judged(outcome: Outcome, devices: Sequence[Device]) -> Verdict:
        allocated = _plugin_allocation(outcome, devices)
        if isinstance(allocated, Verdict):
            return allocated
        started, chosen, hive = allocated
        right = len(chosen) == count and all("MI300X" in d.product for d in chosen)
        right = right and (hive or count == 1)
        got = f"GPUs {_numbers([d.index for d in chosen])}" + (" (one XGMI hive)" * hive)
        if started.seen is None:
            return Verdict(f"allocated {got}; not run", None if right else False)
        sees = _amd_sees(started.seen, chosen)
        return Verdict(f"allocated {got}; {_amd_seen(started.seen)}", right and sees)

    return judged


@on_view
def judge_amd_all(started: Started, seen: View, devices: Sequence[Device]) -> Verdict:
    return Verdict(_amd_seen(seen), _amd_sees(seen, devices))


AMD_SCENARIOS = (
    Scenario(
        "amd-mi300x",
        "AMD: an MI300X by annotation, in a cluster of NVIDIA and AMD nodes",
        PODS / "amd-mi300x.yaml",
        "1 MI300X, its render node and /dev/kfd",
        judge_amd_plugin(1),
    ),
    Scenario(
        "amd-xgmi-pair",
        "AMD: two MI300X, a pair of one XGMI hive",
        PODS / "amd-xgmi-pair.yaml",
        "one XGMI hive's pair",
        judge_amd_plugin(2),
    ),
    Scenario(
        "amd-all-gpus",
        "AMD: a daemonset-style pod takes every GPU of the AMD node",
        PODS / "amd-all-gpus.yaml",
        "every render node, /dev/kfd",
        judge_amd_all,
    ),
)
