"""gpuwire installed, upgraded and uninstalled on a testbed cluster while pods run on its node
(issue 23: none of them may be disturbed), and what each of those steps did.

A `Watch` is taken when a step begins, over the pods the step must leave alone; `done` says
the step's wall time, how often containerd restarted meanwhile (the node's systemd stand-in
counts `systemctl restart containerd`), and which of those pods it disturbed. A pod is
disturbed when its container or restart count changed or it stopped being Ready
(`running_as`): a container restarted, killed or recreated. tests/system/test_upgrade.py
asserts the story of docs/install.md with these; bench/install.py prints them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.admission import Rejection
from testbed.apiserver import StatusError
from testbed.cluster import Cluster, up
from testbed.containerds import Generation
from testbed.image import NAME as BUSYBOX
from testbed.image import write_layout_tar
from testbed.install import NAMESPACE, UNINSTALLER, Install, running_as, wait, workload
from testbed.kuberuntime import CRIError

Obj = dict[str, Any]
GPU_NODE = {"nvidia.com/gpu.present": "true"}  # what the DaemonSets' node affinity asks
PODS = "ml"  # the workloads' namespace
WEBHOOK = "gpuwire"  # the MutatingWebhookConfiguration (deploy/base)
UPGRADE_TO = "0.2.0"  # the version an upgrade goes to (pyproject's is the one installed)
WAITING = "waiting: containers still run with gpuwire's runtime"  # deploy/node/install-node
TASKS = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"


@contextlib.contextmanager
def gpu_cluster(
    generation: Generation, images: Iterable[Path], namespaces: Iterable[str] = (PODS,)
) -> Iterator[Cluster]:
    """A cluster of one GPU node holding `images` and busybox, with `namespaces`."""
    with tempfile.TemporaryDirectory(prefix="gpuwire-busybox-") as tmp:
        busybox = write_layout_tar(Path(tmp) / "busybox.tar")
        with up(generation, images=[*images, busybox], labels=GPU_NODE) as made:
            for namespace in namespaces:
                made.api.put(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                )
            yield made


def runtime_ready(cluster: Cluster) -> bool:
    """The node agent labelled the node ready for GPU pods (the RuntimeClass waits for it)."""
    found = cluster.api.get("nodes", cluster.node.name) or {}
    return (found["metadata"].get("labels") or {}).get("gpuwire.io/runtime-ready") == "true"


def install(setup: Install, timeout: float = 300) -> None:
    """`kubectl apply -k`, rolled out, and the node ready for GPU pods."""
    setup.apply()
    setup.wait_ready(timeout)
    wait(setup.cluster, "runtime-ready", lambda: runtime_ready(setup.cluster), NAMESPACE, 60)


def upgrade(setup: Install, image: str, timeout: float = 300) -> None:
    """`kubectl apply -k` with the next image (the overlay's newTag changed), rolled out."""
    setup.apply(image=image)
    setup.wait_ready(timeout)


def sleeper(name: str, gpus: int = 0) -> Obj:
    """A busybox pod that sleeps until SIGTERM and then exits 0 (a clean stop); with `gpus`,
    as many of the device plugin's, listed first (`nvidia-smi -L`)."""
    script = "trap 'exit 0' TERM; sleep 3600 & wait"
    if not gpus:
        return workload(name, PODS, BUSYBOX, ["sh", "-c", script])
    command = ["sh", "-c", f"nvidia-smi -L; {script}"]
    return workload(name, PODS, BUSYBOX, command, limits={"nvidia.com/gpu": gpus})


def pod(cluster: Cluster, name: str) -> Obj | None:
    return cluster.api.get("pods", name, PODS)


def start(cluster: Cluster, made: Obj, timeout: float = 120) -> tuple[str, int]:
    """Create the pod; its `running_as` once it runs."""
    name = made["metadata"]["name"]
    cluster.api.create(made)
    wait(cluster, f"pod {name} running", lambda: running_as(pod(cluster, name)) is not None,
         PODS, timeout)  # fmt: skip
    found = running_as(pod(cluster, name))
    assert found is not None
    return found


def stop(cluster: Cluster, name: str, timeout: float = 120) -> None:
    """`kubectl delete pod`, until the kubelet has stopped it and it is gone."""
    cluster.api.delete("pods", name, PODS)
    wait(cluster, f"pod {name} gone", lambda: pod(cluster, name) is None, PODS, timeout)


def logs(cluster: Cluster, name: str, container: str, namespace: str = PODS) -> str:
    """What a container of a pod has written (its log, as `kubectl logs -c` shows it)."""
    found = cluster.api.get("pods", name, namespace) or {}
    status = found.get("status") or {}
    statuses = [*status.get("initContainerStatuses", ()), *status.get("containerStatuses", ())]
    ids = [s["containerID"] for s in statuses if s["name"] == container and s.get("containerID")]
    return cluster.kubelet.runtime.logs(ids[0].removeprefix("containerd://")) if ids else ""


def task_options(cluster: Cluster, container_id: str) -> str:
    """The runtime options containerd keeps for a running container (BinaryName in them)."""
    cid = container_id.removeprefix("containerd://")
    return cluster.node.path(f"{TASKS}/{cid}/options.json").read_text()


def left_in_containerd(cluster: Cluster, container_id: str) -> list[str]:
    """What containerd still holds of a container (`containerd://<id>`): its record, its
    task, its task directory. Nothing, for a container its runtime stopped and deleted."""
    cid = container_id.removeprefix("containerd://")
    node = cluster.node
    left = [f"{what} {cid}" for what in ("containers", "tasks")
            if cid in node.ctr(what, "ls", "-q").stdout.split()]  # fmt: skip
    if node.path(f"{TASKS}/{cid}").exists():
        left.append(f"{TASKS}/{cid}")
    return left


def versions(cluster: Cluster) -> list[str]:
    """The versions of gpuwire's files on the node's host (`current` is a link to one)."""
    tree = cluster.node.path("/opt/gpuwire")
    return sorted(n for n in os.listdir(tree) if not n.startswith(".") and n != "current")


def current(cluster: Cluster) -> str:
    return os.readlink(cluster.node.path("/opt/gpuwire/current"))


def uninstall(setup: Install, watch: Watch, gpu_pods: Iterable[str], timeout: float = 300) -> None:
    """docs/install.md's uninstall with GPU pods still running: the uninstaller gives
    containerd its configuration back (one restart), then waits while containers run with
    gpuwire's runtime, saying so; the GPU pods are deleted then, as its log asks, and it
    finishes. The watch notes how the GPU pods ran just before their deletion."""
    cluster = setup.cluster
    setup.remove(timeout)
    setup.start_uninstaller()

    def waiting() -> bool:
        with contextlib.suppress(CRIError):  # containerd restarting: its logs are not read now
            return WAITING in uninstaller_log(setup)
        return False

    wait(cluster, "the uninstaller waiting for the GPU pods", waiting, UNINSTALLER, timeout)
    for name in gpu_pods:
        watch.release(name)
        stop(cluster, name, timeout)
    setup.finish_uninstall(timeout)


def uninstaller_log(setup: Install) -> str:
    return "".join(logs(setup.cluster, p["metadata"]["name"], "uninstall", UNINSTALLER)
                   for p in setup.uninstaller())  # fmt: skip


@dataclass(frozen=True)
class Step:
    """What one step (install, upgrade, uninstall) did."""

    name: str
    seconds: float
    containerd_restarts: int
    gpu_pods: int  # watched
    gpu_disturbed: tuple[str, ...]
    other_pods: int
    other_disturbed: tuple[str, ...]


class Watch:
    """The pods (of PODS) a step must leave alone, as they run when it begins."""

    def __init__(self, cluster: Cluster, gpu: Iterable[str] = (), other: Iterable[str] = ()):
        self.cluster = cluster
        self.gpu, self.other = tuple(gpu), tuple(other)
        self.before = {name: self.running(name) for name in (*self.gpu, *self.other)}
        self.released: dict[str, tuple[str, int] | None] = {}
        self.restarts = cluster.node.containerd_restarts
        self.began = time.monotonic()

    def running(self, name: str) -> tuple[str, int] | None:
        return running_as(pod(self.cluster, name))

    def release(self, name: str) -> None:
        """The pod as it runs now counts for the step: it is deleted before the step ends."""
        self.released[name] = self.running(name)

    def disturbed(self, names: tuple[str, ...]) -> tuple[str, ...]:
        now = {n: self.released[n] if n in self.released else self.running(n) for n in names}
        return tuple(n for n in names if self.before[n] is None or now[n] != self.before[n])

    def done(self, name: str) -> Step:
        return Step(
            name,
            time.monotonic() - self.began,
            self.cluster.node.containerd_restarts - self.restarts,
            len(self.gpu),
            self.disturbed(self.gpu),
            len(self.other),
            self.disturbed(self.other),
        )


@dataclass(frozen=True)
class Early:
    """What a GPU pod created during an install went through until it ran."""

    refused: int  # creates the API server refused (the webhook not serving yet)
    admitted_before_ready: bool  # created while the node was not ready for GPU pods
    bound_before_ready: tuple[str, ...]  # nodes it was bound to while not ready (none)
    failures: tuple[str, ...]  # what its containers waited on that says a start failed


class EarlyPod:
    """A GPU pod created as soon as the API server takes it once an install began (the
    webhook's configuration is there: a pod before it is no GPU pod of gpuwire's), as a
    controller creates one: a create the webhook refused (not serving yet) is tried again.
    Watched until it runs, it says whether the scheduler held it back until the node was
    ready (the RuntimeClass's nodeSelector on gpuwire.io/runtime-ready) and whether any of
    its starts failed on the way (`no runtime for "gpuwire"`, a sandbox that failed)."""

    FAILED = ("Failed to create pod sandbox", "CreateContainerError", "RunContainerError")

    def __init__(self, cluster: Cluster, made: Obj) -> None:
        self.cluster, self.made = cluster, made
        self.refused, self.admitted_before_ready = 0, False
        self.bound: set[str] = set()
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="early-pod", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        name = self.made["metadata"]["name"]
        api = self.cluster.api
        while api.get("mutatingwebhookconfigurations", WEBHOOK) is None:
            if self.stopping.wait(0.05):
                return
        while not self.stopping.is_set():
            ready_now = runtime_ready(self.cluster)
            try:
                self.cluster.api.create(self.made)
            except (Rejection, StatusError):  # the admin's create, refused by admission
                self.refused += 1
                self.stopping.wait(0.2)
                continue
            self.admitted_before_ready = not ready_now
            break
        while not self.stopping.is_set():
            ready_now, found = runtime_ready(self.cluster), pod(self.cluster, name)
            if found is None:
                return
            node = found["spec"].get("nodeName")
            if node and not ready_now:
                self.bound.add(node)
            for state in (found.get("status") or {}).get("containerStatuses") or ():
                waiting = (state.get("state") or {}).get("waiting") or {}
                said = f"{waiting.get('reason', '')}: {waiting.get('message', '')}"
                if any(f in said for f in self.FAILED) and said not in self.failures:
                    self.failures.append(said)
            if running_as(found) is not None:
                return
            self.stopping.wait(0.2)

    def result(self, timeout: float = 120) -> Early:
        """Once it runs (or `timeout`: then as it was)."""
        self.thread.join(timeout)
        self.stopping.set()
        self.thread.join()
        return Early(
            self.refused, self.admitted_before_ready, tuple(sorted(self.bound)),
            tuple(self.failures),
        )  # fmt: skip
