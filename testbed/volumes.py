"""A pod's volumes as the kubelet sets them up on a node ("Volumes", kubernetes.io/docs/
concepts/storage/volumes/; "Projected Volumes", .../projected-volumes/; "Configure a
Security Context", .../configure-pod-container/security-context/ for fsGroup), and the CRI
mounts of a container's volumeMounts.

- hostPath: the node's path itself, after the type check (`Directory`, `File`, `Socket`,
  `CharDevice`, `BlockDevice` must already be that; `DirectoryOrCreate` makes a 0755
  directory, `FileOrCreate` a 0644 file; "" checks nothing). The error text is the kubelet's
  (`pkg/volume/hostpath/host_path.go`).
- emptyDir, secret, configMap, downwardAPI, projected (serviceAccountToken, configMap,
  secret, downwardAPI sources): a directory under /var/lib/kubelet/pods/<uid>/volumes/. The
  files of the last four are written the way the kubelet's AtomicWriter writes them
  (`pkg/volume/util/atomic_writer.go`: a hidden `..<timestamp>` directory, `..data` pointing
  at it, each visible name a link through `..data`, swapped in one rename), with `items`,
  `defaultMode` and per-item `mode`, `optional`; re-written on `refresh` when what they
  project changed (the kubelet's periodic sync). A projected token is a bound token from
  the API server's TokenRequest for the pod's service account.
- fsGroup (`pkg/volume/volume_linux.go`, SetVolumeOwnership): the files of those volumes
  and emptyDirs belong to the group, read (secret, configMap, downwardAPI, projected) or
  read-write (emptyDir) for it; directories setgid.

Left out: other volume types (persistent volumes, CSI, ephemeral, image), `medium: Memory`
and `sizeLimit` (an emptyDir is a directory), SELinux relabelling, `subPathExpr`, and
`recursiveReadOnly`.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.cri import api_pb2 as cri

Obj = dict[str, Any]
Read = Callable[[str, str, str], Obj | None]  # (resource, name, namespace) → the object
DATA = "..data"
POD_DIR = "/var/lib/kubelet/pods"
PROPAGATION = {
    "None": cri.PROPAGATION_PRIVATE,
    "HostToContainer": cri.PROPAGATION_HOST_TO_CONTAINER,
    "Bidirectional": cri.PROPAGATION_BIDIRECTIONAL,
}
KINDS = {
    "secret": "kubernetes.io~secret",
    "configMap": "kubernetes.io~configmap",
    "projected": "kubernetes.io~projected",
    "downwardAPI": "kubernetes.io~downward-api",
    "emptyDir": "kubernetes.io~empty-dir",
}


class VolumeError(Exception):
    """A volume the kubelet cannot set up (the pod waits, ContainerCreating, with this)."""


@dataclass(frozen=True)
class Context:
    """What setting up a pod's volumes needs: where the node's `/` is seen from here, the
    API server's objects, and a bound token for the pod's service account."""

    root: Path
    read: Read
    token: Callable[[Obj, int, str], str]  # (pod, seconds, audience) → a bound token

    def seen(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")


def volume_dir(pod: Obj, kind: str, name: str) -> str:
    return f"{POD_DIR}/{pod['metadata']['uid']}/volumes/{KINDS[kind]}/{name}"


def host_path(volume: Obj, ctx: Context) -> str:
    """A hostPath volume's node path, checked or made as its `type` says."""
    spec = volume["hostPath"]
    path, kind = spec["path"], spec.get("type", "")
    seen = ctx.seen(path)
    if kind == "DirectoryOrCreate" and not seen.exists():
        seen.mkdir(mode=0o755, parents=True)
    elif kind == "FileOrCreate" and not seen.exists():
        seen.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        seen.touch(mode=0o644)
    checks = {
        "Directory": (stat.S_ISDIR, "a directory"),
        "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
        "File": (stat.S_ISREG, "a file"),
        "FileOrCreate": (stat.S_ISREG, "a file"),
        "Socket": (stat.S_ISSOCK, "a socket file"),
        "CharDevice": (stat.S_ISCHR, "a character device"),
        "BlockDevice": (stat.S_ISBLK, "a block device"),
    }
    if kind in checks:
        test, what = checks[kind]
        try:
            mode = seen.stat().st_mode
        except FileNotFoundError:
            raise VolumeError(f"hostPath type check failed: {path} is not {what}") from None
        if not test(mode):
            raise VolumeError(f"hostPath type check failed: {path} is not {what}")
    return str(path)


