"""Regenerate the stubs of the CRI subset (`make protos`), with the device plugin's generator
(deviceplugin/api/generate.py): the same protoc, include path and pinned grpcio-tools.

The subset lives here rather than beside the device plugin's protos because only the testbed
speaks CRI (its kubelet stand-in is a CRI client); no product package imports it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from deviceplugin.api import generate

HERE = Path(__file__).resolve().parent


def main() -> int:
    for path in generate.generate(generate.ROOT, HERE):
        print(path.relative_to(generate.ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
