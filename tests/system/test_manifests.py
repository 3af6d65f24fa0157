"""gpuwire installed the way a cluster admin installs it (issue 23): each variant of deploy/
rendered by `kubectl kustomize`, every object created in the testbed's secure API server
(RBAC over the rendered roles), the DaemonSets' and the Deployment's pods run by the testbed
kubelet from the built image over CRI as the manifests say (testbed/cluster.py,
testbed/install.py: the GPU stand-in is the one change), then the story of docs/install.md:
the installer puts the host files in place and configures containerd, restarting it once;
the device plugin registers through its hostPath socket (the DRA plugin publishes its
slices and prepares the pod's claim); both webhook replicas serve admission with their
Secret's certificate; a GPU pod gets exactly its GPUs and the driver's files; the uninstall
gives containerd its configuration back byte for byte and leaves no file, label or
annotation of gpuwire. No request of gpuwire's is refused (403), and every rule of the
rendered RBAC that no component used is named in its role's comments.

One cluster per containerd generation: the variants install, run and uninstall one after
another on it, each on the node the uninstall before left. containerd 1.6 (bookworm) runs the
variants that need no CDI through CRI (base, plugin-less; cdi and dra need 1.7)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import image
from testbed import containerds, rbac
from testbed.cluster import Cluster
from testbed.image import NAME as BUSYBOX
from testbed.install import NAMESPACE, UNINSTALL, Install, ready, render, wait, workload
from testbed.lifecycle import gpu_cluster, logs, runtime_ready
from tests.conftest import requires_binary, requires_root

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
VARIANTS = ["base", "plugin-less", "cdi", "dra"]
GENERATIONS = ["bookworm", "trixie", "sid"]  # containerd 1.6, 1.7, 2.x
CDI = {"cdi", "dra"}  # the variants whose containers get devices by CDI through CRI (1.7+)
RUNS = [(g, v) for g in GENERATIONS for v in VARIANTS if g != "bookworm" or v not in CDI]
NODE = "gpu-node-0"
GPU_NAMESPACE = {"base": "ml", "cdi": "ml", "dra": "ml", "plugin-less": "gpu-node-agents"}
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
HOST_FILES = ("/opt/gpuwire", "/etc/gpuwire", "/run/gpuwire", "/var/lib/gpuwire")
SERVICE_HOST = "gpuwire-webhook.gpuwire-system.svc"
pytestmark = [requires_root(), requires_binary("unshare", "runc", "ip")]


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, gpuwire_image: image.Image) -> Iterator[Cluster]:
    generation = containerds.generations().get(request.param)
    if generation is None:
        pytest.skip(f"containerd of {request.param} not fetched (make system-deps)")
    with gpu_cluster(generation, [gpuwire_image.archive], set(GPU_NAMESPACE.values())) as made:
        yield made


@pytest.mark.timeout(900)  # its waits add up to 780 s on a machine busy enough to need them
@pytest.mark.parametrize(("cluster", "variant"), RUNS, indirect=["cluster"])
def test_a_variant_installs_serves_gpu_pods_and_uninstalls(
    cluster: Cluster, gpuwire_image: image.Image, variant: str
) -> None:
    node = cluster.node
    before = node.path(CONTAINERD_CONFIG).read_bytes()
    restarts = node.containerd_restarts
    asked = len(cluster.api.authorizations)
    install = Install(cluster, variant, gpuwire_image.name)
    objects = install.objects()

    install.apply()
    install.wait_ready(300)
    wait(cluster, "runtime-ready", lambda: runtime_ready(cluster), NAMESPACE, 60)
    host_files_in_place(cluster, install)
    assert node.containerd_restarts == restarts + 1
    plugin_registered(cluster, variant)
    webhooks_serve_their_secrets_certificate(cluster)
    a_gpu_pod_gets_exactly_its_gpus(cluster, variant)

    install.uninstall(300)
    assert node.path(CONTAINERD_CONFIG).read_bytes() == before
    assert node.containerd_restarts == restarts + 2
    for gone in (*HOST_FILES, "/etc/containerd/conf.d/99-gpuwire.toml", "/etc/cdi/gpuwire.yaml"):
        assert not node.path(gone).exists(), gone
    assert gpuwire_marks(cluster) == []

    used = cluster.api.authorizations[asked:]
    roles = [*objects, *render(UNINSTALL, gpuwire_image.name)]
    assert refused(used) == []
    unused = unused_rules(roles, used)
    print(f"\n{variant}: rules no component used:", *(f"{r['kind']}/{r['metadata']['name']}: "
          f"{rule}" for r, rule in unused), sep="\n  ")  # fmt: skip
    assert unexplained(unused) == []


# --- the story's steps


def host_files_in_place(cluster: Cluster, install: Install) -> None:
    """The installer's work on the host: the version's files behind `current`, the node
    config from the ConfigMap, the grant keys of the Secret, containerd configured."""
    node = cluster.node
    version = install.image.rsplit(":", 1)[1]
    assert os.readlink(node.path("/opt/gpuwire/current")) == version
    assert sorted(os.listdir(node.path(f"/opt/gpuwire/{version}/libexec"))) == [
        "gpuwire-call",
        "gpuwire-hook",
        "gpuwire-runtime",
    ]
    config_map = cluster.api.get("configmaps", "gpuwire-node", NAMESPACE)
    assert config_map is not None
    assert node.path("/etc/gpuwire/config.toml").read_text() == config_map["data"]["config.toml"]
    secret = cluster.api.get("secrets", "gpuwire-grant-keys", NAMESPACE)
    assert secret is not None
    keys = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    held = node.path("/etc/gpuwire/keys")
    assert {p.name: p.read_bytes() for p in held.iterdir()} == keys
    drop_in = node.path("/etc/containerd/conf.d/99-gpuwire.toml").read_text()
    assert "/opt/gpuwire/current/libexec/gpuwire-runtime" in drop_in
    assert "99-gpuwire.toml" in node.path(CONTAINERD_CONFIG).read_text()
    if config_map["data"]["cdi-spec"]:
        assert node.path(config_map["data"]["cdi-spec"]).exists()


def plugin_registered(cluster: Cluster, variant: str) -> None:
    """The device plugin's socket, in its hostPath, reached the kubelet: the Node offers the
    GPUs (the DRA plugin's: its ResourceSlices; plugin-less: labels only)."""
    plugins = cluster.kubelet.devices.plugins
    live = [r for r, plugin in list(plugins.items()) if not plugin.stream_ended]
    if variant in ("base", "cdi"):
        assert live == ["nvidia.com/gpu"]
        wait(cluster, "nvidia.com/gpu allocatable", lambda: allocatable(cluster) == "4",
             NAMESPACE, 30)  # fmt: skip
    if variant == "dra":
        slices = [s for s in cluster.api.objects("resourceslices") if s["spec"]["nodeName"] == NODE]
        assert sum(len(s["spec"].get("devices") or ()) for s in slices) >= 4
    if variant in ("plugin-less", "dra"):
        assert live == []
    found = cluster.api.get("nodes", NODE) or {}
    assert found["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"


def allocatable(cluster: Cluster) -> str:
    found = cluster.api.get("nodes", NODE) or {}
    return str(found["status"].get("allocatable", {}).get("nvidia.com/gpu"))


def webhooks_serve_their_secrets_certificate(cluster: Cluster) -> None:
    """Each replica, at its pod's address, presents the serving certificate of the Secret
    (verified against its CA for the Service's name) and admits a GPU pod with a patch."""
    secret = cluster.api.get("secrets", "gpuwire-webhook-tls", NAMESPACE)
    assert secret is not None
    ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
    served = base64.b64decode(secret["data"]["tls.crt"]).decode()
    want = ssl.PEM_cert_to_DER_cert(served[: served.index("-----END CERTIFICATE-----") + 25])
    replicas = cluster.pods(NAMESPACE, {"app.kubernetes.io/component": "webhook"})
    assert len(replicas) == 2
    assert all(map(ready, replicas))
    for replica in replicas:
        certificate, answer = admission_review(cluster, replica["status"]["podIP"], ca)
        assert certificate == want
        assert answer["allowed"] is True
        assert json.loads(base64.b64decode(answer["patch"]))


def admission_review(cluster: Cluster, address: str, ca: str) -> tuple[bytes, Obj]:
    """POST /mutate of a dry-run AdmissionReview for a one-GPU pod, over TLS from the node's
    network: the certificate the replica presented, and its answer."""
    pod = workload("review", "ml", BUSYBOX, ["true"], limits={"nvidia.com/gpu": 1})
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "review",
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": pod,
            "dryRun": True,
        },
    }
    body = json.dumps(review).encode()
    context = ssl.create_default_context(cadata=ca)
    raw = cluster.node.connect(address, 8443, 10)
    with context.wrap_socket(raw, server_hostname=SERVICE_HOST) as tls:
        certificate = tls.getpeercert(binary_form=True)
        head = (
            f"POST /mutate HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        tls.sendall(head.encode() + body)
        response = http.client.HTTPResponse(tls)
        response.begin()
        answer = json.loads(response.read())
    assert certificate is not None
    found: Obj = answer["response"]
    return certificate, found


GPU_POD_SCRIPT = (
    "nvidia-smi -L; ls /dev; "
    "ls /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib 2>/dev/null | grep '^libnvidia-ml.so'; "
    "echo done; sleep 600"
)


def gpu_pod(variant: str, uuids: list[str], name: str = "gpu-check") -> Obj:
    """A pod asking for two GPUs the variant's way (plugin-less: naming them)."""
    namespace = GPU_NAMESPACE[variant]
    command = ["sh", "-c", GPU_POD_SCRIPT]
    if variant == "plugin-less":
        annotations = {"gpuwire.io/gpu-uuid": ",".join(uuids)}
        return workload(name, namespace, BUSYBOX, command, annotations=annotations)
    if variant == "dra":
        return workload(
            name, namespace, BUSYBOX, command, annotations={"gpuwire.io/gpu-count": "2"}
        )
    return workload(name, namespace, BUSYBOX, command, limits={"nvidia.com/gpu": 2})


def node_uuids(cluster: Cluster) -> list[str]:
    found = cluster.api.get("nodes", NODE) or {}
    gpus = json.loads(found["metadata"]["annotations"]["gpuwire.io/gpus"])
    return [g["uuid"] for g in gpus]


def a_gpu_pod_gets_exactly_its_gpus(cluster: Cluster, variant: str) -> None:
    """Two GPUs asked, two seen: their device nodes, nvidia-smi listing them (it opens each
    node: the device cgroup allows exactly these), the driver's NVML library."""
    uuids = node_uuids(cluster)[1:3]
    pod = gpu_pod(variant, uuids)
    namespace = pod["metadata"]["namespace"]
    cluster.api.create(pod)

    def printed() -> bool:
        return "done" in logs(cluster, "gpu-check", "app", namespace)

    wait(cluster, "the GPU pod's output", printed, namespace, 120)
    out = logs(cluster, "gpu-check", "app", namespace)
    listed = re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)$", out, re.M)
    assert len(listed) == 2, out
    if variant == "plugin-less":
        assert sorted(listed) == sorted(uuids), out
    assert len(re.findall(r"^nvidia\d+$", out, re.M)) == 2, out
    assert re.search(r"^libnvidia-ml\.so", out, re.M), out
    cluster.api.delete("pods", "gpu-check", namespace)
    cluster.wait_gone(namespace, {}, 60)


