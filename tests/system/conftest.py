"""Every test here runs real containers or daemons (runc, containerd, podman, the resident, a
chroot): it is marked `system`, which `make check` leaves out and `make test` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.system)
