"""What the kubelet's runtime manager does with a pod bound to its node, over CRI v1 to a
real containerd (kubernetes/kubernetes `pkg/kubelet/kuberuntime`, `kubelet_pods.go`).

Faithful to, per pod: `RunPodSandbox` with the pod's metadata (name, namespace, UID: from
them containerd's CRI plugin itself writes the `io.kubernetes.cri.sandbox-*` annotations that
gpuwire's runtime trusts), its labels and annotations, a log directory
`<ns>_<name>_<uid>`, a cgroup parent `…/pod<uid>` and the runtime handler of the pod's
RuntimeClass; per container, in order: `ImageStatus` (the image ID), `CreateContainer` with
the sandbox config sent again (containerd takes the sandbox-* values from it), then
`StartContainer`. The `ContainerConfig` is built as `generateContainerConfig` builds it: the
device plugins' Allocate answers first (envs, mounts, devices, CDI devices, annotations, in
that order; the CDI ids of the container's prepared DRA claims before the plugins' CDI
devices, in field 17 only, as from 1.31), then the pod's env; the termination-log file
mounted last; the kubelet's own labels and annotations over the plugins'; log path
`<container>/<restarts>.log`, read back in the CRI log format. Stopping is `StopPodSandbox`
then `RemovePodSandbox`, which stop and remove the pod's containers.

Left out: pod networking (every pod is on the host network, `NamespaceMode.NODE`: there is
no CNI here, and with it containerd needs none), volumes (and the kubelet's /etc/hosts),
`$(VAR)` expansion, `valueFrom`/`envFrom` and service-link env, image pulls (the testbed
imports its images), resources and QoS (cgroup limits, oom_score_adj), probes, restarts,
init containers, the default masked and read-only /proc paths (containerd keeps its own).
"""

from __future__ import annotations

import json
import secrets
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import api_pb2 as dp
from testbed.cri import api_pb2 as cri
from testbed.cri import api_pb2_grpc as cri_grpc
from testbed.waiting import until

Obj = dict[str, Any]

POD_NAME, POD_NAMESPACE, POD_UID = (
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
)
CONTAINER_NAME = "io.kubernetes.container.name"
TERMINATION_LOG = "/dev/termination-log"  # the default terminationMessagePath
GRACE_PERIOD = 30  # terminationGracePeriodSeconds' default


class CRIError(RuntimeError):
    """A CRI call that failed, with the runtime's own message."""


def unconfined() -> cri.SecurityProfile:
    """What the kubelet sends for a pod without a seccomp profile (SeccompDefault off)."""
    return cri.SecurityProfile(profile_type=cri.SecurityProfile.Unconfined)


def namespaces() -> cri.NamespaceOption:
    """The host network; IPC shared in the pod; a PID namespace per container (the kubelet
    sets CONTAINER explicitly for a pod without shareProcessNamespace)."""
    return cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)


def pod_labels(pod: Obj) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        **meta.get("labels", {}),
        POD_NAME: meta["name"],
        POD_NAMESPACE: meta["namespace"],
        POD_UID: meta["uid"],
    }


def privileged(spec: Obj) -> bool:
    return bool((spec.get("securityContext") or {}).get("privileged"))


def sandbox_config(pod: Obj, log_directory: str, cgroup_parent: str) -> cri.PodSandboxConfig:
    """`generatePodSandboxConfig` for `pod` (a Kubernetes Pod object), on the host network:
    so no hostname (the kubelet sets one only for pods with their own network)."""
    meta = pod["metadata"]
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(
            name=meta["name"], uid=meta["uid"], namespace=meta["namespace"], attempt=0
        ),
        log_directory=log_directory,
        labels=pod_labels(pod),
        annotations=meta.get("annotations", {}),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=namespaces(),
                privileged=any(privileged(c) for c in pod["spec"]["containers"]),
                seccomp=unconfined(),
            ),
        ),
    )


def spec_hash(spec: Obj) -> str:
    """`io.kubernetes.container.hash`: a hash of the container's spec (the kubelet's is
    FNV-32a over its Go struct; any stable hash serves the runtime equally)."""
    return format(zlib.crc32(json.dumps(spec, sort_keys=True).encode()), "x")