# --- what a volume projects: path → (bytes, mode)

Payload = dict[str, tuple[bytes, int]]


def _items(
    data: Mapping[str, bytes], items: list[Obj] | None, mode: int, what: str, optional: bool
) -> Payload:
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    out: Payload = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeError(
                f"configmap references non-existent config key: {item['key']}"
                if what == "configmap"
                else f"references non-existent secret key: {item['key']}"
            )
        out[item["path"]] = (data[item["key"]], item.get("mode", mode))
    return out


def _source_data(
    kind: str, name: str, namespace: str, ctx: Context, optional: bool
) -> dict[str, bytes] | None:
    resource = "secrets" if kind == "secret" else "configmaps"
    found = ctx.read(resource, name, namespace)
    if found is None:
        if optional:
            return None
        raise VolumeError(f'{kind if kind == "secret" else "configmap"} "{name}" not found')
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (found.get("data") or {}).items()}
    data |= {k: base64.b64decode(v) for k, v in (found.get("binaryData") or {}).items()}
    return data


def field_value(pod: Obj, path: str) -> str:
    """A downward API field (fieldRef.fieldPath) of `pod`."""
    meta = pod["metadata"]
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path == prefix:
            values = meta.get(source) or {}
            return "".join(f'{k}="{v}"\n' for k, v in sorted(values.items()))
        if path.startswith(f"{prefix}['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
    }
    if path not in fields:
        raise VolumeError(f"unsupported fieldPath: {path}")
    return str(fields[path])


def _downward(pod: Obj, items: list[Obj], mode: int, resources: Callable[[Obj], str]) -> Payload:
    out: Payload = {}
    for item in items:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            value = resources(item["resourceFieldRef"])
        out[item["path"]] = (value.encode(), item.get("mode", mode))
    return out


def payload(volume: Obj, pod: Obj, ctx: Context, resources: Callable[[Obj], str]) -> Payload:
    """What a secret, configMap, downwardAPI or projected volume holds now."""
    namespace = pod["metadata"]["namespace"]
    for kind in ("secret", "configMap"):
        if kind in volume:
            spec = volume[kind]
            mode = spec.get("defaultMode", 0o644)
            name = spec.get("secretName") if kind == "secret" else spec["name"]
            optional = bool(spec.get("optional"))
            data = _source_data(kind, name, namespace, ctx, optional)
            what = "secret" if kind == "secret" else "configmap"
            return {} if data is None else _items(data, spec.get("items"), mode, what, optional)
    if "downwardAPI" in volume:
        spec = volume["downwardAPI"]
        return _downward(pod, spec.get("items") or [], spec.get("defaultMode", 0o644), resources)
    spec = volume["projected"]
    mode = spec.get("defaultMode", 0o644)
    out: Payload = {}
    for source in spec.get("sources") or ():
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            audience = token.get("audience", "")
            seconds = int(token.get("expirationSeconds", 3600))
            out[token["path"]] = (ctx.token(pod, seconds, audience).encode(), mode)
        elif "downwardAPI" in source:
            out |= _downward(pod, source["downwardAPI"].get("items") or [], mode, resources)
        else:
            kind = "secret" if "secret" in source else "configMap"
            spec_ = source[kind]
            optional = bool(spec_.get("optional"))
            data = _source_data(kind, spec_["name"], namespace, ctx, optional)
            what = "secret" if kind == "secret" else "configmap"
            if data is not None:
                out |= _items(data, spec_.get("items"), mode, what, optional)
    return out


