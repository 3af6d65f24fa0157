"""NVIDIA's MIG strategies: what a node with MIG-enabled GPUs advertises, and as what. Pure.

As NVIDIA's device plugin (README "MIG support"; `internal/rm/device_map.go`):

- `none`: MIG is ignored; every GPU is a `nvidia.com/gpu` (a MIG-enabled one with all its
  MIG devices).
- `single`: the MIG devices are the node's `nvidia.com/gpu`. Every GPU must have the same
  MIG mode, each MIG-enabled GPU at least one MIG device, and all MIG devices the same
  profile; a node where MIG is off everywhere advertises its GPUs.
- `mixed`: GPUs without MIG are `nvidia.com/gpu`; each MIG profile is a resource of its own,
  `nvidia.com/mig-<profile>` with `+` as `.` (`mig-1g.10gb.me`). Only profiles whose compute
  instance spans its GPU instance get one (`1c.3g.40gb` does not).

Where NVIDIA's plugin refuses to start (a `single` node that breaks a rule, a GPU in MIG
mode without MIG devices yet), gpuwire advertises nothing for what is wrong (a `single`
node's `nvidia.com/gpu` with no devices), says why, and looks again: MIG devices created
later are advertised then, without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deviceplugin.gpus.discovery import NodeGpus
from gpuwire import nvidia
from gpuwire.devices import Device, MigDevice

STRATEGIES = ("none", "single", "mixed")


@dataclass(frozen=True)
class Advertised:
    gpus: tuple[Device, ...] = ()  # whole GPUs: the default resource or a per-model one
    mig: dict[str, tuple[MigDevice, ...]] = field(default_factory=dict)  # resource → devices
    problems: tuple[str, ...] = ()  # why something is not advertised
    invalid: bool = False  # a `single` node breaking its rules (GFD: `<model>-MIG-INVALID`)


def whole(profile: str) -> bool:
    """Whether a profile's compute instance spans its GPU instance (`3g.40gb`, not
    `1c.3g.40gb`)."""
    return not profile.partition(".")[0].endswith("c")


def advertise(node: NodeGpus, strategy: str, gpu_resource: str) -> Advertised:
    """What `node` advertises under `strategy`; `gpu_resource` is the default resource."""
    if strategy == "none":
        return Advertised(node.devices)
    enabled = [g for g in node.gpus if g.mig_enabled]
    empty = [
        f"GPU {g.device.index} is in MIG mode but has no MIG devices yet"
        for g in enabled
        if not node.mig_of(g.device.uuid)
    ]
    if strategy == "single":
        return _single(node, gpu_resource, empty)
    mig: dict[str, list[MigDevice]] = {}
    problems = list(empty)
    for m in node.mig_devices:
        if whole(m.profile):
            mig.setdefault(nvidia.mig_resource(m.profile), []).append(m)
        else:
            problems.append(f"MIG device {m.uuid} ({m.profile}) has no mixed-strategy resource")
    gpus = tuple(g.device for g in node.gpus if not g.mig_enabled)
    return Advertised(gpus, {k: tuple(v) for k, v in sorted(mig.items())}, tuple(problems))


def _single(node: NodeGpus, resource: str, empty: list[str]) -> Advertised:
    modes = {bool(g.mig_enabled) for g in node.gpus}
    if modes == {False} or not node.gpus:
        return Advertised(node.devices)
    problems = list(empty)
    if len(modes) > 1:
        off = [str(g.device.index) for g in node.gpus if not g.mig_enabled]
        problems.append(
            "all devices on the node must be configured with the same migEnabled value "
            f"(MIG is off on GPU {', '.join(off)})"
        )
    profiles = sorted({m.profile for m in node.mig_devices})
    if len(profiles) > 1:
        problems.append(f"more than one MIG device type present on node: {', '.join(profiles)}")
    if problems:  # the resource stays, with no devices, until the node is right
        return Advertised(mig={resource: ()}, problems=tuple(problems), invalid=True)
    return Advertised(mig={resource: node.mig_devices})
