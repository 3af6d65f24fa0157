"""Which resource each AMD device is advertised under: AMD's device plugin's naming. Pure.

As ROCm/k8s-device-plugin names them (`docs/user-guide/configuration.md`, flag
`-resource_naming_strategy`): `single` (its default) advertises every device, a whole GPU or a
partition, as `amd.com/gpu`, and refuses a node whose partitioned GPUs are in more than one
partition type; `mixed` advertises one resource per partition type present
(`amd.com/cpx_nps4: 64` for eight MI300X in CPX/NPS4, `amd.com/spx_nps1: 8` in SPX), and GPUs
without partition modes (MI210, Radeon) as `amd.com/gpu`. Devices are their unique ids
(`Device.uuid`), as the allocation token and the runtime name them. Each resource is an
`AmdResource`: with KFD's facts of its devices, which AMD's preferred allocation reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from deviceplugin.plugin.resources import Resource
from gpuwire import amd
from gpuwire.kfd import AmdGpu, AmdNode

NAMINGS = ("single", "mixed")


class NamingError(ValueError):
    """A node the naming cannot advertise; the message says why and what would."""


@dataclass(frozen=True, kw_only=True)
class AmdResource(Resource):
    kfd: tuple[AmdGpu, ...] = ()  # KFD's facts of `gpus`, in their order


def kfd_of(resource: Resource) -> tuple[AmdGpu, ...]:
    """KFD's facts of an AMD node's resource (AMD's modules are handed only AMD's)."""
    assert isinstance(resource, AmdResource), resource
    return resource.kfd


def names(node: AmdNode, naming: str) -> dict[str, str]:
    """Each device's resource, by uuid."""
    if naming == "mixed":
        return {
            g.device.uuid: f"{amd.LABEL_PREFIX}{g.partition_type}"
            if g.partition_type
            else amd.RESOURCE
            for g in node.gpus
        }
    kinds = sorted({g.partition_type for g in node.gpus if g.partition_type})
    if len(kinds) > 1:
        raise NamingError(
            f"the node's GPUs are partitioned in {len(kinds)} ways ({', '.join(kinds)}): the "
            f"single naming advertises every device as {amd.RESOURCE} and cannot tell them "
            "apart; accepted: one partition type on the node, or --amd-naming mixed"
        )
    return {g.device.uuid: amd.RESOURCE for g in node.gpus}


def of_node(node: AmdNode, naming: str) -> list[Resource]:
    """The node's resources, each with its devices and their KFD facts (for preferred
    allocation), in name order."""
    by_name: dict[str, list[int]] = {}
    for i, name in enumerate(names(node, naming).values()):
        by_name.setdefault(name, []).append(i)
    return [
        AmdResource(
            name,
            tuple(node.gpus[i].device for i in chosen),
            kfd=tuple(node.gpus[i] for i in chosen),
        )
        for name, chosen in sorted(by_name.items())
    ]
