"""`make image`: the one gpuwire image (Containerfile), built on this machine from what it can
reach (Debian's mirrors, PyPI), and saved where the testbed's containerd and podman load it.

1. The Containerfile's base, `docker.io/library/debian:bookworm-slim`, is made here: Debian
   12's minbase by mmdebstrap, slim as Debian's own container images are
   (testbed/debianroot.py, cached in .cache/debian/ by its inputs), as one layer in an OCI
   image of that name whose bytes follow from the tarball's alone, so that loading it again
   keeps podman's layer cache valid. Elsewhere `podman build` pulls the real one.
2. podman builds the Containerfile in a store of this checkout's own (.cache/image/store):
   its layers are the build cache, so a change of gpuwire's code rebuilds from the copy of
   the sources on and its dependencies' layer stays.
3. The image is saved as an OCI archive, `.cache/image/gpuwire-<version>.tar`, which
   containerd (`ctr images import`) and podman (`podman load`) read.

A tree whose inputs (the Containerfile, the files it copies, the base) are unchanged since
the last build builds nothing: `make image` then takes well under a second.

    python -m scripts.image [--version V]     # prints the image's name, archive and BUILD_ID
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed import debianroot
from testbed.image import layer_layout_files, write_tar

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache/image"
NAME = "ghcr.io/gpuwire/gpuwire"
BASE = debianroot.Root("bookworm", options=debianroot.SLIM)
BASE_NAME = "docker.io/library/debian:bookworm-slim"  # the Containerfile's FROM
# what Debian's image sets
BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
BASE_CMD = ("bash",)
BASE_LABEL = "io.gpuwire.base"  # the base tarball's key, to tell a stale base in the store
BUILD_ID = "/opt/gpuwire/current/BUILD_ID"


class ImageError(RuntimeError):
    """A step of the build that failed; the message says which and why."""


@dataclass(frozen=True)
class Image:
    name: str  # ghcr.io/gpuwire/gpuwire:<version>
    archive: Path  # the OCI archive
    build_id: str


def package_version(repo: Path = REPO) -> str:
    with (repo / "pyproject.toml").open("rb") as f:
        value: str = tomllib.load(f)["project"]["version"]
    return value


@dataclass(frozen=True)
class Store:
    """podman on this checkout's own storage (overlay, as root), its run root under /run."""

    root: Path  # resolved: podman keeps the path it was first given (a worktree's .cache may
    # be a link to the main checkout's)

    def command(self, *args: str) -> list[str]:
        run_root = f"/run/gpuwire-image-{hashlib.sha256(bytes(self.root)).hexdigest()[:12]}"
        return [
            "podman",
            *("--root", str(self.root), "--runroot", run_root, "--storage-driver", "overlay"),
            *("--storage-opt", "overlay.skip_mount_home=true"),  # no mount left behind
            *("--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"),
            *args,
        ]

    def podman(self, *args: str, log: Path | None = None) -> str:
        """Run podman; its output to `log` where given (a build's is long), else returned."""
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(log.open("a")) if log else subprocess.PIPE
            done = subprocess.run(
                self.command(*args),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.PIPE,
                text=True,
            )
        if done.returncode != 0:
            detail = log.read_text()[-3000:] if log else done.stderr
            raise ImageError(f"podman {args[0]}: {detail.strip()}")
        return done.stdout if not log else ""

    def build(self, context: Path, *args: str, log: Path) -> None:
        """`podman build` of `context`'s Containerfile, with the network (apt, pip) and the
        CA bundle pip is told to trust (PIP_CERT) as the secret the Containerfile reads."""
        cert = os.environ.get("PIP_CERT")
        secret = ["--secret", f"id=ca-bundle,src={cert}"] if cert and os.path.isfile(cert) else []
        log.write_text("")
        self.podman("build", "--network", "host", *secret, *args, str(context), log=log)

    def labels(self, image: str) -> dict[str, str] | None:
        """The labels of `image`; None where the store has no such image."""
        try:
            found = self.podman("image", "inspect", "--format", "{{json .Labels}}", image)
        except ImageError:
            return None
        labels: dict[str, str] = json.loads(found) or {}
        return labels

    @contextlib.contextmanager
    def mounted(self, image: str) -> Iterator[Path]:
        """`image`'s root filesystem, mounted (read it only)."""
        root = Path(self.podman("image", "mount", image).strip())
        try:
            yield root
        finally:
            self.podman("image", "unmount", image)

    def read(self, image: str, path: str) -> str:
        """A file of `image`."""
        with self.mounted(image) as root:
            return (root / path.lstrip("/")).read_text()


