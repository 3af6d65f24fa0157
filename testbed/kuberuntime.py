"""What the kubelet's runtime manager does with a pod bound to its node, over CRI v1 to a
real containerd (kubernetes/kubernetes `pkg/kubelet/kuberuntime`, `kubelet_pods.go`).

Faithful to, per pod: its sandbox found by `ListPodSandbox` on the pod's UID label (a ready
one is the pod's; others are removed and the next runs at the next attempt), else
`RunPodSandbox` with the pod's metadata (name, namespace, UID: from
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
    """A CRI call that failed, with the runtime's own message and its gRPC code."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        super().__init__(message)
        self.code = code


def unconfined() -> cri.SecurityProfile:
    """What the kubelet sends for a pod without a seccomp profile (SeccompDefault off)."""
    return cri.SecurityProfile(profile_type=cri.SecurityProfile.Unconfined)


def seccomp(context: Obj) -> cri.SecurityProfile:
    """The seccomp profile a security context names (`RuntimeDefault`, `Localhost`), else
    unconfined; a privileged container is always unconfined."""
    profile = context.get("seccompProfile") or {}
    kind = profile.get("type", "Unconfined")
    if context.get("privileged") or kind == "Unconfined":
        return unconfined()
    if kind == "RuntimeDefault":
        return cri.SecurityProfile(profile_type=cri.SecurityProfile.RuntimeDefault)
    return cri.SecurityProfile(
        profile_type=cri.SecurityProfile.Localhost, localhost_ref=profile["localhostProfile"]
    )


def namespaces(spec: Obj | None = None, pod_network: bool = False) -> cri.NamespaceOption:
    """The pod's namespaces: with `pod_network`, its own network unless `hostNetwork`, else
    (no CNI to give it one) the host's; the host's PID and IPC namespaces for `hostPID` and
    `hostIPC`, else IPC shared in the pod and a PID namespace per container (the kubelet
    sets CONTAINER explicitly for a pod without shareProcessNamespace)."""
    spec = spec or {}
    own = pod_network and not spec.get("hostNetwork")
    pid = cri.POD if spec.get("shareProcessNamespace") else cri.CONTAINER
    return cri.NamespaceOption(
        network=cri.POD if own else cri.NODE,
        pid=cri.NODE if spec.get("hostPID") else pid,
        ipc=cri.NODE if spec.get("hostIPC") else cri.POD,
    )


def supplemental_groups(context: Obj) -> list[int]:
    """A pod's supplemental groups: its own, then its fsGroup (the kubelet adds it)."""
    fs_group = [context["fsGroup"]] if "fsGroup" in context else []
    return [*context.get("supplementalGroups", []), *fs_group]


def security_of(pod: Obj, spec: Obj) -> Obj:
    """The container's security context over its pod's (the fields both have)."""
    pod_level = {k: v for k, v in (pod["spec"].get("securityContext") or {}).items()
                 if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}  # fmt: skip
    return pod_level | (spec.get("securityContext") or {})


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


def sandbox_config(
    pod: Obj, log_directory: str, cgroup_parent: str, pod_network: bool = False, attempt: int = 0
) -> cri.PodSandboxConfig:
    """`generatePodSandboxConfig` for `pod` (a Kubernetes Pod object), its `attempt`-th
    sandbox. A hostname only for a pod with its own network (`pod_network` and not
    `hostNetwork`), as the kubelet sets it."""
    meta, spec = pod["metadata"], pod["spec"]
    options = namespaces(spec, pod_network)
    context = spec.get("securityContext") or {}
    linux = cri.LinuxSandboxSecurityContext(
        namespace_options=options,
        privileged=any(
            privileged(c) for c in [*spec.get("initContainers", []), *spec["containers"]]
        ),
        seccomp=seccomp(context),
        supplemental_groups=supplemental_groups(context),
    )
    if "runAsUser" in context:
        linux.run_as_user.value = context["runAsUser"]
    if "runAsGroup" in context:
        linux.run_as_group.value = context["runAsGroup"]
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(
            name=meta["name"], uid=meta["uid"], namespace=meta["namespace"], attempt=attempt
        ),
        hostname=meta["name"] if options.network == cri.POD else "",
        log_directory=log_directory,
        labels=pod_labels(pod),
        annotations=meta.get("annotations", {}),
        linux=cri.LinuxPodSandboxConfig(cgroup_parent=cgroup_parent, security_context=linux),
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
    *,
    mounts: Sequence[cri.Mount] = (),
    pod_network: bool = False,
) -> cri.ContainerConfig:
    """`generateContainerConfig` for container `spec` of `pod`: `answers` are the device
    plugins' Allocate answers for it (the kubelet's cached ones), `termination_log` the host
    file the kubelet made for its termination message, `claims` the CDI ids of its prepared
    DRA claims (`resources.claims`), `mounts` its volumes' (after the plugins'), its env and
    args as the kubelet resolved them (`spec`'s literal values)."""
    security = security_of(pod, spec)
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
    linux = cri.LinuxContainerSecurityContext(
        capabilities=cri.Capability(
            add_capabilities=capabilities.get("add", []),
            drop_capabilities=capabilities.get("drop", []),
        ),
        privileged=privileged(spec),
        namespace_options=namespaces(pod["spec"], pod_network),
        readonly_rootfs=bool(security.get("readOnlyRootFilesystem")),
        no_new_privs=escalation is False,
        seccomp=seccomp(security),
        supplemental_groups=supplemental_groups(pod["spec"].get("securityContext") or {}),
    )
    if "runAsUser" in security:
        linux.run_as_user.value = security["runAsUser"]
    if "runAsGroup" in security:
        linux.run_as_group.value = security["runAsGroup"]
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
            *mounts,
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
        linux=cri.LinuxContainerConfig(security_context=linux),
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
    removes every sandbox it ran, as the kubelet removes a deleted pod's.

    On a testbed node (testbed/node.py) the runtime sees another root: `home` is then a
    node path, made here under `root` (where the node's `/` is seen), and pods get their own
    network (`pod_network`: the node has CNI) unless they ask for the host's."""

    def __init__(
        self,
        socket: Path,
        home: Path,
        cgroup_root: str,
        timeout: float = 60,
        *,
        root: Path = Path("/"),
    ) -> None:
        self.home, self.cgroup_root, self.timeout = home, cgroup_root, timeout
        self.root = root
        self.pod_network = root != Path("/")
        self.sandboxes: list[Sandbox] = []
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.images = cri_grpc.ImageServiceStub(self.channel)

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise CRIError(exc.details() or str(exc.code()), exc.code()) from exc

    def version(self) -> cri.VersionResponse:
        answer: cri.VersionResponse = self.call(
            self.runtime.Version, cri.VersionRequest(version="v1")
        )
        return answer

    def run_sandbox(self, pod: Obj, handler: str = "") -> Sandbox:
        """The pod's sandbox with runtime handler `handler` ("" = containerd's default), as
        the kubelet's SyncPod finds or makes it from what the runtime lists for the pod's
        UID: a ready one is the pod's (a RunPodSandbox whose answer was lost, containerd
        restarting, made it); others are stopped and removed (what the kubelet's kill and
        garbage collection do) and a new one is run, its attempt one past theirs (their
        names stay reserved in the runtime until then)."""
        meta = pod["metadata"]
        logs = self.home / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        self.seen(logs).mkdir(parents=True, exist_ok=True)
        cgroup = f"{self.cgroup_root}/pod{meta['uid']}"
        listed = self.call(
            self.runtime.ListPodSandbox,
            cri.ListPodSandboxRequest(
                filter=cri.PodSandboxFilter(label_selector={POD_UID: meta["uid"]})
            ),
        ).items
        for found in listed:
            if found.state == cri.SANDBOX_READY:
                config = sandbox_config(
                    pod, str(logs), cgroup, self.pod_network, found.metadata.attempt
                )
                return self.known(Sandbox(found.id, config))
        for found in listed:
            self.remove_sandbox(Sandbox(found.id, cri.PodSandboxConfig()))
        attempt = max((found.metadata.attempt + 1 for found in listed), default=0)
        config = sandbox_config(pod, str(logs), cgroup, self.pod_network, attempt)
        answer = self.call(
            self.runtime.RunPodSandbox,
            cri.RunPodSandboxRequest(config=config, runtime_handler=handler),
        )
        return self.known(Sandbox(answer.pod_sandbox_id, config))

    def known(self, sandbox: Sandbox) -> Sandbox:
        """`sandbox`, among those `close` removes."""
        if all(s.id != sandbox.id for s in self.sandboxes):
            self.sandboxes.append(sandbox)
        return sandbox

    def image(self, image: str) -> cri.Image:
        """ImageStatus: the image as the runtime has it (it is local: CRIError if not)."""
        answer = self.call(
            self.images.ImageStatus, cri.ImageStatusRequest(image=cri.ImageSpec(image=image))
        )
        if not answer.image.id:
            raise CRIError(f"image {image!r} is not present (the testbed pulls nothing)")
        found: cri.Image = answer.image
        return found

    def image_id(self, image: str) -> str:
        """The ID the kubelet puts in ContainerConfig."""
        return str(self.image(image).id)

    def create(
        self,
        sandbox: Sandbox,
        pod: Obj,
        spec: Obj,
        answers: Sequence[dp.ContainerAllocateResponse] = (),
        claims: Sequence[str] = (),
        mounts: Sequence[cri.Mount] = (),
        restarts: int = 0,
    ) -> str:
        """CreateContainer for container `spec` of `pod` in `sandbox` (`claims`: the CDI ids
        of its prepared DRA claims; `mounts`: its volumes'; `restarts`: its attempt); its ID."""
        directory = self.home / "kubelet-pods" / pod["metadata"]["uid"] / spec["name"]
        self.seen(directory).mkdir(parents=True, exist_ok=True)
        termination = directory / secrets.token_hex(4)
        self.seen(termination).touch()
        config = container_config(
            pod, spec, self.image_id(spec["image"]), answers, str(termination), restarts,
            claims, mounts=mounts, pod_network=self.pod_network,
        )  # fmt: skip
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox.id, config=config, sandbox_config=sandbox.config
        )
        return str(self.call(self.runtime.CreateContainer, request).container_id)

    def seen(self, path: Path) -> Path:
        """Where the runtime's path `path` is from here."""
        return self.root / path.relative_to("/") if path.is_absolute() else path

    def sandbox_ip(self, sandbox: Sandbox) -> str:
        """The pod's address (PodSandboxStatus; "" on the host network)."""
        request = cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id)
        return str(self.call(self.runtime.PodSandboxStatus, request).status.network.ip)

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], timeout: int
    ) -> cri.ExecSyncResponse:
        """ExecSync: run `cmd` in the container, as an exec probe does (timeout in seconds)."""
        request = cri.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=timeout)
        answer: cri.ExecSyncResponse = self.call(self.runtime.ExecSync, request)
        return answer

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
        path = self.seen(Path(self.status(container_id).log_path))
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
        self.sandboxes = [s for s in self.sandboxes if s.id != sandbox.id]

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
