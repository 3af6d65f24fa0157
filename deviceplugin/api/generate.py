"""Regenerate the Python stubs of every `.proto` in this directory (`make protos`), or in
another one (`generate(out, directory)`: the testbed's CRI subset, testbed/cri/generate.py).

Each proto is compiled with the repository root as the include path, so the generated gRPC
module imports its messages as `deviceplugin.api.<name>_pb2` and the package stays importable
without path tricks. grpcio-tools is pinned in constraints.txt, so the output is reproducible;
a test regenerates into a temporary directory and fails when the committed stubs are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def protos(directory: Path = HERE) -> list[Path]:
    return sorted(directory.glob("*.proto"))


def generated(proto: Path) -> list[str]:
    """The file names protoc writes for `proto`."""
    return [f"{proto.stem}_pb2.py", f"{proto.stem}_pb2.pyi", f"{proto.stem}_pb2_grpc.py"]


def generate(out: Path, directory: Path = HERE) -> list[Path]:
    """Compile every proto of `directory` into `out` (laid out like the repository); returns
    what it wrote."""
    written = []
    for proto in protos(directory):
        relative = proto.relative_to(ROOT)
        args = [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(relative),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {relative}")
        written += [out / relative.parent / name for name in generated(proto)]
    return written


def main() -> int:
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