def container_config(
    pod: Obj,
    spec: Obj,
    image_id: str,
    answers: Sequence[dp.ContainerAllocateResponse],
    termination_log: str,
    restarts: int = 0,
    claims: Sequence[str] = (),
) -> cri.ContainerConfig:
    """`generateContainerConfig` for container `spec` of `pod`: `answers` are the device
    plugins' Allocate answers for it (the kubelet's cached ones), `termination_log` the host
    file the kubelet made for its termination message, `claims` the CDI ids of its prepared
    DRA claims (`resources.claims`)."""
    security = spec.get("securityContext") or {}
    capabilities = security.get("capabilities") or {}
    escalation = security.get("allowPrivilegeEscalation")
    annotations: dict[str, str] = {}
    for answer in answers:
        annotations |= answer.annotations
    annotations |= {
        "io.kubernetes.container.hash": spec_hash(spec),
        "io.kubernetes.container.restartCount": str(restarts),
        "io.kubernetes.container.terminationMessagePath": TERMINATION_LOG,
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": str(
            pod["spec"].get("terminationGracePeriodSeconds", GRACE_PERIOD)
        ),
    }
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=spec["name"], attempt=restarts),
        image=cri.ImageSpec(image=image_id, user_specified_image=spec["image"]),
        command=spec.get("command", []),
        args=spec.get("args", []),
        working_dir=spec.get("workingDir", ""),
        envs=[
            *(cri.KeyValue(key=k, value=v) for a in answers for k, v in a.envs.items()),
            *(cri.KeyValue(key=e["name"], value=e.get("value", "")) for e in spec.get("env", [])),
        ],
        mounts=[
            *(
                cri.Mount(
                    container_path=m.container_path, host_path=m.host_path, readonly=m.read_only
                )
                for a in answers
                for m in a.mounts
            ),
            cri.Mount(container_path=TERMINATION_LOG, host_path=termination_log),
        ],
        devices=[
            cri.Device(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for a in answers
            for d in a.devices
        ],
        CDI_devices=[
            *(cri.CDIDevice(name=name) for name in claims),
            *(cri.CDIDevice(name=d.name) for a in answers for d in a.cdi_devices),
        ],
        labels={
            **{k: pod_labels(pod)[k] for k in (POD_NAME, POD_NAMESPACE, POD_UID)},
            CONTAINER_NAME: spec["name"],
        },
        annotations=annotations,
        log_path=f"{spec['name']}/{restarts}.log",
        linux=cri.LinuxContainerConfig(
            security_context=cri.LinuxContainerSecurityContext(
                capabilities=cri.Capability(
                    add_capabilities=capabilities.get("add", []),
                    drop_capabilities=capabilities.get("drop", []),
                ),
                privileged=privileged(spec),
                namespace_options=namespaces(),
                readonly_rootfs=bool(security.get("readOnlyRootFilesystem")),
                no_new_privs=escalation is False,
                seccomp=unconfined(),
            )
        ),
    )


def log_text(raw: str) -> str:
    """What a container wrote, from its CRI log file: lines `<time> <stream> <P|F> <text>`,
    where P marks a partial line that the next one continues (kubernetes/cri-api
    `pkg/apis/runtime/v1` log format; kubelet `kuberuntime/logs`)."""
    out: list[str] = []
    for line in raw.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


@dataclass(frozen=True)
class Sandbox:
    """A pod's sandbox: its ID and the config the kubelet resends with each container."""

    id: str
    config: cri.PodSandboxConfig


