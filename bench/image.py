"""What the image weighs and what building it costs, each build against the floor of any
podman build here, measured in the same run.

    .venv/bin/python -m bench.image [--cold]

Sizes: the image (its layers unpacked, as podman counts them), the archive `make image` saves
(layers compressed), the Debian base, the tree in /opt/gpuwire/<version>, and what the node
installer copies to a host. Build times, as ratios to the floor (a one-step build on the base,
`RUN true`, nothing cached):
- unchanged tree: `make image` finds its inputs unchanged and builds nothing;
- every layer cached: the same build run by podman, which checks each step;
- code change: a copy of the tree with one source file changed, built from the copy of the
  sources on (its dependencies' layer stays);
- cold (`--cold`, minutes): the Debian base made by mmdebstrap, then every step, in a store
  of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from scripts import image

HOST_FILES = "opt/gpuwire/current/libexec"  # what install_tree copies, with BUILD_ID


def seconds(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def megabytes(path: Path) -> float:
    """Bytes of the regular files under `path` (links not followed), in MB."""
    total = sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return total / 1e6


def sizes(built: image.Image) -> list[tuple[str, float]]:
    store = image.Store(image.CACHE / "store")

    def podman_size(name: str) -> float:
        return int(store.podman("image", "inspect", "--format", "{{.Size}}", name)) / 1e6

    with store.mounted(built.name) as root:
        tree = root / "opt/gpuwire" / os.readlink(root / "opt/gpuwire/current")
        return [
            ("image (unpacked)", podman_size(built.name)),
            ("archive (compressed)", built.archive.stat().st_size / 1e6),
            ("Debian base", podman_size(image.BASE_NAME)),
            ("/opt/gpuwire/<version>", megabytes(tree)),
            ("host files (libexec/)", megabytes(root / HOST_FILES)),
        ]


def floor() -> float:
    with tempfile.TemporaryDirectory() as tmp, image.beside() as (store, tag):
        Path(tmp, "Containerfile").write_text(f"FROM {image.BASE_NAME}\nRUN true\n")
        log = Path(tmp, "log")
        return seconds(lambda: store.build(Path(tmp), "--no-cache", "--tag", tag, log=log))


def code_change() -> float:
    """A copy of the tree (as git lists it) with one source file changed, built beside."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=image.REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    with tempfile.TemporaryDirectory() as tmp, image.beside() as (store, tag):
        for name in filter(None, listed.split("\0")):
            source = image.REPO / name
            if source.is_file():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, Path(tmp) / name)
        with (Path(tmp) / "gpuwire/__init__.py").open("a") as f:
            f.write(f"# changed by bench.image at {time.time()}\n")
        log = Path(tmp, "log")
        return seconds(lambda: store.build(Path(tmp), "--tag", tag, log=log))


def cold() -> float:
    """Everything from nothing: the base's tarball and the build in a cache of their own."""
    with tempfile.TemporaryDirectory(dir=image.CACHE.parent) as tmp:
        cache = Path(tmp)
        made = seconds(lambda: image.BASE.tarball(cache / "debian"))
        try:
            return made + seconds(lambda: image.build(cache=cache / "image"))
        finally:
            subprocess.run(image.Store(cache / "image/store").command("system", "reset", "-f"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__)
    parser.add_argument("--cold", action="store_true", help="also a build from nothing")
    args = parser.parse_args(argv)
    built = image.build()
    store = image.Store(image.CACHE / "store")
    base = floor()
    times = [
        ("unchanged tree (make image)", seconds(image.build)),
        ("every layer cached", seconds(lambda: store.build(image.REPO, "--tag", built.name,
                                                            log=image.CACHE / "build.log"))),
        ("code change", code_change()),
    ]  # fmt: skip
    if args.cold:
        times.append(("cold (base made, nothing cached)", cold()))
    print(f"image {built.name}, BUILD_ID {built.build_id[:12]}")
    print(f"{'size':36} {'MB':>8}")
    for name, mb in sizes(built):
        print(f"{name:36} {mb:8.1f}")
    print(f"{'build':36} {'s':>8} {'×floor':>8}")
    for name, took in [("floor (RUN true, no cache)", base), *times]:
        print(f"{name:36} {took:8.1f} {took / base:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
