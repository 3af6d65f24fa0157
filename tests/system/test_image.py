"""The image `make image` builds (scripts/image.py, Containerfile)."""

from __future__ import annotations

import time

from scripts import image


def test_the_same_commit_builds_the_same_build_id(gpuwire_image: image.Image) -> None:
    """Built again at another time (SOURCE_DATE_EPOCH), its dependencies fetched again and
    every step from them on run anew, the tree the installer compares is the same."""
    assert image.rebuilt_build_id(int(time.time())) == gpuwire_image.build_id
