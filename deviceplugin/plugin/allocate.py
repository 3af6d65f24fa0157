"""Allocate: the checks that refuse a bad request, and the answer for one container. Pure.

The answer always carries the proof of allocation (`gpuwire.allocation`): a read-only mount
of the token file the plugin wrote, which the runtime side verifies and takes the devices
from, plus `NVIDIA_VISIBLE_DEVICES` with the physical GPUs' UUIDs for tools that read it.
Optional strategies add `DeviceSpec`s (the kubelet then creates the device nodes and cgroup
rules itself, e.g. for the static CPU manager) and CDI device names (for runtimes that
inject through CDI, named as `gpuwire cdi generate` names them: by UUID or by index). A MIG
device's `DeviceSpec`s are its parent's node and its two capability nodes; its CDI name by
index is `<gpu>:<gi>:<ci>`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from deviceplugin.api import api_pb2
from deviceplugin.plugin.resources import REPLICA_SEPARATOR, Resource
from gpuwire import allocation, hamicore, mig, mps, nvidia
from gpuwire.allocation import Share
from gpuwire.devices import Device, MigDevice
from gpuwire.vendor import NVIDIA, Vendor

CDI_NAMES = ("none", "uuid", "index")


class AllocateError(ValueError):
    """A device request the plugin refuses; the message names the device and why."""


@dataclass(frozen=True)
class Strategies:
    device_specs: bool = False
    cdi: str = "none"  # one of CDI_NAMES
    cdi_kind: str = nvidia.CDI_KIND
    dev_root: str = "/"


def granted(resource: Resource, ids: Sequence[str], unhealthy: Collection[str]) -> list[Device]:
    """The physical GPUs behind a container's device IDs, by index; AllocateError if any ID
    is unknown, repeated or unhealthy, or the request is too large for a shared GPU."""
    if not ids:
        raise AllocateError(f"empty request: no {resource.name} device IDs")
    if resource.shared and resource.fail_requests_greater_than_one and len(ids) > 1:
        raise AllocateError(
            f"request for '{resource.name}: {len(ids)}' too large: "
            "maximum request size for shared resources is 1"
        )
    gpus: dict[str, Device] = {}
    seen: set[str] = set()
    for device_id in ids:
        gpu = resource.gpu_of(device_id)
        if gpu is None:
            form = (
                f"<uuid>{REPLICA_SEPARATOR}<0-{resource.replicas - 1}>"
                if resource.shared
                else "<uuid>"
            )
            raise AllocateError(
                f"unknown device {device_id!r}: not a {resource.name} device of this node "
                f"(IDs are {form} of its {len(resource.gpus)} GPUs)"
            )
        if device_id in seen:
            raise AllocateError(f"device {device_id!r} is requested twice")
        if gpu.uuid in unhealthy:
            raise AllocateError(f"device {device_id!r} (GPU {gpu.index}, {gpu.uuid}) is unhealthy")
        seen.add(device_id)
        gpus[gpu.uuid] = gpu
    return sorted(gpus.values(), key=lambda g: g.index)


def share_env(share: Share | None) -> dict[str, str]:
    """A replica's share as the variables of the mechanism that holds it (the runtime
    applies the token's share; these say it to the container, and to the prestart hook,
    which cannot change a created container's environment)."""
    if share is None:
        return {}
    if share.mechanism == "mps":
        return mps.limit_env(share.memory_mib, share.cores)
    return hamicore.limit_env(share.memory_mib, share.cores)


def response(
    gpus: Sequence[Device],
    token: str,
    allocation_dir: str,
    strategies: Strategies,
    control_nodes: Sequence[str] = (),
    mig_devices: Sequence[MigDevice] = (),
    share: Share | None = None,
    vendor: Vendor = NVIDIA,
) -> api_pb2.ContainerAllocateResponse:
    """The answer for one container. `control_nodes`: names under /dev that exist on the host
    (nvidiactl, nvidia-uvm, ...), passed through as DeviceSpecs with the GPUs' own nodes.
    `mig_devices`: those of `gpus` that are MIG devices; `share`: a shared replica's, where a
    mechanism holds it."""
    of = {m.uuid: m for m in mig_devices}
    answer = api_pb2.ContainerAllocateResponse(
        envs={vendor.visible_env: ",".join(g.uuid for g in gpus), **share_env(share)},
        mounts=[
            api_pb2.Mount(
                container_path=allocation.container_path(token),
                host_path=os.path.join(allocation_dir, token),
                read_only=True,
            )
        ],
    )
    if strategies.device_specs:
        own = [name for g in gpus for name in vendor.gpu_node_names(g)]
        own += [mig.cap_name(c) for g in gpus if g.uuid in of for c in _caps(of[g.uuid])]
        for name in [*control_nodes, *dict.fromkeys(own)]:
            answer.devices.append(
                api_pb2.DeviceSpec(
                    container_path=f"/dev/{name}",
                    host_path=os.path.join(strategies.dev_root, "dev", name),
                    permissions="rw",
                )
            )
    if strategies.cdi != "none":
        for g in gpus:
            name = g.uuid if strategies.cdi == "uuid" else str(g.index)
            if g.uuid in of and strategies.cdi == "index":
                name = of[g.uuid].place
            answer.cdi_devices.append(api_pb2.CDIDevice(name=f"{strategies.cdi_kind}={name}"))
    return answer


def _caps(device: MigDevice) -> tuple[int, int]:
    return device.gi_cap, device.ci_cap
