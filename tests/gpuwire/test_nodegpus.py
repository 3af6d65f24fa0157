"""The `gpuwire.io/gpus` node annotation: what the node agent writes, cluster-side readers read."""

from __future__ import annotations

import pytest

from gpuwire import nodegpus
from gpuwire.nodegpus import NodeGpu


def test_round_trip_by_index() -> None:
    gpus = (
        NodeGpu(1, "GPU-b", "Tesla T4", 15360, 1, False),
        NodeGpu(0, "GPU-a", "Tesla T4", 15360),
    )
    text = nodegpus.encode(gpus)
    assert text.startswith('[{"index":0,"uuid":"GPU-a"')
    assert nodegpus.decode(text) == (gpus[1], gpus[0])


@pytest.mark.parametrize("text", ["{}", '[{"index":0}]', "[1]", "not json", '[{"index":"x"}]'])
def test_malformed_is_a_value_error_naming_the_annotation(text: str) -> None:
    with pytest.raises(ValueError, match=r"malformed gpuwire\.io/gpus annotation"):
        nodegpus.decode(text)
