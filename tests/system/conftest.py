"""Every test here runs real containers or daemons (runc, containerd, podman, the resident, a
chroot): it is marked `system`, which `make check` leaves out and `make test` runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import image
from testbed.podman import Podman

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def gpuwire_image() -> image.Image:
    """The image as `make image` builds it (`make test` has; built here otherwise, once a
    session; nothing to do where the tree is unchanged since the last build)."""
    if os.geteuid() != 0 or not (shutil.which("podman") and shutil.which("mmdebstrap")):
        pytest.skip("the image is built as root with podman and mmdebstrap (make test's)")
    return image.build()


@pytest.fixture(scope="session")
def gpuwire_podman(gpuwire_image: image.Image) -> Iterator[Podman]:
    """A private podman holding the image (loaded once a session: ~20 s, more on a busy
    machine), as a node's container engine holds it."""
    with Podman.create(overlay=True) as podman:
        podman.load(gpuwire_image.archive)
        yield podman
