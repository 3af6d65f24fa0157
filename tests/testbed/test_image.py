"""The testbed's busybox image: an OCI image layout whose digests depend only on the rootfs."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from testbed.image import NAME, write_layout_tar
from tests.conftest import requires_binary


@requires_binary("busybox")
def test_layout_is_valid_and_reproducible(tmp_path: Path) -> None:
    first = write_layout_tar(tmp_path / "a.tar").read_bytes()
    second = write_layout_tar(tmp_path / "b.tar").read_bytes()
    assert first == second
    with tarfile.open(tmp_path / "a.tar") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():  # every blob is named by its digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (descriptor,) = json.loads(files["index.json"])["manifests"]
    assert descriptor["annotations"]["org.opencontainers.image.ref.name"] == NAME
    manifest = json.loads(files["blobs/" + descriptor["digest"].replace(":", "/")])
    (layer,) = manifest["layers"]
    with tarfile.open(
        fileobj=io.BytesIO(files["blobs/" + layer["digest"].replace(":", "/")])
    ) as rootfs:
        names = set(rootfs.getnames())
    assert {"bin/busybox", "bin/sh", "etc/passwd", "usr/lib/x86_64-linux-gnu"} <= names
