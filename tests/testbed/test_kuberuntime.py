"""testbed/kuberuntime.py: a pod and the device plugins' Allocate answers become the CRI
requests the kubelet sends (kubernetes/kubernetes pkg/kubelet/kuberuntime), and the CRI
subset carries the field numbers of the published cri-api definition."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.api import api_pb2 as dp
from testbed.cri import api_pb2 as cri
from testbed.kuberuntime import TERMINATION_LOG, container_config, log_text, sandbox_config

UID = "4fe556a4-0bd7-45be-966f-46e2cbf4c4ac"


def pod(**container: Any) -> dict[str, Any]:
    spec = {"name": "trainer", "image": "docker.io/gpuwire/demo:latest", **container}
    return {
        "metadata": {"name": "p", "namespace": "team-a", "uid": UID,
                     "labels": {"app": "x"}, "annotations": {"gpuwire.io/gpu-count": "1"}},
        "spec": {"containers": [spec]},
    }  # fmt: skip


def answer(n: int) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": f"GPU-{n}", f"FROM_{n}": "yes"},
        mounts=[dp.Mount(container_path=f"/run/a{n}", host_path=f"/var/a{n}", read_only=True)],
        devices=[
            dp.DeviceSpec(
                container_path=f"/dev/nvidia{n}", host_path=f"/dev/nvidia{n}", permissions="rw"
            )
        ],
        annotations={"plugin": str(n), "io.kubernetes.container.restartCount": "99"},
        cdi_devices=[dp.CDIDevice(name=f"nvidia.com/gpu=GPU-{n}")],
    )


def config(obj: dict[str, Any], *answers: dp.ContainerAllocateResponse) -> cri.ContainerConfig:
    spec = obj["spec"]["containers"][0]
    return container_config(obj, spec, "sha256:abc", answers, "/var/lib/kubelet/t/0")


def test_allocate_answers_come_first_then_the_pod() -> None:
    obj = pod(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "B", "value": "2"}]
    )
    got = config(obj, answer(0), answer(1))
    envs = [(e.key, e.value) for e in got.envs]
    # an answer's envs are a map (no order within it, in protobuf as in the kubelet's Go)
    assert set(envs[:2]) == {("NVIDIA_VISIBLE_DEVICES", "GPU-0"), ("FROM_0", "yes")}
    assert set(envs[2:4]) == {("NVIDIA_VISIBLE_DEVICES", "GPU-1"), ("FROM_1", "yes")}
    assert envs[4:] == [("NVIDIA_VISIBLE_DEVICES", "void"), ("B", "2")]
    assert [(m.container_path, m.host_path, m.readonly) for m in got.mounts] == [
        ("/run/a0", "/var/a0", True), ("/run/a1", "/var/a1", True),
        (TERMINATION_LOG, "/var/lib/kubelet/t/0", False),
    ]  # fmt: skip
    assert [(d.container_path, d.permissions) for d in got.devices] == [
        ("/dev/nvidia0", "rw"),
        ("/dev/nvidia1", "rw"),
    ]
    assert [d.name for d in got.CDI_devices] == ["nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1"]


def test_the_kubelets_own_annotations_and_labels_win() -> None:
    got = config(pod(), answer(0))
    assert got.annotations["plugin"] == "0"
    assert got.annotations["io.kubernetes.container.restartCount"] == "0"
    assert got.annotations["io.kubernetes.container.terminationMessagePath"] == TERMINATION_LOG
    assert not [k for k in got.annotations if k.startswith("io.kubernetes.cri.")]  # containerd's
    assert dict(got.labels) == {
        "io.kubernetes.pod.name": "p", "io.kubernetes.pod.namespace": "team-a",
        "io.kubernetes.pod.uid": UID, "io.kubernetes.container.name": "trainer",
    }  # fmt: skip
    assert (got.metadata.name, got.log_path) == ("trainer", "trainer/0.log")
    assert (got.image.image, got.image.user_specified_image) == (
        "sha256:abc", "docker.io/gpuwire/demo:latest"
    )  # fmt: skip


def test_security_context() -> None:
    capabilities = {"add": ["SYS_ADMIN"], "drop": ["ALL"]}
    context = {"privileged": True, "allowPrivilegeEscalation": False, "capabilities": capabilities}
    obj = pod(securityContext=context)
    security = config(obj).linux.security_context
    assert security.privileged
    assert security.no_new_privs
    assert list(security.capabilities.add_capabilities) == ["SYS_ADMIN"]
    assert list(security.capabilities.drop_capabilities) == ["ALL"]
    assert security.namespace_options.network == cri.NODE
    sandbox = sandbox_config(obj, "/var/log/pods/x", "/kubepods/podx")
    assert sandbox.linux.security_context.privileged  # a privileged container: so is the pod
    assert not config(pod()).linux.security_context.privileged


def test_the_sandbox_carries_the_pods_identity() -> None:
    got = sandbox_config(pod(), "/var/log/pods/team-a_p_" + UID, "/kubepods/pod" + UID)
    assert (got.metadata.name, got.metadata.namespace, got.metadata.uid) == ("p", "team-a", UID)
    assert got.labels["app"] == "x"
    assert got.labels["io.kubernetes.pod.uid"] == UID
    assert dict(got.annotations) == {"gpuwire.io/gpu-count": "1"}
    assert got.hostname == ""  # host network: the kubelet sets none
    assert got.linux.cgroup_parent == "/kubepods/pod" + UID


def test_log_lines_in_the_cri_format() -> None:
    raw = (
        "2026-12-01T09:11:50.1Z stdout F devices: nvidia0\n"
        "2026-12-01T09:11:50.2Z stdout P a long \n"
        "2026-12-01T09:11:50.3Z stdout F line\n"
        "2026-12-01T09:11:50.4Z stderr F \n"
    )
    assert log_text(raw) == "devices: nvidia0\na long line\n\n"


# The published numbers (kubernetes/cri-api pkg/apis/runtime/v1/api.proto) of the fields
# that containerd must read for gpuwire: a slip in the hand-made subset would go unnoticed
# on the wire otherwise (proto3 drops what it does not know).
PUBLISHED = {
    ("RunPodSandboxRequest", "runtime_handler"): 2,
    ("PodSandboxConfig", "metadata"): 1,
    ("PodSandboxConfig", "linux"): 8,
    ("PodSandboxMetadata", "namespace"): 3,
    ("PodSandboxMetadata", "uid"): 2,
    ("PodSandboxMetadata", "attempt"): 4,
    ("ListPodSandboxRequest", "filter"): 1,
    ("PodSandboxFilter", "label_selector"): 3,
    ("PodSandbox", "state"): 3,
    ("CreateContainerRequest", "sandbox_config"): 3,
    ("ContainerConfig", "envs"): 6,
    ("ContainerConfig", "mounts"): 7,
    ("ContainerConfig", "devices"): 8,
    ("ContainerConfig", "annotations"): 10,
    ("ContainerConfig", "log_path"): 11,
    ("ContainerConfig", "linux"): 15,
    ("ContainerConfig", "CDI_devices"): 17,
    ("ImageSpec", "user_specified_image"): 18,
    ("Mount", "readonly"): 3,
    ("LinuxContainerSecurityContext", "namespace_options"): 3,
    ("ContainerStatus", "log_path"): 15,
}


@pytest.mark.parametrize(("message", "name"), sorted(PUBLISHED))
def test_field_numbers_are_the_published_ones(message: str, name: str) -> None:
    assert (
        cri.DESCRIPTOR.message_types_by_name[message].fields_by_name[name].number
        == (PUBLISHED[(message, name)])
    )
    assert cri.DESCRIPTOR.package == "runtime.v1"
