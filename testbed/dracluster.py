"""Hand-built DRA clusters: GPU nodes as gpuwire's DRA plugin publishes them, without running one
per node.

A node is a simulated machine (`gpuwire.sim.make_machine`: models, NVLink topology, GPUs in MIG
mode with their MIG devices; or `gpuwire.amdsim.make_machine`: AMD GPUs and partitions,
discovered from the simulated node's sysfs as `dra serve --vendor amd` does); its ResourceSlices
are what `gpuwire dra serve` writes for it (`deviceplugin.dra.devices` and `slices`, the same
functions), at generation 1, with the shared GPUs its config would name (HAMi-core holding their
shares unless told otherwise). A machine with MIG devices is discovered as the plugin discovers
it on a simulated node (written to a temporary directory for it: procfs says which MIG devices
exist). `install` puts the Nodes, their slices and the DeviceClasses of `deploy/overlays/dra`
into a kube-apiserver stand-in, as a cluster with the DRA plugin on every GPU node holds them.
What it leaves out: the PCIe roots sysfs would give (the simulated node's tree is written only
for MIG), and health taints.
"""

from __future__ import annotations

import tempfile
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from deviceplugin.agent.labels import GPUS_ANNOTATION, RUNTIME_READY, gpus_annotation
from deviceplugin.dra import devices, slices, vendors
from deviceplugin.dra.devices import Sharing
from deviceplugin.gpus.amd import AmdDiscovery
from deviceplugin.gpus.discovery import Gpu, NodeGpus
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import amdsim, dra, nvidia, sim
from testbed.apiserver import ApiServer

ROOT = Path(__file__).resolve().parents[1]
DEVICE_CLASSES = ROOT / "deploy/overlays/dra/deviceclasses.yaml"

Obj = dict[str, Any]


@dataclass(frozen=True)
class ClusterNode:
    """A DRA node of either vendor: its slices and its Node, from what discovery finds."""

    name: str
    kinds: ClassVar[tuple[devices.Kind, ...]] = vendors.NVIDIA_DRA.kinds

    @property
    def uid(self) -> str:
        return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuwire-test/node/{self.name}"))

    def gpus(self) -> NodeGpus:
        raise NotImplementedError

    def sharing(self) -> Sharing:
        return Sharing()

    def slices(self) -> list[Obj]:
        pool = slices.Pool(dra.DRIVER, self.name, self.uid)
        wanted = slices.wanted(pool, devices.devices(self.gpus(), self.sharing(), self.kinds), {})
        return slices.plan(wanted, [], "").create

    def node(self) -> Obj:
        """The Node, with what the node agent beside the DRA plugin writes on it: its GPUs
        in the `gpuwire.io/gpus` annotation (the inventory reads them), and
        `gpuwire.io/runtime-ready` (the node is installed), where the RuntimeClass gpuwire
        sends GPU pods; and `nvidia.com/gpu.present`, where gpuwire's DaemonSets land
        (docs/install.md)."""
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "nvidia.com/gpu.present": "true", RUNTIME_READY: "true"}  # fmt: skip
        annotations = {GPUS_ANNOTATION: gpus_annotation(self.gpus())}
        meta = {"name": self.name, "uid": self.uid, "labels": labels, "annotations": annotations}
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


@dataclass(frozen=True)
class DraNode(ClusterNode):
    machine: sim.Machine
    shared: tuple[str, ...] = ()  # the node config's dra.sharedGpus: UUIDs or product globs
    enforced: tuple[str, ...] = ("hami",)  # what holds a share there: HAMi-core's library

    def gpus(self) -> NodeGpus:
        """What discovery would find on it (NVML's brand for each GPU)."""
        m = self.machine
        if any(g.mig for g in m.gpus):
            with tempfile.TemporaryDirectory(prefix="gw-dra-node-") as root:
                sim.write_node(Path(root), m)
                return SimDiscovery(root).discover()
        found = tuple(
            Gpu(g.device, g.compute_capability, None, brand=nvidia.brand_of(g.device.product))
            for g in m.gpus
        )
        return NodeGpus(m.driver_version, m.cuda_version, found)

    def sharing(self) -> Sharing:
        return Sharing(self.shared, self.enforced)


@dataclass(frozen=True)
class AmdDraNode(ClusterNode):
    """An AMD node, as `dra serve --vendor amd` publishes it (AMD's DRA driver's names)."""

    machine: amdsim.AmdMachine
    kinds: ClassVar[tuple[devices.Kind, ...]] = vendors.AMD_DRA.kinds

    def gpus(self) -> NodeGpus:
        """What AMD discovery finds on the simulated node's sysfs."""
        with tempfile.TemporaryDirectory(prefix="gw-dra-node-") as root:
            amdsim.write_node(Path(root), self.machine)
            return AmdDiscovery(root).discover()


def node(
    name: str,
    gpus: int = 4,
    products: tuple[str, ...] = (sim.DEFAULT_PRODUCT,),
    nvlink: str = "pairs",
    shared: tuple[str, ...] = (),
    mig: Mapping[int, tuple[str, ...]] | None = None,
    enforced: tuple[str, ...] = ("hami",),
) -> DraNode:
    """A DRA node of `gpus` GPUs (products cycling over them), its GPU UUIDs its own; `mig`:
    GPU index → the MIG profiles made on it (`("balanced",)`: mig-parted's all-balanced)."""
    machine = sim.make_machine(gpus=gpus, products=products, nvlink=nvlink, seed=name)
    for index, profiles in (mig or {}).items():
        machine = sim.with_mig(machine, index, profiles)
    return DraNode(name, machine, shared, enforced)


def amd_node(
    name: str,
    gpus: int = 4,
    product: str = amdsim.DEFAULT_PRODUCT,
    hive_size: int | None = None,
    compute: str = "SPX",
    memory: str = "NPS1",
) -> AmdDraNode:
    """An AMD DRA node of `gpus` GPUs of `product` (XGMI hives of `hive_size`; partitioned in
    `compute` and `memory` modes where the product has them), its unique ids its own."""
    machine = amdsim.make_machine(gpus, product, hive_size, compute, memory, seed=name)
    return AmdDraNode(name, machine)


def all_slices(nodes: Iterable[ClusterNode]) -> list[Obj]:
    return [s for n in nodes for s in n.slices()]


def device_classes() -> list[Obj]:
    return list(yaml.safe_load_all(DEVICE_CLASSES.read_text()))


def install(api: ApiServer, nodes: Sequence[ClusterNode]) -> None:
    """The Nodes, their ResourceSlices and gpuwire's DeviceClasses, in the API server."""
    for n in nodes:
        api.put(n.node())
        for s in n.slices():
            api.put(s)
    for c in device_classes():
        api.put(c)
