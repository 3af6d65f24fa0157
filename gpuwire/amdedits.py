"""What an AMD GPU container gets, as data: `/dev/kfd` and its devices' DRM nodes, nothing else.

ROCm's user space lives in the image, so there are no driver files to mount, no links and no
ld cache (`gpuwire.edits` for NVIDIA's). A container gets `/dev/kfd` (KFD's one compute node)
and each granted GPU's or partition's render node, `card<N>` too where the node's config
asks for them (`amd-cards`: ROCm's compute needs only the render nodes, as ROCm's docs say;
display and some graphics APIs want the card), each with the numbers the cgroup allow rule
needs: KFD checks that rule per GPU (`kfd_devcgroup_check_permission`), so the cgroup is
what keeps a sibling's GPU out. The environment names the devices given
(`AMD_VISIBLE_DEVICES`, their unique ids), for the container and for the inventory's readers;
no ROCm variable is set (`gpuwire.amd`). The CDI spec has a device per GPU or partition
under its index and its unique id, plus `all`, as AMD's container toolkit names them (kind
`amd.com/gpu`), with `/dev/kfd` in its common edits.
"""

from __future__ import annotations

from gpuwire import amd
from gpuwire.edits import Edits, device_node

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuwire.devices import CharDevice, Device
    from gpuwire.kfd import AmdNode


def gpu_nodes(node: AmdNode, devices: tuple[Device, ...], cards: bool) -> list[CharDevice]:
    """Each device's render node, and its card node where `cards`."""
    out = []
    for device in devices:
        gpu = node.gpu(device)
        out.append(node.render_node(gpu))
        card = node.card_node(gpu) if cards else None
        if card is not None:
            out.append(card)
    return out


def container_edits(node: AmdNode, devices: tuple[Device, ...], cards: bool = False) -> Edits:
    """The edits for a container granted `devices` (GPUs or partitions)."""
    nodes = ([node.kfd] if node.kfd else []) + gpu_nodes(node, devices, cards)
    env = {amd.VISIBLE_DEVICES_ENV: ",".join(d.uuid for d in devices) or "none"}
    return Edits(env, [device_node(n) for n in nodes], [], [], [], [])


def generate(node: AmdNode, kind: str = amd.CDI_KIND, cards: bool = False) -> dict[str, Any]:
    """The CDI spec for every GPU and partition of `node`; the common edits hold `/dev/kfd`
    and `AMD_VISIBLE_DEVICES=void` (the engine has injected the devices: no AMD runtime
    further down may inject again from an image's `AMD_VISIBLE_DEVICES=all`)."""
    from gpuwire import cdi

    if not node.gpus:
        raise cdi.CdiError(f"KFD under {node.roots.sys} lists no GPU: a CDI spec needs a device")
    devices = [
        cdi.device(name, cdi.device_nodes(gpu_nodes(node, (d,), cards)))
        for d in node.devices
        for name in (str(d.index), d.uuid)
    ]
    devices.append(cdi.device(cdi.ALL, cdi.device_nodes(gpu_nodes(node, node.devices, cards))))
    common = Edits(
        {amd.VISIBLE_DEVICES_ENV: "void"},
        cdi.device_nodes([node.kfd] if node.kfd else []),
        [],
        [],
        [],
        [],
    )
    return cdi.assemble(kind, devices, common, "", "")
