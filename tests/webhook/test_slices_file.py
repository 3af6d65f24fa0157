"""The webhook's `--slices` file (`pools.load`): a ResourceSlice list as `kubectl get
resourceslices -o yaml` or `-o json` prints it is the cluster's pools; anything else is an
error that names the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed import dracluster
from webhook import pools
from webhook.pools import Pools, SlicesFileError

NODES = [dracluster.node("dra-1", 2), dracluster.node("dra-2", 2, mig={0: ("3g.40gb",)})]


def listing() -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "List", "items": dracluster.all_slices(NODES)}


def test_a_slices_file_in_yaml_or_json_is_the_clusters_pools(tmp_path: Path) -> None:
    as_yaml, as_json = tmp_path / "slices.yaml", tmp_path / "slices.json"
    as_yaml.write_text(yaml.safe_dump(listing()))
    as_json.write_text("\n " + json.dumps(listing(), indent=2))
    found = pools.load(as_yaml)
    assert found.devices == Pools.of(dracluster.all_slices(NODES)).devices
    assert pools.load(as_json).devices == found.devices
    assert sorted({d.node for d in found.devices}) == ["dra-1", "dra-2"]
    assert {d.kind for d in found.devices} == {"gpu", "mig"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("kind: List\nitems: [\n", "slices.yaml: while parsing a flow node"),
        ('{"kind": "List", "items": [', "slices.yaml: unexpected end of data"),
        ("kind: ResourceSlice\n", "expected a v1 List of ResourceSlice objects (with items:)"),
        ("kind: List\nitems: [{kind: Node}, 3]\n", "every item must be a ResourceSlice; "
                                                  "found ['Node', 'int']"),
    ],
)  # fmt: skip
def test_a_slices_file_that_is_no_slice_list_is_refused_by_name(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "slices.yaml"
    path.write_text(text)
    with pytest.raises(SlicesFileError) as refused:
        pools.load(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert why in str(refused.value)
    with pytest.raises(SlicesFileError, match="No such file"):
        pools.load(tmp_path / "missing.yaml")
