"""The OCI runtime spec (`config.json`): what gpuwire reads from it, and `apply`.

`apply(spec, edits)` is the one function that puts container edits into a spec, the way
CDI applies `containerEdits`: device nodes into `linux.devices` with an allow rule in
`linux.resources.devices` (so runc programs the device cgroup, v1 or v2, itself), bind
mounts, and the environment. It returns a new spec and leaves its input alone. It is
idempotent: a device node, allow rule or mount the spec has already (an engine applied the
same edits from a CDI spec) is not added again. (Links and
the ld cache are not in the spec: the shim makes them, `runtime_hook.injection.inject.prepare`.)

Environment with a key set more than once (containerd appends rather than replaces in some
paths, and the kubelet sends device-plugin and pod env separately): gpuwire reads the
**last** value, as runc up to 1.2 and NVIDIA's toolkit do, and `apply` removes every
occurrence of each key it sets before appending the final value, so what was checked is
exactly what the process sees, whichever occurrence its libc would have picked.
"""

from __future__ import annotations

import os

from gpuwire import allocation, atomicfile, devices, lightjson
from gpuwire.vendor import VENDORS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpuwire.edits import Edits

    Spec = dict[str, Any]


def load(bundle: str) -> Spec:
    path = os.path.join(bundle, "config.json")
    with open(path, "rb") as f:
        spec = lightjson.loads(f.read())
    if not isinstance(spec, dict):
        raise ValueError(f"{path} is not a JSON object")
    return spec


def save(bundle: str, spec: Spec) -> None:
    """Replace `<bundle>/config.json` atomically, keeping its mode."""
    path = os.path.join(bundle, "config.json")
    mode = os.stat(path).st_mode & 0o7777
    atomicfile.replace(
        path, lightjson.dumps(spec).encode(), mode, durable=False
    )  # lives as its container


def env_entries(spec: Spec) -> list[tuple[str, str]]:
    """`process.env` as (key, value) pairs in order, duplicates kept."""
    process = spec.get("process") or {}
    pairs = []
    for entry in process.get("env") or ():
        key, _, value = str(entry).partition("=")
        pairs.append((key, value))
    return pairs


def env(spec: Spec) -> dict[str, str]:
    """The environment as gpuwire reads it: the last value of each key."""
    return dict(env_entries(spec))


def conflicting_env(spec: Spec, keys: tuple[str, ...]) -> dict[str, list[str]]:
    """Keys among `keys` that are set more than once to different values."""
    seen: dict[str, list[str]] = {}
    for key, value in env_entries(spec):
        if key in keys:
            seen.setdefault(key, []).append(value)
    return {k: v for k, v in seen.items() if len(set(v)) > 1}


def asks_for_gpu(spec: Spec) -> bool:
    """Whether a container could get a GPU at all: any vendor's request not void
    (`Vendor.visible_request`: for NVIDIA a legacy CUDA image that does not set one), or a
    device-plugin allocation mounted. Every other container is left alone at once, without
    reading the node config (most containers on a node that runs the hook for all)."""
    environment = env(spec)
    if any(v.visible_request(environment).kind is not devices.Kind.VOID for v in VENDORS):
        return True
    prefix = allocation.CONTAINER_DIR + "/"
    return any(str(m.get("destination", "")).startswith(prefix) for m in mounts(spec))


# Where a CDI spec puts gpuwire's ld-cache hook (`gpuwire.cdi.LDCACHE_HOOK`; specs written
# before it moved to createRuntime have it in createContainer), and how it is called.
LDCACHE_HOOK_KINDS = ("createRuntime", "createContainer")
LDCACHE_HOOK_ARGS = ["gpuwire-hook", "ldcache"]


def _is_ldcache_hook(hook: Any) -> bool:
    return list(hook.get("args") or ())[:2] == LDCACHE_HOOK_ARGS


def ldcache_hooks(spec: Spec) -> list[list[str]]:
    """The arguments (after `gpuwire-hook ldcache`) of each distinct gpuwire ld-cache hook in
    the spec: one per CDI spec that brought one (a container of two claims has two)."""
    hooks = spec.get("hooks") or {}
    found = [
        [str(a) for a in h.get("args") or ()][2:]
        for kind in LDCACHE_HOOK_KINDS
        for h in hooks.get(kind) or ()
        if _is_ldcache_hook(h)
    ]
    return [list(args) for args in dict.fromkeys(tuple(a) for a in found)]


def without_ldcache_hooks(spec: Spec) -> Spec:
    """`spec` without the ld-cache hooks `ldcache_hooks` found (their work done before runc:
    the shim's)."""
    hooks = {
        kind: [h for h in entries if kind not in LDCACHE_HOOK_KINDS or not _is_ldcache_hook(h)]
        for kind, entries in (spec.get("hooks") or {}).items()
    }
    return {**spec, "hooks": {kind: entries for kind, entries in hooks.items() if entries}}


