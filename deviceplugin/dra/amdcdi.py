"""An AMD claim's CDI spec: `/dev/kfd` and exactly the claim's render nodes, nothing else.

The same spec as NVIDIA's claims (`deviceplugin.dra.cdi`: one transient spec per claim, kind
`k8s.gpu.gpuwire.io/claim`, one device `<claim UID>-<device>` per allocated device with a
read-only mount of the claim's token at that device's place, the proof gpuwire's runtime
accepts), with an AMD container's edits (`gpuwire.amdedits`, as the shim gives them): each
device holds its GPU's or partition's render node, and the common edits `/dev/kfd` and
`AMD_VISIBLE_DEVICES` naming the claim's devices by unique id. No driver files, no hook:
ROCm's user space is in the image. KFD lets a process use a GPU only where its device cgroup
allows that GPU's render node, so the render nodes the engine allows are the GPUs the
container has (docs/amd.md). Card nodes, which ROCm's compute does not need, are not given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deviceplugin.dra.cdi import KIND, host_paths, token_mount, unique
from deviceplugin.dra.claims import ClaimError, ClaimRef, Result
from deviceplugin.dra.shares import NOTHING, Holders
from gpuwire import amd, amdedits, cdi, claimtoken
from gpuwire.edits import Edits
from gpuwire.kfd import AmdNode

if TYPE_CHECKING:
    from gpuwire.vendor import Found


def _gpu_of(found: AmdNode, ref: ClaimRef, result: Result) -> Any:
    """The device as KFD lists it now (a repartition may have removed it since)."""
    gpu = next((g for g in found.gpus if g.device.uuid == result.device.gpu.uuid), None)
    if gpu is None:
        raise ClaimError(
            f"claim {ref}: {result.device.gpu.uuid} ({result.device.name}) is not in KFD's "
            f"topology under {found.roots.sys}"
        )
    if gpu.device.minor < amd.RENDER_MINOR_BASE:
        raise ClaimError(f"claim {ref}: {result.device.name} has no render node: {gpu.problem}")
    return gpu


def claim_spec(
    found: Found,
    ref: ClaimRef,
    results: Sequence[Result],
    capabilities: tuple[str, ...],
    named: Sequence[claimtoken.ClaimDevice],
    hook: str,
    ldconfig: str,
    token: str,
    host_root: str = "/",
    holders: Holders = NOTHING,
) -> dict[str, Any]:
    """The spec for a claim's results on an AMD node (pure, given KFD's node); `named`: their
    `claim_devices`, whose ids `AMD_VISIBLE_DEVICES` lists in the allocation's order.
    Capabilities, hook, ldconfig and holders are NVIDIA's: an AMD claim has none."""
    assert isinstance(found, AmdNode)
    devices = []
    for r in unique(results):
        gpu = _gpu_of(found, ref, r)
        nodes = amdedits.gpu_nodes(found, (gpu.device,), cards=False)
        device = cdi.device(f"{ref.uid}-{r.device.name}", cdi.device_nodes(nodes))
        device["containerEdits"]["mounts"] = [token_mount(token, ref, r.device.name)]
        devices.append(device)
    env = {amd.VISIBLE_DEVICES_ENV: ",".join(d.uuid for d in named)}
    common = Edits(env, cdi.device_nodes([found.kfd] if found.kfd else []), [], [], [], [])
    return host_paths(cdi.assemble(KIND, devices, common, "", ""), host_root)
