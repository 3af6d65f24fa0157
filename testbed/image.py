"""An OCI image-layout tar of the busybox rootfs: the testbed has no registry to pull from.

containerd (`ctr images import`) and podman (`podman load`) both read this format. The tar is
deterministic (sorted entries, zero mtimes, root ownership), so the same rootfs always gives
the same digests and re-importing it is a no-op.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testbed.rootfs import busybox_rootfs

NAME = "docker.io/gpuwire/testbed:busybox"
# The pause image every pod sandbox runs (CRI's sandbox image): busybox waiting, as the
# Kubernetes pause container does, until SIGTERM or SIGINT ends it.
PAUSE = "docker.io/gpuwire/pause:busybox"
PAUSE_COMMAND = ("sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done")
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _layer(rootfs: Path) -> bytes:
    """The rootfs as one uncompressed layer, entries in sorted order with fixed metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _blob(out: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    out[f"blobs/sha256/{digest}"] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def layout_files(
    rootfs: Path,
    name: str = NAME,
    env: Mapping[str, str] | None = None,
    cmd: Sequence[str] = ("sh",),
) -> dict[str, bytes]:
    """The files of an OCI image layout holding `rootfs` as image `name`, whose config sets
    `env` (after PATH) and the default command `cmd`."""
    variables = ["PATH=/usr/bin:/bin:/sbin", *(f"{k}={v}" for k, v in (env or {}).items())]
    return layer_layout_files(_layer(rootfs), name, variables, cmd)


def layer_layout_files(
    layer: bytes,
    name: str,
    env: Sequence[str],
    cmd: Sequence[str],
    labels: Mapping[str, str] | None = None,
) -> dict[str, bytes]:
    """The files of an OCI image layout of one uncompressed `layer` (a tar) as image `name`,
    its config setting `env` (`NAME=value`), the default command `cmd` and `labels`."""
    files: dict[str, bytes] = {}
    settings: dict[str, Any] = {"Env": list(env), "Cmd": list(cmd)}
    if labels:
        settings["Labels"] = dict(labels)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": settings,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
        # one entry per layer: builders (buildah) count the layers an image's history names
        "history": [{"created_by": f"the layer of {name}"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": _blob(files, json.dumps(config, sort_keys=True).encode(), _CONFIG),
        "layers": [_blob(files, layer, _LAYER)],
    }
    descriptor = _blob(files, json.dumps(manifest, sort_keys=True).encode(), _MANIFEST)
    # containerd takes the full name from its own annotation, podman from the OCI one.
    descriptor["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name,
    }
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [descriptor]}).encode()
    files["oci-layout"] = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    return files


def write_layout_tar(
    dest: Path,
    name: str = NAME,
    *,
    env: Mapping[str, str] | None = None,
    cmd: Sequence[str] = ("sh",),
    scripts: Mapping[str, str] | None = None,
) -> Path:
    """Write a busybox image as an OCI image-layout tar at `dest`; `scripts` are executables
    to add (absolute path in the image → text), `env` and `cmd` go into its config."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = busybox_rootfs(Path(tmp) / "rootfs")
        for path, text in (scripts or {}).items():
            script = rootfs / path.lstrip("/")
            script.write_text(text)
            script.chmod(0o755)
        files = layout_files(rootfs, name, env, cmd)
    return write_tar(dest, files)


def write_pause_tar(dest: Path) -> Path:
    return write_layout_tar(dest, PAUSE, cmd=PAUSE_COMMAND)


def write_tar(dest: Path, files: Mapping[str, bytes]) -> Path:
    """Write `files` (path in the archive → content) as a tar at `dest`, in path order."""
    with tarfile.open(dest, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest
