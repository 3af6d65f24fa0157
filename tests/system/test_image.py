"""The image `make image` builds (scripts/image.py, Containerfile)."""

from __future__ import annotations

import time

import pytest

from scripts import image


# The rebuild's own bound: it costs ~95 CPU-seconds (244 s wall at load 11-22 on a 2-core
# machine; the dependencies are not downloaded again).
@pytest.mark.timeout(600)
def test_the_same_commit_builds_the_same_build_id(gpuwire_image: image.Image) -> None:
    """Built again at another time (SOURCE_DATE_EPOCH), every step from the dependencies'
    install on run anew (the venv, their wheels installed and compiled, gpuwire's wheel, the
    launchers, gpuwire-call), the tree the installer compares is the same."""
    assert image.rebuilt_build_id(int(time.time())) == gpuwire_image.build_id
