"""What the node agent and the kubelet device plugin do differently per vendor, in one place:
where the node's GPUs are found (`discovery`, `check_sim`), which resources they are advertised
under (`resources`), which devices a container should get (`preferred`), and the node's labels
and `gpuwire.io/gpus` (`labels`, `annotation`, `owned`). A node runs one vendor, its config's
`vendor`; `of` gives its `NodeVendor`, and the roles call what differs through it, so no other
module asks which vendor it has. The rest (health, tokens, Allocate, the kubelet's sockets,
the jobs) is the same for every vendor; the DRA plugin's differences are `dra.vendors`'.

NVIDIA's: NVML or the simulated node, resources by the rules, the MIG strategy and sharing
(`plugin.resources`), preferred allocation by NVLink (`plugin.preferred`), GPU Feature
Discovery's labels (`agent.labels`). AMD's: sysfs (`gpus.amd`), AMD's device plugin's naming
(`plugin.amdresources`), its best-effort rules (`plugin.amdpreferred`), its node labeller's
labels (`agent.amdlabels`); they read KFD's facts, which AMD's discovery and naming hand on
(`gpus.amd.AmdNodeGpus`, `plugin.amdresources.AmdResource`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from deviceplugin.agent import amdlabels, labels
from deviceplugin.config import Config
from deviceplugin.gpus import amd as amdgpus
from deviceplugin.gpus.backend import open_discovery
from deviceplugin.gpus.discovery import Discovery, NodeGpus
from deviceplugin.plugin import amdpreferred, amdresources, preferred, resources
from deviceplugin.plugin.migstrategy import Advertised
from deviceplugin.plugin.resources import Resource
from gpuwire import amdsim, sim
from gpuwire.vendor import AMD, NVIDIA, Vendor

Advertising = tuple[list[Resource], Advertised]
Preferred = Callable[[Resource, Sequence[str], Sequence[str], int], list[str]]


@dataclass(frozen=True)
class NodeVendor:
    vendor: Vendor  # its names, env and device nodes (gpuwire.vendor)
    # the node's GPUs: the simulated node's under the root given, else the host's
    discovery: Callable[[str | None], Discovery]
    check_sim: Callable[[str], None]  # fails, saying what to do, unless the root holds its node
    # what the node advertises, and what NVIDIA's MIG strategy made of it
    resources: Callable[[Config, NodeGpus], Advertising]
    # GetPreferredAllocation: (resource, available, must-include, size) → the device IDs
    preferred: Preferred
    # the node's labels, given the limit profiles it enforces
    labels: Callable[[Config, NodeGpus, tuple[str, ...]], dict[str, str]]
    # `gpuwire.io/gpus`: the node, its advertised resources, the devices unhealthy
    annotation: Callable[[NodeGpus, Sequence[Resource], Collection[str]], str]
    owned: tuple[str, ...]  # the label keys (and prefixes) its labels are written under


def _nvidia_resources(config: Config, node: NodeGpus) -> Advertising:
    """Whole GPUs by the rules, MIG devices by the MIG strategy (`resources.of_node`), and
    what the strategy made of the node. Where a mechanism holds each replica to its share, a
    request for more than one replica is refused (NVIDIA's plugin forces it for MPS): a share
    is one replica's of one GPU, and an MPS client joins one daemon."""
    refuse_many = config.fail_requests_greater_than_one or config.sharing.limits != "none"
    return resources.of_node(
        node,
        config.mig_strategy,
        config.rules,
        config.default_resource,
        config.shared_replicas,
        refuse_many,
        config.sharing,
    )


def _nvidia_labels(config: Config, node: NodeGpus, enforced: tuple[str, ...]) -> dict[str, str]:
    found, advertised = _nvidia_resources(config, node)
    return labels.labels(
        node, found, config.rename_by_default, config.mig_strategy, advertised, enforced
    )


def _amd_resources(config: Config, node: NodeGpus) -> Advertising:
    """AMD's naming; no MIG, no sharing."""
    return amdresources.of_node(amdgpus.kfd_of(node), config.amd_naming), Advertised()


def _amd_preferred(
    resource: Resource, available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    return amdpreferred.preferred(amdresources.kfd_of(resource), available, must_include, size)


def _amd_labels(config: Config, node: NodeGpus, enforced: tuple[str, ...]) -> dict[str, str]:
    return amdlabels.labels(amdgpus.kfd_of(node))


def _amd_annotation(
    node: NodeGpus, advertised: Sequence[Resource], unhealthy: Collection[str]
) -> str:
    names = {g.uuid: r.name for r in advertised for g in r.gpus}
    return amdlabels.gpus_annotation(amdgpus.kfd_of(node), names, unhealthy)


NVIDIA_NODE = NodeVendor(
    NVIDIA,
    open_discovery,
    sim.check_root,
    _nvidia_resources,
    preferred.preferred,
    _nvidia_labels,
    labels.gpus_annotation,
    labels.OWNED,
)
AMD_NODE = NodeVendor(
    AMD,
    amdgpus.open_discovery,
    amdsim.check_root,
    _amd_resources,
    _amd_preferred,
    _amd_labels,
    _amd_annotation,
    amdlabels.OWNED,
)
NODE_VENDORS = (NVIDIA_NODE, AMD_NODE)


def of(name: str) -> NodeVendor:
    """The node's vendor (its config's `vendor`, already checked)."""
    return next(v for v in NODE_VENDORS if v.vendor.name == name)
