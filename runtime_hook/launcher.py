"""Launchers for gpuwire-runtime and gpuwire-hook that start Python in isolated mode.

pip's console scripts start Python with `site`, which scans site-packages and runs every
`.pth` file: ~4 ms on each runtime call on a small node, and containerd makes several per
container. A launcher runs `python -IS` instead, with the directory that holds gpuwire
written in: `-I` also keeps `PYTHON*` variables and the user's site-packages out of a
program that runs as root, `-S` skips `site`. The node side imports only the standard
library and gpuwire, so nothing else is needed on the path.

    python -m runtime_hook.launcher /usr/local/libexec/gpuwire

writes `gpuwire-runtime` and `gpuwire-hook` there; point containerd's `BinaryName` at that
`gpuwire-runtime`. The shim's default `hook` is the `gpuwire-hook` beside it.
"""

from __future__ import annotations

import os
import sys

import runtime_hook

ENTRY_POINTS = {"gpuwire-runtime": "runtime_hook.shim", "gpuwire-hook": "runtime_hook.hook"}


def render(module: str, python: str, path: str) -> str:
    return (
        f"#!{python} -IS\n"
        f"# gpuwire launcher: isolated mode, no site (runtime_hook/launcher.py)\n"
        f"import sys\n"
        f"sys.path.insert(0, {path!r})\n"
        f"from {module} import main\n"
        f"sys.exit(main())\n"
    )


def install(directory: str, python: str = sys.executable) -> list[str]:
    """Write both launchers into `directory`; returns their paths."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(runtime_hook.__file__)))
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, module in ENTRY_POINTS.items():
        path = os.path.join(directory, name)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(render(module, python, package_parent))
        os.chmod(tmp, 0o755)  # noqa: S103 - an executable, root-owned like its directory
        os.replace(tmp, path)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("/"):
        sys.exit("usage: python -m runtime_hook.launcher /ABSOLUTE/DIR")
    print("\n".join(install(sys.argv[1])))
