"""A large cluster's Nodes as the API server holds them: what the webhook's scale bench lists.

`nodes(n)` is the example cluster's GPU nodes (examples/nodes.yaml, so every pod of the bench's
mix resolves as it does there, the named UUID included) and then nodes of the same GPU kinds
with 8 GPUs each (the mixed kind 4 + 4), named `gpu-<kind>-<i>`, each GPU with its own UUID,
until there are `n`. Every node carries what a real GPU node carries besides gpuwire's words,
because that is what a list costs: the kubelet's, the cloud's, Node Feature Discovery's and GPU
Feature Discovery's labels, their annotations, managedFields, taints, and a status with
conditions, addresses, node info and the 25 images a busy node reports (the kubelet reports up
to 50: `nodeStatusMaxImages`). About 21 KB of JSON a node, 15 KB of it metadata (labels,
annotations and managedFields).

`slices(nodes)` is what gpuwire's DRA plugin publishes for them (`testbed.dracluster`: the
plugin's own device and slice code): one ResourceSlice a node, its 8 GPUs with the node's
products, NVLink in pairs, every SHARED_EVERY-th node's GPUs shared (HAMi-core holding the
shares). About 7 KB of JSON a slice.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from pathlib import Path
from typing import Any

import yaml

from gpuwire import holders, nodegpus
from testbed import dracluster

Obj = dict[str, Any]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "nodes.yaml"
GPUS = 8
SHARED_EVERY = 4
CPU_FLAGS = """ADX AESNI AMXBF16 AMXINT8 AMXTILE AVX AVX2 AVX512BF16 AVX512BITALG AVX512BW
AVX512CD AVX512DQ AVX512F AVX512FP16 AVX512IFMA AVX512VBMI AVX512VBMI2 AVX512VL AVX512VNNI
AVX512VPOPCNTDQ AVXVNNI CETIBT CETSS CLDEMOTE FMA3 FSRM FXSR FXSROPT GFNI HYPERVISOR IBPB LAHF
MOVBE MOVDIR64B MOVDIRI OSXSAVE SERIALIZE SHA SPEC_CTRL_SSBD STIBP SYSCALL SYSEE TSXLDTRK VAES
VPCLMULQDQ WAITPKG X87 XGETBV1 XSAVE XSAVEC XSAVEOPT XSAVES""".split()  # noqa: SIM905 - a word list
IMAGES = """nvcr.io/nvidia/pytorch:24.05-py3 nvcr.io/nvidia/tritonserver:24.05-py3
nvcr.io/nvidia/k8s-device-plugin:v0.15.0 nvcr.io/nvidia/gpu-operator:v24.3.0
nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04 nvcr.io/nvidia/cuda:12.4.1-base
nvcr.io/nvidia/gpu-feature-discovery:v0.8.2 registry.k8s.io/nfd/node-feature-discovery:v0.15.4
ghcr.io/gpuwire/gpuwire:0.1 registry.k8s.io/kube-proxy:v1.31.0 docker.io/calico/node:v3.28.0
docker.io/calico/cni:v3.28.0 registry.k8s.io/pause:3.10
public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver:v1.31.0
registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.10.1
registry.k8s.io/sig-storage/livenessprobe:v2.12.0 quay.io/prometheus/node-exporter:v1.8.1
docker.io/fluent/fluent-bit:3.0.7 ghcr.io/ml-team/trainer:2024-06-01
ghcr.io/ml-team/trainer:2024-06-08 ghcr.io/ml-team/inference:1.42 ghcr.io/ml-team/inference:1.43
docker.io/library/python:3.12-slim docker.io/rayproject/ray-ml:2.24.0-gpu
docker.io/vllm/vllm-openai:v0.5.0""".split()  # noqa: SIM905 - a word list
CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)
NODE_INFO = {"kernelVersion": "5.15.0-1063-aws", "osImage": "Ubuntu 22.04.4 LTS",
             "containerRuntimeVersion": "containerd://1.7.18", "kubeletVersion": "v1.31.0",
             "kubeProxyVersion": "v1.31.0", "operatingSystem": "linux",
             "architecture": "amd64"}  # fmt: skip
RESOURCES = {"cpu": "192", "ephemeral-storage": "3749672516Ki", "hugepages-1Gi": "0",
             "hugepages-2Mi": "0", "memory": "2097152000Ki", "pods": "110",
             "vpc.amazonaws.com/efa": "32"}  # fmt: skip


def holding(node: Obj, pods: list[str]) -> str:
    """`gpuwire.io/holders` for `node` with each of `pods` holding two of its GPUs (the node
    agent's annotation, rewritten whenever a GPU pod starts or ends there)."""
    gpus = [g.uuid for g in nodegpus.decode(node["metadata"]["annotations"][nodegpus.ANNOTATION])]
    held = tuple(
        holders.Holder("ml-research", pod, "main", "plugin", tuple(sorted(gpus[2 * i : 2 * i + 2])))
        for i, pod in enumerate(pods)
    )
    return holders.encode(holders.NodeHolders(held, (), plugin=True))


def _labels(name: str, zone: str, own: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The node's labels, and Node Feature Discovery's among them."""
    nfd = {f"feature.node.kubernetes.io/cpu-cpuid.{flag}": "true" for flag in CPU_FLAGS}
    nfd |= {
        f"feature.node.kubernetes.io/{key}": value
        for key, value in (
            ("cpu-model.family", "6"), ("cpu-model.id", "143"), ("cpu-model.vendor_id", "Intel"),
            ("kernel-version.full", "5.15.0-1063-aws"), ("pci-10de.present", "true"),
            ("system-os_release.ID", "ubuntu"), ("system-os_release.VERSION_ID", "22.04"),
            ("memory-numa", "true"),
        )
    }  # fmt: skip
    kubelet = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
               "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
               "kubernetes.io/hostname": name}  # fmt: skip
    cloud = {"beta.kubernetes.io/instance-type": "p5.48xlarge",
             "node.kubernetes.io/instance-type": "p5.48xlarge",
             "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
             "failure-domain.beta.kubernetes.io/region": "us-east-1",
             "failure-domain.beta.kubernetes.io/zone": zone,
             "topology.ebs.csi.aws.com/zone": zone, "eks.amazonaws.com/nodegroup": "gpu-pool",
             "eks.amazonaws.com/capacityType": "ON_DEMAND",
             "eks.amazonaws.com/nodegroup-image": "ami-0f5e8a042c8bfcd5e"}  # fmt: skip
    operator = {f"nvidia.com/gpu.deploy.{part}": "true" for part in (
        "container-toolkit", "dcgm", "dcgm-exporter", "device-plugin", "driver",
        "gpu-feature-discovery", "node-status-exporter", "operator-validator")}  # fmt: skip
    operator |= {"nvidia.com/gpu.machine": "p5.48xlarge", "nvidia.com/gfd.timestamp": "1717228800",
                 "nvidia.com/mig.capable": "false", "nvidia.com/mps.capable": "false",
                 "nvidia.com/gpu.mode": "compute",
                 "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}  # fmt: skip
    return {**kubelet, **cloud, **operator, **nfd, **own, "kubernetes.io/hostname": name}, nfd


def _managed(labels: dict[str, str], annotations: dict[str, str], nfd: dict[str, str]) -> list[Obj]:
    """managedFields: who wrote which labels and annotations, and the kubelet's status."""

    def entry(manager: str, fields: Obj, subresource: str = "") -> Obj:
        made: Obj = {"manager": manager, "operation": "Update", "apiVersion": "v1"}
        made |= {"time": "2024-06-01T08:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}
        return made | ({"subresource": subresource} if subresource else {})

    def keys(mapping: dict[str, str], *prefixes: str) -> Obj:
        return {f"f:{k}": {} for k in mapping if k.startswith(prefixes)}

    def metadata(**fields: Obj) -> Obj:
        return {"f:metadata": {f"f:{kind}": found for kind, found in fields.items()}}

    return [
        entry("kubelet", metadata(
            annotations=keys(annotations, "node.alpha", "volumes."),
            labels=keys(labels, "beta.", "kubernetes.io"))),
        entry("nfd-master", metadata(
            annotations=keys(annotations, "nfd."), labels=keys(nfd, ""))),
        entry("gpu-feature-discovery", metadata(labels=keys(labels, "nvidia.com/"))),
        entry("gpuwire-agent", metadata(
            annotations=keys(annotations, "gpuwire.io/"), labels=keys(labels, "gpuwire.io/"))),
        entry("kubelet", {"f:status": {"f:conditions": {}, "f:images": {}, "f:nodeInfo": {}}},
              "status"),
    ]  # fmt: skip


def _status(name: str, ip: str, gpus: int, rng: random.Random) -> Obj:
    resources = RESOURCES | {"nvidia.com/gpu": str(gpus)}
    conditions = [
        {"type": kind, "status": status, "lastHeartbeatTime": "2024-06-01T08:00:00Z",
         "lastTransitionTime": "2024-06-01T07:00:00Z", "reason": reason, "message": message}
        for kind, status, reason, message in CONDITIONS
    ]  # fmt: skip
    images = [
        {"names": [f"{i.rsplit(':', 1)[0]}@sha256:{rng.getrandbits(256):064x}", i],
         "sizeBytes": rng.randrange(10**7, 2 * 10**10)}
        for i in IMAGES
    ]  # fmt: skip
    ids = {"machineID": f"{rng.getrandbits(128):032x}",
           "systemUUID": str(uuid.UUID(int=rng.getrandbits(128))),
           "bootID": str(uuid.UUID(int=rng.getrandbits(128)))}  # fmt: skip
    addresses = [{"type": "InternalIP", "address": ip},
                 {"type": "InternalDNS", "address": f"ip-{ip.replace('.', '-')}.ec2.internal"},
                 {"type": "Hostname", "address": name}]  # fmt: skip
    return {"capacity": resources, "allocatable": resources | {"cpu": "191450m"},
            "conditions": conditions, "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": ids | NODE_INFO, "images": images}  # fmt: skip


def dress(node: Obj, rng: random.Random) -> Obj:
    """`node` (metadata with gpuwire's and GFD's words) as a real GPU node holds it."""
    meta = node["metadata"]
    name = meta["name"]
    instance = f"i-{rng.getrandbits(68):017x}"
    zone = rng.choice(("us-east-1a", "us-east-1b", "us-east-1c"))
    ip = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    labels, nfd = _labels(name, zone, meta.get("labels", {}))
    annotations = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "alpha.kubernetes.io/provided-node-ip": ip,
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": instance}),
        "nfd.node.kubernetes.io/feature-labels": ",".join(k.split("/")[1] for k in nfd),
        "nfd.node.kubernetes.io/extended-resources": "",
        "nvidia.com/gpu-driver-upgrade-enabled": "true",
        **meta.get("annotations", {}),
    }
    pods = [f"trainer-{rng.getrandbits(40):010x}" for _ in range(GPUS // 2)]
    annotations[holders.ANNOTATION] = holding(node, pods)
    gpus = len(nodegpus.decode(annotations[nodegpus.ANNOTATION]))
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    spec = {"podCIDR": f"10.244.{rng.randrange(256)}.0/24",
            "providerID": f"aws:///{zone}/{instance}", "taints": [taint]}  # fmt: skip
    managed = _managed(labels, annotations, nfd)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "managedFields": managed,
        },
        "spec": spec,
        "status": _status(name, ip, gpus, rng),
    }


def _scaled(template: Obj, name: str, rng: random.Random) -> Obj:
    """A node like `template` named `name`: 8 GPUs of its kinds (halves for a mixed node),
    each with a UUID of its own."""
    node = copy.deepcopy(template)
    meta = node["metadata"]
    meta["name"] = name
    gpus = nodegpus.decode(meta["annotations"][nodegpus.ANNOTATION])
    kinds = list(dict.fromkeys((g.product, g.memory_mib, g.resource, g.replicas) for g in gpus))
    made = [
        nodegpus.NodeGpu(
            index=i, uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", product=product,
            memory_mib=memory, numa_node=i * 2 // GPUS, resource=resource, replicas=replicas,
        )
        for i in range(GPUS)
        for product, memory, resource, replicas in [kinds[i * len(kinds) // GPUS]]
    ]  # fmt: skip
    meta["annotations"][nodegpus.ANNOTATION] = nodegpus.encode(made)
    meta["labels"]["nvidia.com/gpu.count"] = str(GPUS // len(kinds))
    return node


def nodes(count: int, seed: int = 14) -> list[Obj]:
    """`count` GPU nodes: the example cluster's, then more of their kinds (see the module)."""
    rng = random.Random(seed)
    examples = yaml.safe_load(EXAMPLES.read_text())["items"]
    gpu_nodes = [n for n in examples if nodegpus.ANNOTATION in n["metadata"].get("annotations", {})]
    found = [dress(n, rng) for n in gpu_nodes[:count]]
    for i in range(count - len(found)):
        template = gpu_nodes[i % len(gpu_nodes)]
        kind = template["metadata"]["name"].rsplit("-", 1)[0]
        found.append(dress(_scaled(template, f"{kind}-{i + 1:05d}", rng), rng))
    return found


def slices(nodes: list[Obj]) -> list[Obj]:
    """gpuwire's ResourceSlices for `nodes` (see the module)."""
    made = []
    for i, node in enumerate(nodes):
        gpus = nodegpus.decode(node["metadata"]["annotations"][nodegpus.ANNOTATION])
        products = tuple(g.product for g in sorted(gpus, key=lambda g: g.index))
        shared = ("*",) if i % SHARED_EVERY == 0 else ()
        name = node["metadata"]["name"]
        made += dracluster.node(name, len(products), products, shared=shared).slices()
    return made