def gpuwire_marks(cluster: Cluster) -> list[str]:
    """The Node's labels and annotations that are gpuwire's (its agent's, GFD's keys)."""
    found = cluster.api.get("nodes", NODE) or {}
    meta = found["metadata"]
    keys = [*(meta.get("labels") or {}), *(meta.get("annotations") or {})]
    return [k for k in keys if k.startswith(("gpuwire.io/", "nvidia.com/")) and
            k != "nvidia.com/gpu.present"]  # fmt: skip


# --- RBAC: what was refused, what was never used


def gpuwires(attrs: rbac.Attributes) -> bool:
    return attrs.user.name.startswith("system:serviceaccount:gpuwire-")


def refused(used: list[tuple[rbac.Attributes, rbac.Decision]]) -> list[str]:
    return [f"{a.user.name}: {a.verb} {a.resource} {a.name}".strip()
            for a, d in used if gpuwires(a) and not d.allowed]  # fmt: skip


def unused_rules(
    objects: list[Obj], used: list[tuple[rbac.Attributes, rbac.Decision]]
) -> list[tuple[Obj, Obj]]:
    """(role, rule) for every rule of the rendered roles that allowed no request."""
    granted = {(d.grant.role, d.grant.index) for _, d in used if d.grant is not None}
    return [
        (role, rule)
        for role in objects
        if role["kind"] in ("Role", "ClusterRole")
        for index, rule in enumerate(role.get("rules") or ())
        if (rbac.role_key(role), index) not in granted
    ]


def unexplained(unused: list[tuple[Obj, Obj]]) -> list[str]:
    """The unused rules whose role's comments (in deploy/) do not name their resource."""
    out = []
    for role, rule in unused:
        said = squeezed(comments(role["kind"], role["metadata"]["name"]))
        for resource in rule.get("resources") or ():
            if squeezed(resource).removesuffix("s") not in said:
                out.append(f"{role['kind']}/{role['metadata']['name']}: {rule}")
    return out


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def comments(kind: str, name: str) -> str:
    """The comments of the manifest document that defines `kind` `name`."""
    for path in sorted((REPO / "deploy").rglob("*.yaml")):
        for document in re.split(r"^---$", path.read_text(), flags=re.M):
            obj = yaml.safe_load(document)
            named = isinstance(obj, dict) and obj.get("metadata", {}).get("name") == name
            if named and obj.get("kind") == kind:
                return " ".join(re.findall(r"#(.*)$", document, re.M))
    raise AssertionError(f"{kind} {name}: not in deploy/")