class KubeRuntime:
    """A kubelet's runtime manager on a CRI socket. Its files (pod log directories,
    termination-log files) live under `home`; pod cgroups under `cgroup_root`; `close`
    removes every sandbox it ran, as the kubelet removes a deleted pod's."""

    def __init__(self, socket: Path, home: Path, cgroup_root: str, timeout: float = 60) -> None:
        self.home, self.cgroup_root, self.timeout = home, cgroup_root, timeout
        self.sandboxes: list[Sandbox] = []
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.images = cri_grpc.ImageServiceStub(self.channel)

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise CRIError(exc.details() or str(exc.code())) from exc

    def version(self) -> cri.VersionResponse:
        answer: cri.VersionResponse = self.call(
            self.runtime.Version, cri.VersionRequest(version="v1")
        )
        return answer

    def run_sandbox(self, pod: Obj, handler: str = "") -> Sandbox:
        """RunPodSandbox for `pod` with runtime handler `handler` ("" = containerd's default)."""
        meta = pod["metadata"]
        logs = self.home / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        logs.mkdir(parents=True, exist_ok=True)
        config = sandbox_config(pod, str(logs), f"{self.cgroup_root}/pod{meta['uid']}")
        answer = self.call(
            self.runtime.RunPodSandbox,
            cri.RunPodSandboxRequest(config=config, runtime_handler=handler),
        )
        sandbox = Sandbox(answer.pod_sandbox_id, config)
        self.sandboxes.append(sandbox)
        return sandbox

    def image_id(self, image: str) -> str:
        """ImageStatus: the ID the kubelet puts in ContainerConfig (the image is local)."""
        answer = self.call(
            self.images.ImageStatus, cri.ImageStatusRequest(image=cri.ImageSpec(image=image))
        )
        if not answer.image.id:
            raise CRIError(f"image {image!r} is not present (the testbed pulls nothing)")
        return str(answer.image.id)

    def create(
        self,
        sandbox: Sandbox,
        pod: Obj,
        spec: Obj,
        answers: Sequence[dp.ContainerAllocateResponse] = (),
        claims: Sequence[str] = (),
    ) -> str:
        """CreateContainer for container `spec` of `pod` in `sandbox` (`claims`: the CDI ids
        of its prepared DRA claims); its ID."""
        directory = self.home / "kubelet-pods" / pod["metadata"]["uid"] / spec["name"]
        directory.mkdir(parents=True, exist_ok=True)
        termination = directory / secrets.token_hex(4)
        termination.touch()
        config = container_config(
            pod, spec, self.image_id(spec["image"]), answers, str(termination), claims=claims
        )
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox.id, config=config, sandbox_config=sandbox.config
        )
        return str(self.call(self.runtime.CreateContainer, request).container_id)

    def start(self, container_id: str) -> None:
        self.call(self.runtime.StartContainer, cri.StartContainerRequest(container_id=container_id))

    def status(self, container_id: str) -> cri.ContainerStatus:
        request = cri.ContainerStatusRequest(container_id=container_id)
        status: cri.ContainerStatus = self.call(self.runtime.ContainerStatus, request).status
        return status

    def spec(self, container_id: str) -> Obj:
        """The OCI spec containerd made for the container (ContainerStatus, verbose)."""
        request = cri.ContainerStatusRequest(container_id=container_id, verbose=True)
        info = json.loads(self.call(self.runtime.ContainerStatus, request).info["info"])
        spec: Obj = info["runtimeSpec"]
        return spec

    def logs(self, container_id: str) -> str:
        path = Path(self.status(container_id).log_path)
        return log_text(path.read_text()) if path.exists() else ""

    def exited(self, container_id: str, timeout: float = 30) -> cri.ContainerStatus:
        """The container's status once it has exited (TimeoutError after `timeout`)."""
        until(lambda: self.status(container_id).state == cri.CONTAINER_EXITED, timeout)
        return self.status(container_id)

    def stop(self, container_id: str, grace: int = 0) -> None:
        """StopContainer: SIGTERM, then SIGKILL after `grace` seconds (0: at once); returns
        once the runtime reports it exited, as the kubelet reads it back."""
        request = cri.StopContainerRequest(container_id=container_id, timeout=grace)
        self.call(self.runtime.StopContainer, request)
        self.exited(container_id, timeout=grace + 30)

    def remove(self, container_id: str) -> None:
        self.call(
            self.runtime.RemoveContainer, cri.RemoveContainerRequest(container_id=container_id)
        )

    def remove_sandbox(self, sandbox: Sandbox) -> None:
        """StopPodSandbox, then RemovePodSandbox (which removes its containers)."""
        self.call(self.runtime.StopPodSandbox, cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))
        self.call(
            self.runtime.RemovePodSandbox, cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id)
        )
        self.sandboxes.remove(sandbox)

    def close(self) -> None:
        try:
            for sandbox in list(self.sandboxes):
                self.remove_sandbox(sandbox)
        finally:
            self.channel.close()

    def __enter__(self) -> KubeRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_pod(
    runtime: KubeRuntime,
    pod: Obj,
    handler: str = "",
    answers: Mapping[str, Sequence[dp.ContainerAllocateResponse]] | None = None,
    claims: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Sandbox, list[str]]:
    """A pod's sandbox, then each container created and started in order (`answers`: the
    Allocate answers per container name, `claims`: its prepared claims' CDI ids); the
    sandbox and the container IDs."""
    sandbox = runtime.run_sandbox(pod, handler)
    ids = []
    for spec in pod["spec"]["containers"]:
        name = spec["name"]
        cid = runtime.create(
            sandbox, pod, spec, (answers or {}).get(name, ()), (claims or {}).get(name, ())
        )
        runtime.start(cid)
        ids.append(cid)
    return sandbox, ids
