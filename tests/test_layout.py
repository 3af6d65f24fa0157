"""The repository's layout holds: tests import the product, not a test package named like it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("gpuwire", "webhook", "runtime_hook", "deviceplugin", "certs", "inventory")


@pytest.mark.parametrize("package", PRODUCT)
def test_a_test_imports_the_product_package(package: str) -> None:
    """tests/gpuwire/ and its siblings are `tests.gpuwire`, ...: packages of their own, so
    they never stand in for the product on sys.path."""
    module = importlib.import_module(package)
    assert Path(str(module.__file__)).parent == REPO / package
