"""The demo's AMD node, which joins after the DRA scenes: the same annotations, an AMD GPU.

`gpuwire sim node --vendor amd` writes four MI300X (SPX, NPS1; XGMI hives of GPUs 0-1 and 2-3,
one per NUMA node) as the kernel shows them (KFD topology, DRM, amdgpu's sysfs). Its device
plugin (`gpuwire device-plugin serve --vendor amd`) registers `amd.com/gpu` with a kubelet
stand-in of its own, labels the Node with AMD's labeller's keys and `gpuwire.io/gpus`, and
keeps its holders annotation; the webhook's watch reads it as an AMD node. As root, its pods
run on a containerd of its own with gpuwire's handler as the default, started with the node's
gpuwire config (`vendor = "amd"`): the runtime gives a container `/dev/kfd` and exactly its
GPUs' render nodes, with their cgroup rules. The grant keys and the resident gpuwire are the
first node's (one key set for the cluster, one launcher install per machine).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.agent.labels import GPUS_ANNOTATION
from gpuwire import amd, kfd
from gpuwire.devices import Device
from gpuwire.roots import Roots
from gpuwire.vendor import AMD
from scripts.demo.base import GPUWIRE, ROCM_IMAGE, Host, handlers_of, run, until
from scripts.demo.cluster import (
    READY,
    RUNTIME_CLASS,
    Cluster,
    node_containerd,
    report_capacity,
    serving_plugin,
)
from scripts.demo.controlplane import review
from testbed.containerd import Containerd
from testbed.kubelet import Kubelet
from testbed.podresources import PodResourcesKubelet

NODE = "gpu-node-amd"
GPUS, HIVE = 4, 2  # four MI300X, XGMI hives of two
RESOURCE = amd.RESOURCE
Obj = dict[str, Any]


@dataclass(frozen=True)
class AmdNode:
    root: Path  # the simulated node
    found: kfd.AmdNode  # what AMD discovery reads there
    host: Host
    containerd: Containerd | None  # None: containers do not run here

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.found.devices


def node_object() -> Obj:
    """The Node as the kubelet registers it, with the label the shipped RuntimeClass gpuwire
    schedules on (deploy/base/runtimeclass.yaml): the demo's node is installed before it
    joins, and its device plugin keeps the label while the installer's ready file is there."""
    (runtime_class,) = (
        c
        for c in yaml.safe_load_all(RUNTIME_CLASS.read_text())
        if c["metadata"]["name"] == "gpuwire"
    )
    labels = {
        **runtime_class["scheduling"]["nodeSelector"],
        "kubernetes.io/hostname": NODE,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    capacity = {"cpu": "192", "memory": "2Ti", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": labels},
        "status": {"capacity": capacity},
    }


def write_config(workdir: Path, root: Path) -> Path:
    """The AMD node's gpuwire config: its own root, allocations and records; the cluster's
    grant keys and runtime log."""
    settings = {
        "vendor": AMD.name,
        "root": root,
        "grant-key-dir": workdir / "keys",
        "allocation-dir": workdir / "amd-allocations",
        "records-dir": workdir / "amd-records",
        "log": workdir / "gpuwire.log",
    }
    config = workdir / "amd-config.toml"
    config.write_text("".join(f"{k} = {json.dumps(str(v))}\n" for k, v in settings.items()))
    return config


def join(cluster: Cluster, first_pod: Obj) -> AmdNode:
    """The AMD node in the cluster, labelled by its device plugin and seen by the webhook (a
    dry-run review of `first_pod` is admitted), its containerd started where containers run;
    everything stopped when the cluster goes."""
    workdir, steps, stack = cluster.workdir, cluster.steps, cluster.stack
    root = workdir / "amd-node"
    run(steps, "a simulated AMD node: 4 MI300X, XGMI hives 0-1 and 2-3",
        [GPUWIRE, "sim", "node", str(root), "--vendor", "amd", "--gpus", str(GPUS),
         "--xgmi-hive", str(HIVE), "--seed", NODE])  # fmt: skip
    cluster.api.put(node_object())
    kubelet = stack.enter_context(Kubelet(workdir / "amd-kubelet"))
    sockets = workdir / "amd-pod-resources/kubelet.sock"
    pod_resources = stack.enter_context(PodResourcesKubelet(sockets, kubelet))
    config = write_config(workdir, root)
    argv = [
        GPUWIRE, "device-plugin", "serve", "--vendor", "amd",
        "--sim", str(root),
        "--kubelet-dir", str(workdir / "amd-kubelet"),
        "--allocation-dir", str(workdir / "amd-allocations"),
        "--grant-key-dir", str(workdir / "keys"),
        "--labels", "--node", NODE, "--kubeconfig", str(cluster.kubeconfig),
        "--runtime-ready", str(workdir / READY),
        "--holders", "--holders-interval", "0.5",
        "--records-dir", str(workdir / "amd-records"),
        "--pod-resources-socket", str(sockets),
        "--log-level", "WARNING",
    ]  # fmt: skip
    log = workdir / "amd-device-plugin.log"
    runs = stack.enter_context(serving_plugin("the AMD node's device plugin", argv, log, steps))

    def labelled() -> bool:
        node = cluster.api.get("nodes", NODE) or {"metadata": {}}
        return GPUS_ANNOTATION in node["metadata"].get("annotations", {})

    until(lambda: runs() and RESOURCE in kubelet.plugins, "the AMD plugin to register")
    until(lambda: runs() and labelled(), "the AMD plugin to label its node")
    report_capacity(cluster.api, kubelet, NODE, RESOURCE)
    containerd, host = None, Host(kubelet, pod_resources, None, {}, "")
    if cluster.containerd is not None:  # containers run here: the same generation
        generation = cluster.containerd.generation
        containerd = node_containerd(cluster, stack, generation, config, "amd-", (ROCM_IMAGE,))
        handlers, default = handlers_of(containerd.dump(), generation.config_version)
        runtime = stack.enter_context(containerd.kuberuntime())
        host = Host(kubelet, pod_resources, runtime, handlers, default)
        cluster.places[str(containerd.home)] = "$AMD_CTD"
    with cluster.webhook() as http:

        def sees_node() -> bool:
            return review(cluster, first_pod, dry_run=True, http=http).allowed

        until(sees_node, "the webhook to see the AMD node", 15)
    return AmdNode(root, kfd.discover(Roots(str(root))), host, containerd)
