"""A `v1 List` file as `kubectl get <resource> -o yaml` (or `-o json`) prints it: what
stands in for the cluster offline (the nodes and slices files of `gpuwire mutate` and
`webhook serve`, the files `gpuwire inventory` reads instead of a cluster, tests, the demo).
Here, not in a component, since several read it and components may not import each other.

JSON is read by orjson, YAML by libyaml where PyYAML has it: a large cluster's list is
hundreds of MB, which PyYAML's pure-Python parser reads at about 1 MB/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the safe loader, in C if built


def items(path: str | Path, kind: str, error: type[Exception]) -> list[Mapping[str, Any]]:
    """The objects of the List (or `<kind>List`) at `path`, each a `kind` (an item that names
    no kind, as in a list the API server sends, is taken for one); `error` naming the file
    and what is wrong where it cannot be read or is no such list."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{path}: {exc.strerror}") from exc
    try:
        json_text = text.lstrip()[:1] in (b"{", b"[")
        doc = orjson.loads(text) if json_text else yaml.load(text, Loader=YAML_LOADER)  # noqa: S506 - a safe loader
    except (ValueError, yaml.YAMLError) as exc:
        raise error(f"{path}: {exc}") from exc
    found = doc.get("items") if isinstance(doc, Mapping) else None
    if not isinstance(found, list):
        raise error(f"{path}: expected a v1 List of {kind} objects (with items:)")
    kinds = {
        str(i.get("kind", kind)) if isinstance(i, Mapping) else type(i).__name__ for i in found
    }
    if kinds - {kind}:
        raise error(f"{path}: every item must be a {kind}; found {sorted(kinds)}")
    return found
