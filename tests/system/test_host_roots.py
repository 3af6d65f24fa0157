"""gpuwire's host files on the hosts GPU clusters run: what the node installer puts on a node
needs no glibc newer than 2.31 (Ubuntu 20.04, Debian 11), and works in Debian 11, 12 and 13
roots (minbase and runc, by mmdebstrap: testbed/debianroot.py).

For each root the image does what the gpuwire-node DaemonSet does: its installer, run by
podman with the root mounted at /host, puts the host files there and configures containerd
and CDI on the root's files; its resident, started by podman with the host's PID namespace,
enters the root's namespaces (testbed/hostroot.py) and serves a GPU container started there
through the installed launcher, by that Debian's own runc. No Python is on the host.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuwire import elf
from runtime_hook.start import resident
from scripts import image
from testbed import debianroot
from testbed.hostroot import HostRoot
from testbed.lab import Lab
from testbed.podman import ULIMITS, Podman
from testbed.view import view
from testbed.waiting import until
from tests.conftest import requires_binary, requires_root
from tests.system.test_runc import granted_env, make_bundle

pytestmark = [requires_root(), requires_binary("podman", "mmdebstrap", "cc")]

SUITES = {"bullseye": "Debian 11", "bookworm": "Debian 12", "trixie": "Debian 13"}
GLIBC = (2, 31)  # the newest a host file may need: Ubuntu 20.04's, Debian 11's
LAUNCHERS = "/opt/gpuwire/current/libexec"
PRIVILEGED = ("--privileged", "--pid", "host", "--network", "none", "--user", "0")


def glibc_needed(path: Path) -> tuple[int, ...] | None:
    """The newest GLIBC_ symbol version an ELF file needs; None where it needs none."""
    fd = os.open(path, os.O_RDONLY)
    try:
        needs = elf.version_needs(fd)
    finally:
        os.close(fd)
    found = [
        tuple(int(part) for part in version.removeprefix("GLIBC_").split("."))
        for versions in needs.values()
        for version in versions
        if version.startswith("GLIBC_2")
    ]
    return max(found, default=None)


def too_new(tree: Path, limit: tuple[int, ...] = GLIBC) -> list[str]:
    """Every program under `tree` a host with glibc `limit` cannot run: an ELF that needs a
    newer glibc symbol, or an executable that is neither ELF nor a POSIX shell script."""
    problems = []
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()):
        if not path.stat().st_mode & 0o111:
            continue  # data (BUILD_ID)
        head = path.read_bytes()[:10]
        if head[:4] == b"\x7fELF":
            needed = glibc_needed(path)
            if needed is not None and needed > limit:
                newest = ".".join(map(str, needed))
                problems.append(f"{path}: needs GLIBC_{newest}, newer than {limit}")
        elif head != b"#!/bin/sh\n":
            problems.append(f"{path}: neither ELF nor a POSIX shell script")
    return problems


def test_the_glibc_check_fails_on_a_program_built_against_a_newer_glibc(tmp_path: Path) -> None:
    """A dynamic program built here (Debian 12's glibc 2.36) needs __libc_start_main of
    GLIBC_2.34, and the check says so; built static, it needs none."""
    source = tmp_path / "new.c"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n')
    (tmp_path / "bin").mkdir()
    for name, flags in (("dynamic", []), ("static", ["-static"])):
        subprocess.run(["cc", *flags, "-o", tmp_path / "bin" / name, source], check=True)
    assert too_new(tmp_path / "bin") == [
        f"{tmp_path}/bin/dynamic: needs GLIBC_2.34, newer than (2, 31)"
    ]
    assert glibc_needed(tmp_path / "bin/static") is None


@pytest.fixture(params=list(SUITES), ids=list(SUITES.values()))
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A fresh root of the suite (minbase and its runc), unpacked from the cached tarball."""
    suite: str = request.param
    tarball = debianroot.Root(suite, ("runc",), debianroot.SLIM, usr="maybe-merged-usr").tarball()
    root = tmp_path / suite
    root.mkdir()
    subprocess.run(["tar", "-xf", tarball, "-C", root], check=True)
    return root


def container(podman: Podman) -> list[str]:
    """How the DaemonSet's containers run: privileged, root, in the host's PID namespace (in
    this podman's cgroup, which it removes)."""
    return [*PRIVILEGED, *ULIMITS, "--cgroup-parent", f"/{podman.cgroup_parent}"]


def install(podman: Podman, name: str, root: Path, lab: Lab, config: Path) -> str:
    """The image's installer on `root`, as the gpuwire-node DaemonSet's init container runs it
    (the host at /host with its procfs, the grant keys' Secret and the node ConfigMap)."""
    run = podman.command(
        "run", "--rm", *container(podman),
        "--volume", f"{root}:/host", "--volume", f"{lab.root / 'keys'}:/run/gpuwire/grant-keys:ro",
        "--volume", f"{config.parent}:/run/gpuwire/node-config:ro",
        "--env", "HOST_ROOT=/host", "--env", "CONTAINERD_RESTART=none",
        "--env", "CDI_SPEC=/etc/cdi/gpuwire.yaml",
        "--entrypoint", "/opt/gpuwire/current/bin/gpuwire-install-node", name,
    )  # fmt: skip
    procfs = f'mount -t proc proc "{root}/proc" && exec "$@"'  # the host's /proc, as a node's
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", procfs, "sh", *run],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (run, done.stderr)
    return done.stderr


@pytest.mark.timeout(600)  # the first builds the image's podman and the roots (minutes)
def test_the_image_installs_and_serves_a_gpu_start_on_the_host(
    gpuwire_podman: Podman, gpuwire_image: image.Image, host: Path, tmp_path: Path
) -> None:
    podman = gpuwire_podman
    lab = Lab(host / "lab", host=host)
    lab.configure(**{"grant-key-dir": "/etc/gpuwire/keys", "runtime": "/usr/sbin/runc"})
    config = tmp_path / "node-config/config.toml"
    config.parent.mkdir()
    config.write_text(lab.config.read_text() + f'hook = "{LAUNCHERS}/gpuwire-hook"\n')
    said = install(podman, gpuwire_image.name, host, lab, config)
    version = os.readlink(host / "opt/gpuwire/current")
    assert f"installed /host/opt/gpuwire/{version}" in said
    assert sorted(os.listdir(host / "opt/gpuwire" / version)) == ["BUILD_ID", "libexec"]
    assert too_new(host / "opt/gpuwire") == []
    assert "gpuwire-runtime" in (host / "etc/containerd/conf.d/99-gpuwire.toml").read_text()
    assert "nvidia.com/gpu" in (host / "etc/cdi/gpuwire.yaml").read_text()

    bundle = make_bundle(lab, granted_env(lab, "0"), delivery="shim")
    inside = f"/{bundle.path.relative_to(host)}"
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    name = f"gpuwire-resident-{uuid.uuid4().hex[:8]}"
    with HostRoot(host) as node:
        podman.podman(
            "run", "--detach", "--name", name, *container(podman),
            "--entrypoint", "/opt/gpuwire/current/bin/python", gpuwire_image.name,
            "-I", "-m", "runtime_hook.start.resident", "--enter", str(node.pid),
        )  # fmt: skip
        try:
            until(lambda: (host / resident.DEFAULT_SOCKET.lstrip("/")).is_socket())
            cid = f"gpuwire-{uuid.uuid4().hex[:12]}"
            out = node.run(
                [f"{LAUNCHERS}/gpuwire-runtime", "run", "--bundle", inside, cid], env=env
            )
        finally:
            podman.podman("rm", "--force", "--time", "5", name, check=False)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["devices"] == ["nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"]
    assert seen["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(0)})"]
    assert seen["ldcache"] == ["libcuda.so.1"]
    assert any("team-a/trainer: GPUs 0 (" in line for line in lab.log_lines())
