"""The kubelet of a testbed node (testbed/node.py): it registers the Node, then runs every
pod the API server binds to it, over CRI (testbed/kuberuntime.py), as the kubelet's pod
workers do (kubernetes/kubernetes `pkg/kubelet/kubelet.go` SyncPod, `kuberuntime/
kuberuntime_manager.go` SyncPod, "Pod Lifecycle", kubernetes.io/docs/concepts/workloads/
pods/pod-lifecycle/).

Per pod, in order: device plugin resources allocated through the device manager stand-in
(testbed/kubelet.py, its socket in the node's /var/lib/kubelet/device-plugins, capacity and
allocatable reported on the Node) and the pod listed by the pod-resources API
(testbed/podresources.py); volumes set up (testbed/volumes.py; the pod waits while one
cannot be); the sandbox, with the handler of the pod's RuntimeClass; init containers one
at a time, each to a zero exit; then the containers, each with its env and command line
resolved (testbed/podenv.py), its volume mounts, its image's ID, and its probes running
(testbed/probes.py); a pod's ResourceClaims, once allocated, are prepared by the DRA
manager stand-in (testbed/kubelet_dra.py, its registry in the node's /var/lib/kubelet), each
container getting its claims' CDI ids, and unprepared when the pod goes. A container that
exits, or fails its liveness or startup probe, is
stopped and started again as `restartPolicy` says (Always, OnFailure, Never), with the
kubelet's back-off (`backoff` doubling to 5 minutes, reset after 10 minutes running); a
container that asks runAsNonRoot of an image that runs as root does not start
(CreateContainerConfigError), as the kubelet refuses it. Readiness makes the container and
the pod Ready. The pod's status (phase, conditions, IPs, container states and restart
counts) goes to the API server as it changes. A pod marked for deletion is stopped
(containers with their grace period, then the sandbox; a CRI call that fails is made again)
and deleted for good; its devices are freed. Secret, ConfigMap and downward API volumes are
re-projected every `refresh` seconds (the kubelet's sync, about a minute).

Left out: the node's own credentials and the Node authorizer (it writes as the admin),
image pulls (the node has what the test imported), resources and QoS (no cgroup limits),
ephemeral and sidecar containers, lifecycle hooks, pod-level readiness gates, eviction,
static pods, and node heartbeats (the Node stays Ready).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import api_pb2 as dp
from testbed import podenv, probes, volumes
from testbed.apiserver import ApiServer
from testbed.cri import api_pb2 as cri
from testbed.kubelet import Kubelet, KubeletError
from testbed.kubelet_dra import DraKubelet
from testbed.kubelet_dra import KubeletError as DraError
from testbed.kuberuntime import CRIError, KubeRuntime, Sandbox, security_of
from testbed.node import GATEWAY, Node
from testbed.podresources import PodResourcesKubelet

Obj = dict[str, Any]
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_BACKOFF = 300.0
RETRY = 1.0  # a failed kill of a pod tried again (the pod worker's back-off starts at 1 s)
SYNC = 0.25  # how often a pod worker looks at its containers (the kubelet's PLEG: 1 s)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Container:
    """What the pod worker knows of one container of its pod."""

    spec: Obj
    init: bool = False
    id: str = ""
    restarts: int = 0
    started_at: float = 0.0
    ready: bool = False
    done: bool = False  # an init container that exited 0
    waiting: tuple[str, str] = ("ContainerCreating", "")
    terminated: Obj | None = None
    last: Obj | None = None  # lastState.terminated
    retry_at: float = 0.0
    backoff: float = 0.0
    probers: dict[str, probes.Prober] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class PodWorker:
    """One pod on the node, from its admission to its deletion, in a thread of its own."""

    def __init__(self, kubelet: NodeKubelet, pod: Obj) -> None:
        self.kubelet, self.pod = kubelet, pod
        self.uid = pod["metadata"]["uid"]
        self.sandbox: Sandbox | None = None
        self.ip = ""
        spec = pod["spec"]
        self.containers = [Container(c, init=True) for c in spec.get("initContainers") or ()]
        self.containers += [Container(c) for c in spec["containers"]]
        self.answers: dict[str, list[dp.ContainerAllocateResponse]] = {}
        self.cdi: dict[str, list[str]] = {}  # container → its prepared claims' CDI ids
        self.prepared: dict[str, list[tuple[str, str, str]]] = {}  # driver → claims
        self.devices: dict[str, list[tuple[str, list[str]]]] = {}  # container → (resource, ids)
        self.paths: dict[str, str] = {}
        self.phase, self.message, self.reason = "Pending", "", ""
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=self.run, name=f"pod-{pod['metadata']['name']}", daemon=True
        )
        self.last_status: Obj = {}
        self.refreshed = 0.0
        self.leave = False

    # --- the worker's loop

    def run(self) -> None:
        try:
            if self.admit():
                while not self.stopping.is_set():
                    self.sync()
                    self.report()
                    self.stopping.wait(SYNC)
        except Exception as exc:  # a bug here, not in the pod: say so on the pod
            self.phase, self.reason, self.message = "Failed", "TestbedKubeletError", repr(exc)
            self.report()
            raise
        finally:
            self.tear_down()

    def claims(self) -> list[Obj] | None:
        """The pod's ResourceClaims (None: one is not there, or not allocated, yet)."""
        meta = self.pod["metadata"]
        stored = self.kubelet.api.get("pods", meta["name"], meta["namespace"]) or self.pod
        statuses = (stored.get("status") or {}).get("resourceClaimStatuses") or ()
        generated = {s["name"]: s.get("resourceClaimName") for s in statuses}
        found = []
        for entry in self.pod["spec"].get("resourceClaims") or ():
            name = entry.get("resourceClaimName") or generated.get(entry["name"])
            claim = (
                self.kubelet.api.get("resourceclaims", name, meta["namespace"]) if name else None
            )
            if claim is None or not (claim.get("status") or {}).get("allocation"):
                return None
            found.append(claim | {"entry": entry["name"]})
        return found

    def prepare(self) -> bool:
        """The DRA manager's NodePrepareResources for the pod's claims, per driver; the CDI
        ids of each container's claims. False while they cannot be prepared yet."""
        claims = self.claims()
        if claims is None:
            self.wait_all("ContainerCreating", "waiting for the pod's ResourceClaims")
            return False
        by_driver: dict[str, list[tuple[str, str, str]]] = {}
        for claim in claims:
            meta = claim["metadata"]
            for driver in {
                r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]
            }:
                by_driver.setdefault(driver, []).append(
                    (meta["namespace"], meta["name"], meta["uid"])
                )
        try:
            for driver, these in by_driver.items():
                failed = [
                    a.error for a in self.kubelet.dra.prepare(driver, these).values() if a.error
                ]
                if failed:
                    raise KubeletError(failed[0])
        except (KubeletError, DraError, TimeoutError) as exc:  # tried again, as the kubelet does
            self.wait_all("ContainerCreating", f"NodePrepareResources: {exc}")
            return False
        self.prepared = by_driver
        uids = {c["entry"]: c["metadata"]["uid"] for c in claims}
        for container in self.containers:
            for ref in (container.spec.get("resources") or {}).get("claims") or ():
                ids = self.kubelet.dra.cdi_ids(uids[ref["name"]], ref.get("request"))
                self.cdi.setdefault(container.name, []).extend(ids)
        return True

    def admit(self) -> bool:
        """The device manager's allocations; a pod that cannot have them fails."""
        devices = self.kubelet.devices
        meta = self.pod["metadata"]
        self.kubelet.pod_resources.add_pod(
            meta["namespace"], meta["name"], self.uid, [c.name for c in self.containers]
        )
        for container in self.containers:
            limits = (container.spec.get("resources") or {}).get("limits") or {}
            for resource, count in limits.items():
                if "/" not in resource:
                    continue
                try:
                    ids, answer = devices.admit(resource, int(count), self.uid, container.name)
                except (KubeletError, TimeoutError) as exc:
                    self.phase, self.reason = "Failed", "UnexpectedAdmissionError"
                    self.message = f"Allocate failed due to {exc}, which is unexpected"
                    self.report()
                    return False
                self.answers.setdefault(container.name, []).append(answer)
                self.devices.setdefault(container.name, []).append((resource, ids))
        return True

    def sync(self) -> None:
        if self.sandbox is None and not self.set_up():
            return
        now = time.monotonic()
        if now - self.refreshed > self.kubelet.refresh:
            self.refreshed = now
            for volume in self.pod["spec"].get("volumes") or ():
                volumes.refresh(volume, self.pod, self.kubelet.volume_context(), self.resource)
        for container in self.containers:
            if container.init and container.done:
                continue
            if container.id:
                self.watch(container)
            elif now >= container.retry_at:
                self.start(container)
            if container.init and not container.done:
                return  # the next init container, or the containers, wait for it
        running = [c for c in self.containers if not c.init and c.id and c.terminated is None]
        self.phase = "Running" if running else self.phase
        restart = self.pod["spec"].get("restartPolicy", "Always")
        if restart != "Always" and all(c.terminated for c in self.containers if not c.init):
            failed = any(c.terminated and c.terminated["exitCode"] for c in self.containers)
            self.phase = "Failed" if failed else "Succeeded"

    def set_up(self) -> bool:
        """Claims prepared, volumes, then the sandbox; False while one of them cannot be
        (it is retried)."""
        if self.pod["spec"].get("resourceClaims") and not self.prepared and not self.prepare():
            self.stopping.wait(self.kubelet.backoff)
            return False
        try:
            ctx = self.kubelet.volume_context()
            for volume in self.pod["spec"].get("volumes") or ():
                self.paths[volume["name"]] = volumes.set_up(volume, self.pod, ctx, self.resource)
        except volumes.VolumeError as exc:
            self.wait_all("ContainerCreating", f"MountVolume.SetUp failed: {exc}")
            return False
        handler = ""
        name = self.pod["spec"].get("runtimeClassName")
        if name:
            found = self.kubelet.api.get("runtimeclasses", name)
            if found is None:
                self.wait_all("ContainerCreating", f'RuntimeClass "{name}" not found')
                return False
            handler = found["handler"]
        try:
            self.sandbox = self.kubelet.runtime.run_sandbox(self.pod, handler)
        except CRIError as exc:
            self.wait_all("ContainerCreating", f"Failed to create pod sandbox: {exc}")
            self.stopping.wait(self.kubelet.backoff)
            return False
        network = (self.pod["spec"].get("hostNetwork"), self.kubelet.runtime.pod_network)
        self.ip = (
            GATEWAY
            if network[0] or not network[1]
            else (self.kubelet.runtime.sandbox_ip(self.sandbox))
        )
        return True

    def wait_all(self, reason: str, message: str) -> None:
        for container in self.containers:
            if not container.id:
                container.waiting = (reason, message)

    def start(self, container: Container) -> None:
        runtime, kubelet = self.kubelet.runtime, self.kubelet
        assert self.sandbox is not None
        spec = container.spec
        try:
            pod = self.pod | {"status": self.status_now()}
            env = podenv.environment(pod, spec, kubelet.read, kubelet.services, kubelet.allocatable)
            command, args = podenv.command_line(spec, env)
            self.check_user(container)
            mounts = volumes.mounts(spec, self.paths)
        except (podenv.EnvError, volumes.VolumeError, ValueError) as exc:
            container.waiting = ("CreateContainerConfigError", str(exc))
            container.retry_at = time.monotonic() + kubelet.backoff
            return
        except CRIError as exc:  # the image's user unread: the runtime away (restarting)
            container.waiting = ("CreateContainerError", str(exc))
            self.back_off(container)
            return
        resolved = spec | {
            "env": [{"name": k, "value": v} for k, v in env],
            "command": command,
            "args": args,
        }
        answers = self.answers.get(container.name, ())
        for resource, ids in self.devices.get(container.name, ()) if container.restarts else ():
            kubelet.devices.start_container(resource, ids)  # PreStartContainer, each start
        try:
            claims = self.cdi.get(container.name, ())
            cid = runtime.create(
                self.sandbox, self.pod, resolved, answers, claims, mounts, container.restarts
            )
        except CRIError as exc:
            container.waiting = ("CreateContainerError", str(exc))
            self.back_off(container)
            return
        try:
            runtime.start(cid)
        except CRIError as exc:  # created, never started: the next attempt is a new container
            container.waiting = ("RunContainerError", str(exc))
            container.restarts += 1
            with contextlib.suppress(CRIError):
                runtime.remove(cid)
            self.back_off(container)
            return
        if container.last is not None and container.id:
            with contextlib.suppress(CRIError):
                runtime.remove(container.id)
        container.id, container.terminated = cid, None
        container.started_at = time.monotonic()
        container.waiting = ("", "")
        container.probers = probes.probers(spec, container.started_at) if not container.init else {}
        container.ready = not container.init and "readiness" not in container.probers

    def check_user(self, container: Container) -> None:
        """runAsNonRoot: the user the container runs as must not be root (the image's
        user where the pod names none: ImageStatus)."""
        context = security_of(self.pod, container.spec)
        if not context.get("runAsNonRoot"):
            return
        uid = context.get("runAsUser")
        if uid is None:
            image = self.kubelet.runtime.image(container.spec["image"])
            uid = image.uid.value if image.HasField("uid") else None
            if uid is None and image.username:
                raise ValueError(
                    "container has runAsNonRoot and image has non-numeric user "
                    f"({image.username}), cannot verify user is non-root"
                )
        if not uid:
            raise ValueError("container has runAsNonRoot and image will run as root")

    def back_off(self, container: Container) -> None:
        up = time.monotonic() - container.started_at if container.started_at else 0.0
        if up > 600:
            container.backoff = 0.0
        container.backoff = min(MAX_BACKOFF, container.backoff * 2 or self.kubelet.backoff)
        container.retry_at = time.monotonic() + container.backoff

    def watch(self, container: Container) -> None:
        """A started container: its exit, its probes, its restart."""
        runtime = self.kubelet.runtime
        try:
            status = runtime.status(container.id)
        except CRIError:
            return
        if status.state == cri.CONTAINER_EXITED and container.terminated is None:
            self.exited(container, status)
            return
        if container.terminated is not None:
            if time.monotonic() >= container.retry_at and self.restarts(container):
                container.last, container.terminated = container.terminated, None
                container.restarts += 1
                self.start(container)
            return
        if not container.probers:
            return

        def run(cmd: list[str], timeout: int) -> int:
            """An exec probe's exit status; one that cannot run fails (-1), as the kubelet
            counts a probe error."""
            try:
                return int(runtime.exec_sync(container.id, cmd, timeout).exit_code)
            except CRIError:
                return -1

        probes.run_due(container.probers, container.spec, self.ip, self.kubelet.connect, run)
        found = container.probers
        killed = [k for k in ("startup", "liveness") if k in found and found[k].failed]
        if killed:
            grace = int(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            with contextlib.suppress(CRIError, TimeoutError):
                runtime.stop(container.id, grace)
            self.exited(container, runtime.status(container.id), f"{killed[0]} probe failed")
            return
        readiness = found.get("readiness")
        startup = found.get("startup")
        container.ready = (readiness is None or readiness.result) and (
            startup is None or startup.result
        )

    def exited(self, container: Container, status: cri.ContainerStatus, why: str = "") -> None:
        code = status.exit_code
        container.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 and not why else "Error",
            "startedAt": _stamp(status.started_at),
            "finishedAt": _stamp(status.finished_at),
            "containerID": f"containerd://{container.id}",
        } | ({"message": why} if why else {})
        container.ready = False
        if container.init and code == 0:
            container.done = True
            return
        if self.restarts(container):
            self.back_off(container)
        elif container.init:
            self.phase, self.reason = "Failed", "InitContainerFailed"

    def restarts(self, container: Container) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        code = (container.terminated or {}).get("exitCode", 0)
        return (
            policy == "Always"
            or (policy == "OnFailure" and code != 0)
            or (container.init and policy != "Never" and code != 0)
        )

    def resource(self, ref: Obj) -> str:
        containers = {c.name: c.spec for c in self.containers}
        spec = containers.get(ref.get("containerName", ""), self.containers[-1].spec)
        return podenv.resource_value(spec, ref, self.kubelet.allocatable)

    # --- status

    def status_now(self) -> Obj:
        ip = self.ip
        return {
            "hostIP": GATEWAY,
            "hostIPs": [{"ip": GATEWAY}],
            "podIP": ip,
            "podIPs": [{"ip": ip}] if ip else [],
        }

    def report(self) -> None:
        old = self.kubelet.api.get(
            "pods", self.pod["metadata"]["name"], self.pod["metadata"]["namespace"]
        )
        if old is None or old["metadata"]["uid"] != self.uid:
            return
        apps = [c for c in self.containers if not c.init]
        inits = [c for c in self.containers if c.init]
        initialized = all(c.done for c in inits)
        ready = initialized and all(c.ready for c in apps) and self.phase == "Running"
        conditions = [
            c
            for c in (old.get("status") or {}).get("conditions") or ()
            if c["type"] == "PodScheduled"
        ]
        for kind, value in (
            ("PodReadyToStartContainers", self.sandbox is not None),
            ("Initialized", initialized),
            ("ContainersReady", ready),
            ("Ready", ready),
        ):
            conditions.append({"type": kind, "status": "True" if value else "False"})
        status = {
            "phase": self.phase,
            "conditions": conditions,
            **self.status_now(),
            "initContainerStatuses": [self.container_status(c) for c in inits],
            "containerStatuses": [self.container_status(c) for c in apps],
        }
        if self.reason:
            status |= {"reason": self.reason, "message": self.message}
        if status != self.last_status:
            self.last_status = status
            stamped = {**status, "startTime": (old.get("status") or {}).get("startTime", _now())}
            self.kubelet.api.update_status(
                "pods", old["metadata"]["name"], old["metadata"]["namespace"], stamped
            )

    def container_status(self, c: Container) -> Obj:
        if c.terminated is not None:
            state: Obj = {"terminated": c.terminated}
        elif c.id:
            state = {"running": {"startedAt": _now()}}
        else:
            reason, message = c.waiting
            state = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
        found: Obj = {
            "name": c.name,
            "image": c.spec["image"],
            "ready": c.ready,
            "restartCount": c.restarts,
            "state": state,
            "started": bool(c.id) and c.terminated is None,
        }
        if c.id:
            found["containerID"] = f"containerd://{c.id}"
        if c.last is not None:
            found["lastState"] = {"terminated": c.last}
        return found

    # --- deletion

    def stop(self, leave: bool = False) -> None:
        """Stop the pod (its deletion), or with `leave` just the worker: the kubelet going
        away leaves its containers to the node."""
        self.leave = leave
        self.stopping.set()

    def tear_down(self) -> None:
        """Containers stopped with the pod's grace period, the sandbox removed, the devices
        freed; then the pod goes from the API server (grace period 0). A CRI call that fails
        (containerd restarting) is made again, as the kubelet's pod worker retries killing a
        pod: meanwhile the pod stays Terminating, never deleted with its containers left."""
        if self.leave:
            return
        runtime, meta = self.kubelet.runtime, self.pod["metadata"]
        grace = int(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        stored = self.kubelet.api.get("pods", meta["name"], meta["namespace"])
        if stored is not None and stored["metadata"].get("deletionGracePeriodSeconds") is not None:
            grace = int(stored["metadata"]["deletionGracePeriodSeconds"])
        for container in reversed(self.containers):
            if container.id and container.terminated is None:
                self.retried(runtime.stop, container.id, grace)
        if self.sandbox is not None:
            self.retried(runtime.remove_sandbox, self.sandbox)
        if self.leave:
            return
        self.kubelet.devices.remove_pod(self.uid)
        self.kubelet.pod_resources.remove_pod(self.uid)
        for driver, claims in self.prepared.items():
            with contextlib.suppress(KubeletError, TimeoutError):
                self.kubelet.dra.unprepare(driver, claims)
        if stored is not None and stored["metadata"]["uid"] == self.uid:
            with contextlib.suppress(KeyError, ValueError, Exception):
                self.kubelet.api.delete("pods", meta["name"], meta["namespace"], grace_period=0)

    def retried(self, call: Callable[..., None], *args: Any) -> None:
        """`call(*args)` until it succeeds, or what it stops is gone already (NotFound), or
        the kubelet goes (`leave`)."""
        while not self.leave:
            try:
                return call(*args)
            except CRIError as exc:
                if exc.code == grpc.StatusCode.NOT_FOUND:
                    return None
            except TimeoutError:
                pass
            time.sleep(RETRY)
        return None


def _stamp(nanoseconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(nanoseconds / 1e9))


class NodeKubelet:
    """The kubelet of `node`, against `api` (an ApiServer stand-in, secure or not), the
    API server reachable by pods at `api_address`."""

    def __init__(
        self,
        api: ApiServer,
        node: Node,
        api_address: tuple[str, int],
        *,
        labels: dict[str, str] | None = None,
        backoff: float = 10.0,
        refresh: float = 60.0,
    ) -> None:
        self.api, self.node = api, node
        self.name = node.name
        self.backoff, self.refresh = backoff, refresh
        self.services = podenv.kubernetes_service(*api_address)
        self.allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.labels = {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        self.runtime: KubeRuntime = node.kuberuntime()
        self.devices = Kubelet(node.path(DEVICE_PLUGINS))
        self.dra = DraKubelet(node.path("/var/lib/kubelet"), node.name, host=node.path)
        self.pod_resources = PodResourcesKubelet(node.path(POD_RESOURCES), self.devices)
        self.workers: dict[str, PodWorker] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{node.name}", daemon=True)
        self._advertised: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> NodeKubelet:
        self.devices.start()
        self.dra.start()
        self.pod_resources.__enter__()
        self.register()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for worker in list(self.workers.values()):
            worker.stop(leave=True)
        for worker in list(self.workers.values()):
            worker.thread.join(timeout=60)
        self.pod_resources.__exit__()
        self.dra.stop()
        self.devices.stop()
        self.runtime.channel.close()  # the node's end removes the pods

    # --- what pod workers use

    def read(self, resource: str, name: str, namespace: str) -> Obj | None:
        return self.api.get(resource, name, namespace)

    def token(self, pod: Obj, seconds: int, audience: str) -> str:
        """A bound token for the pod's service account (the kubelet's TokenRequest)."""
        meta = pod["metadata"]
        body = {
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            }
        }
        if audience:
            body["spec"]["audiences"] = [audience]
        answer = self.api.request_token(meta["namespace"], pod["spec"]["serviceAccountName"], body)
        return str(answer["status"]["token"])

    def volume_context(self) -> volumes.Context:
        return volumes.Context(self.node.root, self.read, self.token)

    def connect(self, host: str, port: int, timeout: float) -> Any:
        return self.node.connect(host, port, timeout)

    # --- the node and its pods

    def register(self) -> None:
        """The Node object, as the kubelet registers it."""
        status = {
            "capacity": dict(self.allocatable),
            "allocatable": dict(self.allocatable),
            "addresses": [
                {"type": "InternalIP", "address": GATEWAY},
                {"type": "Hostname", "address": self.name},
            ],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": self.node_info(),
        }
        meta = {"name": self.name, "labels": self.labels}
        self.api.put({"apiVersion": "v1", "kind": "Node", "metadata": meta, "status": status})

    def node_info(self) -> dict[str, str]:
        """NodeSystemInfo with every field a kubelet fills (clients' models require them)."""
        ids = Path("/etc/machine-id")
        return {
            "architecture": "amd64",
            "bootID": self.node.cgroup,
            "containerRuntimeVersion": f"containerd://{self.node.generation.version}",
            "kernelVersion": os.uname().release,
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.34.0",
            "machineID": ids.read_text().strip() if ids.exists() else self.node.cgroup,
            "operatingSystem": "linux",
            "osImage": "testbed node",
            "systemUUID": self.node.cgroup,
        }

    def _loop(self) -> None:
        seen = 0
        while not self._stop.is_set():
            seen = self.api.changed(seen, 0.5)
            self._advertise()
            for pod in self.api.objects("pods"):
                if pod["spec"].get("nodeName") != self.name:
                    continue
                uid = pod["metadata"]["uid"]
                worker = self.workers.get(uid)
                if worker is None and not pod["metadata"].get("deletionTimestamp"):
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    worker = self.workers[uid] = PodWorker(self, pod)
                    worker.thread.start()
                elif worker is not None and pod["metadata"].get("deletionTimestamp"):
                    worker.stop()
            live = {p["metadata"]["uid"] for p in self.api.objects("pods")}
            for uid, worker in list(self.workers.items()):
                if uid not in live:
                    worker.stop()
                if not worker.thread.is_alive():
                    del self.workers[uid]

    def _advertise(self) -> None:
        """The device plugins' resources as Node capacity and allocatable."""
        counts = {r: (p.capacity, p.allocatable) for r, p in list(self.devices.plugins.items())}
        if counts == self._advertised:
            return
        self._advertised = counts
        node = self.api.get("nodes", self.name)
        if node is None:
            return
        status = node.setdefault("status", {})
        for resource, (capacity, allocatable) in counts.items():
            status.setdefault("capacity", {})[resource] = str(capacity)
            status.setdefault("allocatable", {})[resource] = str(allocatable)
        self.api.update_status("nodes", self.name, "", status)
