"""Which GPUs each advertised resource holds, and the device IDs the kubelet sees for them.

A node advertises one resource (`nvidia.com/gpu`) or, for a mixed node, one per GPU model
(the first `pattern → name` rule that matches the product name wins; unmatched GPUs keep the
default name). With time-slicing or MPS each GPU appears `replicas` times as `<uuid>::<n>`
(NVIDIA's ID format), so the scheduler can place that many containers on it; where a
mechanism holds them (`Sharing.limits`: HAMi-core, MPS), each replica gets its `Share` of
the GPU: memory/replicas and 100/replicas % of the SMs unless configured.

A resource of MIG devices (`deviceplugin.plugin.migstrategy`) holds them as devices of their own
(`as_device`): the MIG UUID as ID (NVIDIA's plugin advertises `MIG-…` too), the MIG device's
memory, its parent's index, minor, bus and NUMA node, and no NVLinks (MIG devices do no
peer-to-peer), so preferred allocation and Allocate treat them like GPUs.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

from deviceplugin.gpus.discovery import NodeGpus
from deviceplugin.plugin import migstrategy
from deviceplugin.plugin.migstrategy import Advertised
from gpuwire.allocation import Share
from gpuwire.devices import Device, MigDevice

REPLICA_SEPARATOR = "::"
# Kubernetes IsExtendedResourceName: a domain-prefixed qualified name, not kubernetes.io.
_RESOURCE = re.compile(
    r"^(?P<domain>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
    r"/(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)


def resource_name_error(name: str) -> str | None:
    """Why `name` cannot be an extended resource name, or None if it can."""
    m = _RESOURCE.match(name)
    if not m:
        return (
            f"{name!r} is not an extended resource name: expected <domain>/<name>, "
            "e.g. nvidia.com/gpu"
        )
    if m["domain"] == "kubernetes.io" or m["domain"].endswith(".kubernetes.io"):
        return f"{name!r}: the kubernetes.io domain is reserved"
    if len(name) > 63:
        return f"{name!r} is longer than 63 characters"
    return None


@dataclass(frozen=True)
class Rule:
    """GPUs whose product name matches `pattern` (fnmatch, case-insensitive) get `name`."""

    pattern: str
    name: str
    replicas: int | None = None  # None: the node-wide setting

    def matches(self, product: str) -> bool:
        return fnmatch.fnmatchcase(product.lower(), self.pattern.lower())


def as_device(mig: MigDevice, parent: Device) -> Device:
    """A MIG device as a resource holds it."""
    return Device(
        index=parent.index,
        minor=parent.minor,
        uuid=mig.uuid,
        pci_bus_id=parent.pci_bus_id,
        product=f"{parent.product} MIG {mig.profile}",
        memory_mib=mig.memory_mib,
        numa_node=parent.numa_node,
    )


@dataclass(frozen=True)
class Sharing:
    """How replicas share a GPU: the mechanism that holds each to its share (none: nothing,
    as NVIDIA's time-slicing), and the share where it is not 1/replicas."""

    limits: str = "none"  # none, hami, mps
    memory_mib: int | None = None  # per replica
    memory_percent: int | None = None  # per replica, of the GPU's memory
    cores: int | None = None  # per replica, percent

    def share(self, gpu: Device, replicas: int) -> Share | None:
        if self.limits == "none" or replicas <= 1:
            return None
        if self.memory_mib is not None:
            memory = min(self.memory_mib, gpu.memory_mib)
        elif self.memory_percent is not None:
            memory = gpu.memory_mib * self.memory_percent // 100
        else:
            memory = gpu.memory_mib // replicas
        return Share(self.limits, memory, self.cores or max(1, 100 // replicas))


NOT_HELD = Sharing()


@dataclass(frozen=True)
class Resource:
    name: str
    gpus: tuple[Device, ...]
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    sharing: Sharing = NOT_HELD
    mig: tuple[MigDevice, ...] = ()  # the MIG devices behind `gpus`, where they are MIG

    def mig_of(self, uuid: str) -> MigDevice | None:
        return next((m for m in self.mig if m.uuid == uuid), None)

    @property
    def shared(self) -> bool:
        return self.replicas > 1

    def share_of(self, gpu: Device) -> Share | None:
        """What each replica of `gpu` may use, where a mechanism holds it to that."""
        return self.sharing.share(gpu, self.replicas)

    def ids_of(self, gpu: Device) -> list[str]:
        if not self.shared:
            return [gpu.uuid]
        return [f"{gpu.uuid}{REPLICA_SEPARATOR}{n}" for n in range(self.replicas)]

    def ids(self) -> list[str]:
        return [i for gpu in self.gpus for i in self.ids_of(gpu)]

    def gpu_of(self, device_id: str) -> Device | None:
        """The physical GPU behind a device ID, None if the ID is not one of ours."""
        uuid, sep, replica = device_id.partition(REPLICA_SEPARATOR)
        if bool(sep) != self.shared:
            return None
        if sep and not (replica.isdigit() and int(replica) < self.replicas):
            return None
        return next((g for g in self.gpus if g.uuid == uuid), None)

    @property
    def socket_name(self) -> str:
        """The socket file name in the kubelet's device plugin directory."""
        return "gpuwire-" + self.name.replace("/", "_") + ".sock"


def assign(
    devices: Iterable[Device],
    rules: Iterable[Rule],
    default_name: str,
    replicas: int = 1,
    fail_requests_greater_than_one: bool = False,
    sharing: Sharing = NOT_HELD,
) -> list[Resource]:
    """Resources in the order their first GPU appears; a resource without GPUs is left out."""
    rules = list(rules)
    groups: dict[str, list[Device]] = {}
    counts: dict[str, int] = {}
    for device in sorted(devices, key=lambda d: d.index):
        rule = next((r for r in rules if r.matches(device.product)), None)
        name = rule.name if rule else default_name
        groups.setdefault(name, []).append(device)
        counts.setdefault(
            name, replicas if rule is None or rule.replicas is None else rule.replicas
        )
    return [
        Resource(name, tuple(gpus), counts[name], fail_requests_greater_than_one, sharing)
        for name, gpus in groups.items()
    ]


def of_node(
    node: NodeGpus,
    mig_strategy: str,
    rules: Iterable[Rule],
    default_name: str,
    replicas: int = 1,
    fail_requests_greater_than_one: bool = False,
    sharing: Sharing = NOT_HELD,
) -> tuple[list[Resource], Advertised]:
    """A node's resources: whole GPUs by the rules (`assign`), MIG devices by the MIG
    strategy; with what the strategy made of the node. `sharing` holds whole GPUs' replicas
    to their share (MIG devices are not shared that way)."""
    advertised = migstrategy.advertise(node, mig_strategy, default_name)
    out = assign(
        advertised.gpus, rules, default_name, replicas, fail_requests_greater_than_one, sharing
    )
    parents = {d.uuid: d for d in node.devices}
    for name, devices in advertised.mig.items():
        gpus = tuple(as_device(m, parents[m.parent_uuid]) for m in devices)
        out.append(Resource(name, gpus, replicas, fail_requests_greater_than_one, mig=devices))
    return out, advertised
