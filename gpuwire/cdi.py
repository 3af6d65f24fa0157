"""A CDI spec for this node's GPUs: the container edits, laid out the way CDI wants them.

The edits are the shim's and the hook's (`gpuwire.edits`), so all three deliveries
inject the same thing. A spec has one device per GPU under two names, its index and its
UUID, one per MIG device under `<gpu>:<gi>:<ci>` and its UUID (where the MIG map names it),
plus `all`; a device holds only its own nodes: `/dev/nvidiaN`, and for a MIG device its
parent's node and its two capability nodes (a MIG-enabled GPU's are those of all its MIG
devices), as NVIDIA's CDI specs do (nvidia-container-toolkit `pkg/nvcdi`). MIG devices
created after the spec was written are not in it: `gpuwire cdi generate` again.

What every GPU container needs (control nodes, the driver's libraries, binaries and
firmware, the ld-cache hook, env) is in the spec's common `containerEdits`, which an engine
applies once when any of the spec's devices is requested. Device nodes carry type, major
and minor, so the engine writes their cgroup allow rules into the OCI spec itself: the
low-level runtime knows them, and a `runc update` cannot silently revoke them as it can
rules written behind its back.

A spec cannot know the image's distro, so libraries go where the host keeps them (relative
to the driver root), as NVIDIA's specs do; the ld-cache hook adds that folder to the
container's cache whatever the distro. The common env sets `NVIDIA_VISIBLE_DEVICES=void`:
the engine has injected the devices, and no NVIDIA-style runtime further down may inject
again from an image's `NVIDIA_VISIBLE_DEVICES=all`.

`cdiVersion` is the lowest the fields used allow (CDI `specs-go/version.go`), so older
engines accept the spec: podman 4.3 reads up to 0.5.0. Facts: the CDI specification
(cncf-tags/container-device-interface `SPEC.md` v1.1.0, `pkg/parser/parser.go`) and NVIDIA's
CDI mode (NVIDIA/nvidia-container-toolkit `pkg/nvcdi`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from gpuwire import nvidia
from gpuwire.driver import Driver
from gpuwire.edits import (
    HOOK_ENV,
    Edits,
    container_edits,
    device_node,
    gpu_nodes,
    host_layout,
    ldcache_args,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypedDict

    from gpuwire.devices import CharDevice
    from gpuwire.edits import DeviceNode, Mount

    class Hook(TypedDict):
        hookName: str
        path: str
        args: list[str]
        env: list[str]
        timeout: int

    class ContainerEdits(TypedDict):
        env: list[str]
        deviceNodes: list[DeviceNode]
        mounts: list[Mount]
        hooks: list[Hook]


HOOK_TIMEOUT = 30
# createRuntime, not createContainer: it runs in the runtime's namespaces, where the resident
# serves it (runtime_hook.start.resident); it enters the container's mount namespace itself.
LDCACHE_HOOK = "createRuntime"
CALL = "gpuwire-call"  # beside the launchers, where the install could build it

Spec = dict[str, Any]

ALL = "all"
# CDI `pkg/parser`: vendor and class start with a letter and end alphanumeric.
_VENDOR = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_CLASS = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_KIND = re.compile(rf"^({_VENDOR})/({_CLASS})$")


class CdiError(ValueError):
    """A spec that cannot be written; the message names the input and what is accepted."""


def check_kind(kind: str) -> str:
    match = _KIND.match(kind)
    if not match or len(match[2]) > 63:
        raise CdiError(
            f"kind {kind!r} is not a CDI kind: expected vendor/class (e.g. nvidia.com/gpu), "
            "each starting with a letter, ending alphanumeric, inner [A-Za-z0-9_.-], "
            "class at most 63 characters"
        )
    return kind


# -- cdiVersion: each version with what first needs it (CDI specs-go/version.go) ---------


def _edits(spec: Spec) -> list[dict[str, Any]]:
    return [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]


def _uses(spec: Spec, field: str) -> bool:
    return any(edits.get(field) for edits in _edits(spec))


VERSIONS: tuple[tuple[str, Callable[[Spec], bool]], ...] = (
    ("0.3.0", lambda spec: True),  # the earliest CDI engines still accept
    ("0.4.0", lambda spec: any(m.get("type") for e in _edits(spec) for m in e.get("mounts", []))),
    (
        "0.5.0",
        lambda spec: (
            any(not d["name"][:1].isalpha() for d in spec["devices"])
            or any(n.get("hostPath") for e in _edits(spec) for n in e.get("deviceNodes", []))
        ),
    ),
    (
        "0.6.0",
        lambda spec: (
            bool(spec.get("annotations"))
            or any(d.get("annotations") for d in spec["devices"])
            or "." in spec["kind"].partition("/")[2]
        ),
    ),
    ("0.7.0", lambda spec: _uses(spec, "additionalGids") or _uses(spec, "intelRdt")),
    ("1.1.0", lambda spec: _uses(spec, "netDevices")),
)


def minimum_version(spec: Spec) -> str:
    """The lowest `cdiVersion` whose fields cover everything `spec` uses."""
    return [version for version, needs in VERSIONS if needs(spec)][-1]


# -- the spec ------------------------------------------------------------------------------


def _normalised(nodes: list[DeviceNode]) -> list[DeviceNode]:
    """hostPaths normalised in place: a dev root of `/` gives `//dev/nvidia0`."""
    for node in nodes:
        node["hostPath"] = os.path.normpath("/" + node["hostPath"].lstrip("/"))
    return nodes


def common_edits(driver: Driver, capabilities: tuple[str, ...]) -> Edits:
    """What every device of a spec brings along: control nodes, the driver's files for
    `capabilities`, and `NVIDIA_VISIBLE_DEVICES=void` (the engine has injected the devices)."""
    common = container_edits(driver, (), capabilities, host_layout(driver))
    common.env[nvidia.VISIBLE_DEVICES_ENV] = "void"
    _normalised(common.device_nodes)
    return common


def device(name: str, nodes: list[DeviceNode]) -> dict[str, Any]:
    """A spec device holding these device nodes (its own copies: YAML would otherwise write
    anchors and aliases)."""
    return {"name": name, "containerEdits": {"deviceNodes": [dict(n) for n in nodes]}}


def device_nodes(found: list[CharDevice]) -> list[DeviceNode]:
    """Character devices as CDI device nodes, host paths normalised."""
    return _normalised([device_node(n) for n in found])


def assemble(
    kind: str, devices: list[dict[str, Any]], common: Edits, hook: str, ldconfig: str
) -> Spec:
    """A whole spec: its devices, the common edits with the ld-cache hook, the lowest
    `cdiVersion` that holds them."""
    check_kind(kind)
    spec: Spec = {
        "cdiVersion": "",
        "kind": kind,
        "devices": devices,
        "containerEdits": dict(to_cdi(common, hook, ldconfig)),
    }
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def generate(
    driver: Driver,
    hook: str,
    ldconfig: str,
    capabilities: tuple[str, ...] = nvidia.CAPABILITIES,
    kind: str = nvidia.CDI_KIND,
) -> Spec:
    """The CDI spec for every GPU of `driver`, with the files of `capabilities`."""
    check_kind(kind)
    if not driver.devices:
        raise CdiError(
            f"the driver under {driver.roots.proc} lists no GPU: a CDI spec needs a device"
        )
    named = [((str(d.index), d.uuid), gpu_nodes(driver, (d,))) for d in driver.devices]
    named += [((m.place, m.uuid), gpu_nodes(driver, (), (m,))) for m in driver.mig]
    devices = [
        device(name, device_nodes(found)) for names, found in named for name in names if name
    ]
    devices.append(device(ALL, device_nodes(gpu_nodes(driver, driver.devices))))
    return assemble(kind, devices, common_edits(driver, capabilities), hook, ldconfig)


def hook_program(launcher: str, host_root: str = "/") -> str:
    """What a spec's hook runs for the `gpuwire-hook` launcher at `launcher` (as the host
    names it; `host_root`: where this process sees the host): the `gpuwire-call` beside it
    where the install built one (runtime_hook.setup.launcher), which is the launcher without
    /bin/sh in front when called as `gpuwire-hook` (the hook's args[0]), resident first and
    the same fallback (its Python, or none: then it waits for the resident); the launcher
    itself where none was built."""
    call = os.path.join(os.path.dirname(launcher), CALL)
    seen = os.path.join(host_root, call.lstrip("/"))
    return call if os.path.isfile(seen) and os.access(seen, os.X_OK) else launcher


def hooks(edits: Edits, hook_path: str, ldconfig: str) -> list[Hook]:
    """The hooks the edits need: one ld-cache hook, or none when no library is mounted."""
    if not edits.ldcache_folders and not edits.links:
        return []
    return [
        {
            "hookName": LDCACHE_HOOK,
            "path": hook_path,
            "args": ["gpuwire-hook", *ldcache_args(edits, ldconfig)],  # gpuwire-call's mode
            "env": list(HOOK_ENV),
            "timeout": HOOK_TIMEOUT,
        }
    ]


def to_cdi(edits: Edits, hook_path: str, ldconfig: str) -> ContainerEdits:
    """The edits as a CDI `containerEdits` object."""
    return {
        "env": [f"{k}={v}" for k, v in edits.env.items()],
        "deviceNodes": list(edits.device_nodes),
        "mounts": list(edits.mounts),
        "hooks": hooks(edits, hook_path, ldconfig),
    }