# --- writing: the AtomicWriter's layout, then fsGroup


def _tree(directory: Path) -> dict[str, bytes]:
    found = {}
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(directory))] = path.read_bytes()
    return found


def write_atomically(directory: Path, files: Payload, fs_group: int | None) -> bool:
    """Project `files` into `directory` as the AtomicWriter does; False when it already
    holds exactly them (nothing is touched)."""
    data = directory / DATA
    if data.is_symlink():
        current = _tree(directory / os.readlink(data))
        if current == {p: b for p, (b, _) in files.items()}:
            return False
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    version.mkdir(mode=0o755)
    for path, (content, mode) in files.items():
        target = version / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    _own(version, fs_group, read_only=True)
    old = os.readlink(data) if data.is_symlink() else None
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version.name)
    os.replace(tmp, data)
    tops = {path.split("/", 1)[0] for path in files}
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"{DATA}/{top}")
    for entry in directory.iterdir():
        if not entry.name.startswith("..") and entry.name not in tops:
            entry.unlink()
    if old is not None:
        shutil.rmtree(directory / old)
    return True


def _own(directory: Path, fs_group: int | None, read_only: bool) -> None:
    """SetVolumeOwnership: the tree's group is `fs_group`, which may read (and for a
    read-write volume write) every file; directories are setgid."""
    if fs_group is None:
        return
    mask = 0o440 if read_only else 0o660
    for path in [directory, *directory.rglob("*")]:
        os.lchown(path, -1, fs_group)
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.lstat().st_mode) | mask
        os.chmod(path, mode | (stat.S_ISGID | 0o110 if path.is_dir() else 0))


def set_up(volume: Obj, pod: Obj, ctx: Context, resources: Callable[[Obj], str]) -> str:
    """The volume's node path, made ready (VolumeError: the pod cannot start yet)."""
    if "hostPath" in volume:
        return host_path(volume, ctx)
    fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    kind = next((k for k in KINDS if k in volume), None)
    if kind is None:
        raise VolumeError(f"volume {volume['name']}: left out by the testbed kubelet: {volume}")
    path = volume_dir(pod, kind, volume["name"])
    seen = ctx.seen(path)
    if kind == "emptyDir":
        if not seen.exists():
            seen.mkdir(mode=0o777, parents=True)
            seen.chmod(0o777)
            _own(seen, fs_group, read_only=False)
        return path
    write_atomically(seen, payload(volume, pod, ctx, resources), fs_group)
    return path


def refresh(volume: Obj, pod: Obj, ctx: Context, resources: Callable[[Obj], str]) -> bool:
    """Project what the volume's sources hold now, as the kubelet's sync does; whether the
    files changed. A projected token is not renewed here (it lives an hour)."""
    kind = next((k for k in ("secret", "configMap", "downwardAPI") if k in volume), None)
    if kind is None:
        return False
    fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    seen = ctx.seen(volume_dir(pod, kind, volume["name"]))
    try:
        return write_atomically(seen, payload(volume, pod, ctx, resources), fs_group)
    except VolumeError:
        return False


def mounts(container: Obj, paths: Mapping[str, str]) -> list[cri.Mount]:
    """The CRI mounts of a container's volumeMounts, its volumes set up at `paths`."""
    out = []
    privileged = bool((container.get("securityContext") or {}).get("privileged"))
    for mount in container.get("volumeMounts") or ():
        if mount.get("mountPropagation") == "Bidirectional" and not privileged:
            raise VolumeError(
                "Bidirectional mount propagation is available only to privileged "
                f"containers: {container['name']}, {mount['mountPath']}"
            )
        source = paths[mount["name"]]
        if mount.get("subPath"):
            source = f"{source}/{mount['subPath']}"
        propagation = PROPAGATION[mount.get("mountPropagation", "None")]
        out.append(
            cri.Mount(
                container_path=mount["mountPath"],
                host_path=source,
                readonly=bool(mount.get("readOnly")),
                propagation=propagation,
            )
        )
    return out