def base_loaded(store: Store, cache: Path) -> str:
    """The Containerfile's base in the store, made from its cached tarball; its key."""
    tarball = BASE.tarball()
    key = tarball.stem.rsplit("-", 1)[1]
    if store.labels(BASE_NAME) == {BASE_LABEL: key}:
        return key
    layout = cache / f"base-{key}.oci.tar"
    files = layer_layout_files(
        tarball.read_bytes(), BASE_NAME, BASE_ENV, BASE_CMD, {BASE_LABEL: key}
    )
    write_tar(layout, files)
    try:
        store.podman("load", "--quiet", "--input", str(layout))
    finally:
        layout.unlink()
    return key


def copied_sources(containerfile: str) -> list[str]:
    """The repository paths the Containerfile's COPY lines take from the build context."""
    sources = []
    for line in containerfile.replace("\\\n", " ").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def inputs(repo: Path, base_key: str) -> str:
    """A hash of everything the build reads: the Containerfile, .dockerignore, every file
    it copies (as git lists them: tracked, or new and not ignored), the base."""
    containerfile = (repo / "Containerfile").read_text()
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--"]
    listed = subprocess.run(
        [*listing, *copied_sources(containerfile)],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    digest = hashlib.sha256(base_key.encode())
    for name in sorted({*listed.decode().split("\0")} - {""} | {"Containerfile", ".dockerignore"}):
        path = repo / name
        if path.is_file():  # a file deleted but still listed as tracked is not copied
            digest.update(f"{name}\0{os.stat(path).st_mode & 0o111:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One build of a checkout at a time (a test session and `make image` may race)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(repo: Path = REPO, cache: Path = CACHE, version: str | None = None) -> Image:
    """Build the image and save its archive, unless its inputs are as at the last build;
    `version`: another version than pyproject's (GPUWIRE_VERSION: its tree is
    /opt/gpuwire/<version>, a build of its own, as an upgrade test needs two)."""
    tag = version or package_version(repo)
    name = f"{NAME}:{tag}"
    archive = cache / f"gpuwire-{tag}.tar"
    stamp = cache / f"gpuwire-{tag}.inputs"
    with locked(cache):
        store = Store((cache / "store").resolve())
        wanted = inputs(repo, base_loaded(store, cache))
        if archive.exists() and stamp.exists():
            last = json.loads(stamp.read_text())
            if last["inputs"] == wanted:
                return Image(name, archive, last["build_id"])
        args = ("--tag", name, *([f"--build-arg=GPUWIRE_VERSION={tag}"] if version else []))
        store.build(repo, *args, log=cache / "build.log")
        image = Image(name, archive, store.read(name, BUILD_ID).strip())
        partial = archive.with_name(f".{archive.name}.{os.getpid()}")
        try:
            store.podman("save", "--quiet", "--format", "oci-archive", "-o", str(partial), name)
            partial.rename(archive)
        finally:
            partial.unlink(missing_ok=True)
        stamp.write_text(json.dumps({"inputs": wanted, "build_id": image.build_id}) + "\n")
        return image


def rebuilt_build_id(epoch: int, repo: Path = REPO, cache: Path = CACHE) -> str:
    """The BUILD_ID of the tree built again with SOURCE_DATE_EPOCH=`epoch`: every step after
    the dependencies' download run anew, their install from the wheels fetched included (the
    reproducibility test; the download is pinned files, and the first build's layer stays)."""
    with beside(cache) as (store, tag):
        args = ("--target", "build", f"--build-arg=SOURCE_DATE_EPOCH={epoch}", "--tag", tag)
        store.build(repo, *args, log=cache / "beside.log")
        return store.read(tag, BUILD_ID).strip()


@contextlib.contextmanager
def beside(cache: Path = CACHE) -> Iterator[tuple[Store, str]]:
    """`build`'s store (its base loaded) and a name to build something else under in it:
    every image made meanwhile is removed again, `build`'s cache kept."""
    with locked(cache):
        store = Store((cache / "store").resolve())
        base_loaded(store, cache)
        before = set(store.podman("images", "--all", "--quiet", "--no-trunc").split())
        try:
            yield store, f"localhost/gpuwire-beside:{os.getpid()}"
        finally:
            made = set(store.podman("images", "--all", "--quiet", "--no-trunc").split()) - before
            if made:
                store.podman("rmi", "--force", *sorted(made))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.image", description="Build the gpuwire image (Containerfile)."
    )
    parser.add_argument("--version", help="GPUWIRE_VERSION, if not pyproject's")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        image = build(version=args.version)
    except FileNotFoundError as exc:
        sys.stderr.write(f"make image: {exc.filename} not installed (make system-deps, as root)\n")
        return 1
    except (ImageError, RuntimeError) as exc:
        sys.stderr.write(f"make image: {exc}\n")
        return 1
    print(f"image     {image.name}")
    print(f"archive   {image.archive.relative_to(REPO)}")
    print(f"BUILD_ID  {image.build_id}")
    print(f"took      {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