def annotations_of(spec: Spec) -> dict[str, str]:
    return {str(k): str(v) for k, v in (spec.get("annotations") or {}).items()}


def bounding_capabilities(spec: Spec) -> list[str]:
    process = spec.get("process") or {}
    return list((process.get("capabilities") or {}).get("bounding") or ())


def mounts(spec: Spec) -> list[dict[str, Any]]:
    return list(spec.get("mounts") or ())


def destination(mount: dict[str, Any]) -> str:
    """A mount's destination, absolute and normalised (runc takes a relative one from `/`)."""
    return os.path.normpath("/" + str(mount.get("destination", "")).lstrip("/"))


def _is_bind(mount: dict[str, Any]) -> bool:
    options = mount.get("options") or ()
    return mount.get("type") == "bind" or "bind" in options or "rbind" in options


def passed_through(spec: Spec, paths: Iterable[str]) -> list[tuple[str | None, str, str]]:
    """What runc passes through to reach each of `paths` (absolute, in the container) as it
    mounts there: (the host directory a bind mount of the spec's brings, the path in it, the
    mount's destination) for each volume the path lies under, innermost first, then (None,
    the path in the image, ""). runc resolves a destination in the root as the spec's earlier
    mounts left it, following links; each mount's own destination is reached the same way.
    A volume's files are the pod's (an init container's, another container's, an earlier
    pod's), as the image's are, so a link in either leads a mount elsewhere; a mount of a
    new filesystem (runc's `/dev` tmpfs) holds none of them: only the way to it counts."""
    out: list[tuple[str | None, str, str]] = []
    for path in paths:
        before = mounts(spec)
        while True:
            for i in range(len(before) - 1, -1, -1):  # the last mount there is the one seen
                over = destination(before[i])
                if over != "/" and (path == over or path.startswith(over + "/")):
                    break
            else:
                out.append((None, path, ""))
                break
            if path != over and _is_bind(before[i]):
                out.append((str(before[i].get("source", "")), path[len(over) :], over))
            path, before = over, before[:i]
    return out


def rootfs(spec: Spec, bundle: str) -> str:
    """The container's root directory (`root.path`, relative to the bundle or absolute)."""
    path = str((spec.get("root") or {}).get("path") or "rootfs")
    return os.path.normpath(os.path.join(bundle, path))


def missing(spec: Spec, edits: Edits) -> Edits:
    """The part of `edits` the spec lacks: its device nodes and mounts but those an engine
    wrote into it already (a claim's CDI spec, the kubelet's device specs), as `apply` leaves
    them out; links, ld cache and env whole."""
    from gpuwire.edits import Edits

    linux = spec.get("linux") or {}
    nodes = {(d.get("path"), d.get("major"), d.get("minor")) for d in linux.get("devices") or ()}
    present = {(m.get("destination"), m.get("source")) for m in mounts(spec)}
    return Edits(
        edits.env,
        [n for n in edits.device_nodes if (n["path"], n["major"], n["minor"]) not in nodes],
        [m for m in edits.mounts if (m["containerPath"], m["hostPath"]) not in present],
        edits.links,
        edits.ldcache_folders,
        edits.ldcache_entries,
    )


def apply(spec: Spec, edits: Edits) -> Spec:
    """`spec` with `edits` in it."""
    out = dict(spec)
    process = dict(spec.get("process") or {})
    replaced = set(edits.env)
    kept = [e for e in process.get("env") or () if str(e).partition("=")[0] not in replaced]
    process["env"] = kept + [f"{k}={v}" for k, v in edits.env.items()]
    out["process"] = process

    if edits.device_nodes:
        linux = dict(spec.get("linux") or {})
        paths = {n["path"] for n in edits.device_nodes}
        devices = [d for d in linux.get("devices") or () if d.get("path") not in paths]
        devices += [
            {
                "path": n["path"],
                "type": n["type"],
                "major": n["major"],
                "minor": n["minor"],
                "fileMode": n["fileMode"],
                "uid": n["uid"],
                "gid": n["gid"],
            }
            for n in edits.device_nodes
        ]
        resources = dict(linux.get("resources") or {})
        rules = list(resources.get("devices") or ())
        for n in edits.device_nodes:
            rule = {
                "allow": True,
                "type": n["type"],
                "major": n["major"],
                "minor": n["minor"],
                "access": n["permissions"],
            }
            if rule not in rules:
                rules.append(rule)
        resources["devices"] = rules
        linux["devices"] = devices
        linux["resources"] = resources
        out["linux"] = linux

    if edits.mounts:
        present = {(m.get("destination"), m.get("source")) for m in mounts(spec)}
        out["mounts"] = mounts(spec) + [
            {
                "destination": m["containerPath"],
                "type": m["type"],
                "source": m["hostPath"],
                "options": list(m["options"]),
            }
            for m in edits.mounts
            if (m["containerPath"], m["hostPath"]) not in present
        ]

    return out
