"""The node installer (deploy/node/install-node) on a host root: a busybox root filesystem it
really chroots into, with a stand-in `gpuwire` that records what it is asked to do, and the
real launchers of each version (their Python a stand-in that says which version it is)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from certs import files
from runtime_hook.setup import launcher
from testbed.rootfs import busybox_rootfs
from tests.conftest import requires_binary, requires_root

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "deploy/node/install-node"
DROP_IN = "etc/containerd/conf.d/99-gpuwire.toml"
LAUNCHERS = "/opt/gpuwire/current/libexec"  # the image's <version>/libexec, through `current`
CONTAINERD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # what the runc shim passes on

# Stands in for the image's gpuwire on the host. containerd configure refuses, as the real one
# does, a runtime or hook that is not an executable on the host, and writes the drop-in only
# when it changes; cdi generate refuses a config whose `hook` is not one, and writes a spec.
FAKE_GPUWIRE = """#!/bin/sh
echo "$*" >> /var/log/gpuwire-calls
case "$1 $2" in
"containerd configure")
    shift 2
    runtime= hook= mode=shim
    while [ $# -gt 0 ]; do
        case $1 in
        --runtime-path) runtime=$2; shift ;;
        --hook-path) hook=$2; shift ;;
        --prestart-hook) mode=prestart-hook ;;
        esac
        shift
    done
    for program in "$runtime" "$hook"; do
        [ -x "$program" ] || { echo "$program: not an executable" >&2; exit 2; }
    done
    entry="BinaryName=$runtime prestart-hook=$hook mode=$mode"
    [ "$(cat /etc/containerd/conf.d/99-gpuwire.toml 2>/dev/null)" = "$entry" ] && exit 0
    mkdir -p /etc/containerd/conf.d
    echo "$entry" > /etc/containerd/conf.d/99-gpuwire.toml ;;
"cdi generate")
    case "$4" in *.yaml|*.json) ;; *) echo "unknown extension: $4" >&2; exit 2 ;; esac
    hook=$(sed -n 's/^hook = "\\(.*\\)"$/\\1/p' /etc/gpuwire/config.toml)
    [ -x "$hook" ] || { echo "hook '$hook' is not an executable gpuwire-hook" >&2; exit 2; }
    if [ -f "$4" ]; then echo "no change: $4 already holds this spec"
    else echo "cdiVersion: 0.6.0" > "$4"; echo "wrote $4"; fi ;;
esac
"""
# The image's Python, standing in: it says which version's it is and how it was called.
FAKE_PYTHON = """#!/bin/sh
echo "python of %s: $*" >> /var/log/python-calls
"""
FAKE_RUNC = """#!/bin/sh
echo "runc $*" >> /var/log/runc-calls
"""


def node_config() -> str:
    """The runtime config the gpuwire-node ConfigMap installs."""
    docs = yaml.safe_load_all((REPO / "deploy/base/node.yaml").read_text())
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    text: str = config_map["data"]["config.toml"]
    return text


pytestmark = [requires_root(), requires_binary("busybox", "chroot")]


class Node:
    """A host root, an image tree, a grant-key Secret volume and a node ConfigMap."""

    def __init__(self, tmp: Path) -> None:
        self.host = busybox_rootfs(tmp / "host")
        (self.host / "var/log").mkdir(parents=True)
        (self.host / "usr/bin/runc").write_text(FAKE_RUNC)
        (self.host / "usr/bin/runc").chmod(0o755)
        self.image = tmp / "image/opt/gpuwire"
        self.keys = tmp / "grant-keys"
        self.config = tmp / "node-config/config.toml"
        self.config.parent.mkdir()
        self.config.write_text(node_config())
        self.env = {
            "PATH": os.environ["PATH"],
            "HOST_ROOT": str(self.host),
            "IMAGE_TREE": str(self.image),
            "GRANT_KEYS": str(self.keys),
            "NODE_CONFIG": str(self.config),
            "CONTAINERD_RESTART": "echo restarted >> /var/log/restarts",
        }
        self.release("0.1.0")
        self.secret({"key-1": b"first"})

    def release(self, version: str) -> None:
        """The image now carries `version` (a build with its own BUILD_ID), laid out as the
        Containerfile lays it out: bin/ with gpuwire and the venv's python, libexec/ with the
        launchers written for that python."""
        tree = self.image / version
        (tree / "bin").mkdir(parents=True)
        for name, text in (("gpuwire", FAKE_GPUWIRE), ("python", FAKE_PYTHON % version)):
            (tree / "bin" / name).write_text(text)
            (tree / "bin" / name).chmod(0o755)
        launcher.install(
            str(tree / "libexec"),
            python=f"/opt/gpuwire/{version}/bin/python",
            runs_from=f"/opt/gpuwire/{version}/libexec",
        )
        (tree / "BUILD_ID").write_text(f"build of {version}\n")
        current = self.image / "current"
        current.unlink(missing_ok=True)
        current.symlink_to(version)

    def secret(self, keys: dict[str, bytes]) -> None:
        """The grant-key Secret as the kubelet lays it out: `..data` and symlinks."""
        for old in self.keys.glob("[!.]*"):
            old.unlink()
        files.publish(self.keys, keys, private=keys)

    def install(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(INSTALLER), *args],
            env=self.env | env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def read(self, path: str) -> str:
        return (self.host / path).read_text()

    def calls(self, log: str) -> list[str]:
        path = self.host / "var/log" / log
        return path.read_text().splitlines() if path.exists() else []

    def configured(self) -> dict[str, str]:
        """What containerd was configured with (the stand-in's drop-in)."""
        return dict(word.split("=", 1) for word in self.read(DROP_IN).split())

    def call(self, program: str, *args: str, stdin: str = "") -> None:
        """Run `program` on the host as containerd would (chroot, containerd's env)."""
        done = subprocess.run(
            ["chroot", str(self.host), program, *args],
            env=CONTAINERD_ENV,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr

    def restarts(self) -> int:
        log = self.host / "var/log/restarts"
        return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_first_install_puts_everything_on_the_host_and_restarts_containerd_once(
    node: Node,
) -> None:
    done = node.install()
    assert done.returncode == 0, done.stderr
    assert os.readlink(node.host / "opt/gpuwire/current") == "0.1.0"
    assert node.read("opt/gpuwire/current/BUILD_ID") == "build of 0.1.0\n"
    keys = node.host / "etc/gpuwire/keys"
    assert sorted(p.name for p in keys.iterdir()) == ["key-1"]
    assert (keys / "key-1").read_bytes() == b"first"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "key-1").stat().st_mode) == 0o600
    assert not (keys / "key-1").is_symlink()
    assert node.read("etc/gpuwire/config.toml") == node_config()
    assert node.configured() == {
        "BinaryName": f"{LAUNCHERS}/gpuwire-runtime",
        "prestart-hook": f"{LAUNCHERS}/gpuwire-hook",
        "mode": "shim",
    }
    for name in ("gpuwire-runtime", "gpuwire-hook"):  # the launchers, not pip's scripts
        text = node.read(f"opt/gpuwire/current/libexec/{name}")
        assert text == node.read(f"opt/gpuwire/0.1.0/libexec/{name}")
        assert "runtime_hook/setup/launcher.py" in text
    assert node.restarts() == 1


def test_running_again_changes_nothing_and_restarts_nothing(node: Node) -> None:
    node.install()
    again = node.install()
    assert again.returncode == 0, again.stderr
    assert "installed" not in again.stderr
    assert node.restarts() == 1


def test_configure_args_reach_gpuwire_on_the_host(node: Node) -> None:
    node.install(CONFIGURE_ARGS="--cdi --set-default")
    assert node.calls("gpuwire-calls") == [
        f"containerd configure --runtime-path {LAUNCHERS}/gpuwire-runtime "
        f"--hook-path {LAUNCHERS}/gpuwire-hook --cdi --set-default"
    ]


def test_the_runtime_containerd_keeps_calling_outlives_the_version_that_set_it(
    node: Node,
) -> None:
    """containerd's shim calls BinaryName for a container's whole life (state, kill, delete),
    and a container keeps its poststop hook's path: both must work after two upgrades have
    removed the version that was current when the container started."""
    node.install(CONFIGURE_ARGS="--prestart-hook")
    configured = node.configured()
    for version in ("0.2.0", "0.3.0"):
        node.release(version)
        node.install(CONFIGURE_ARGS="--prestart-hook")
    assert not (node.host / "opt/gpuwire/0.1.0").exists()
    assert node.configured() == configured  # nothing for containerd to reload
    node.call(configured["BinaryName"], "--root", "/run/containerd/runc/k8s.io", "delete", "c1")
    assert node.calls("runc-calls") == ["runc --root /run/containerd/runc/k8s.io delete c1"]
    assert node.calls("python-calls") == []  # no Python for a container that held no GPU
    bundle = node.host / "run/bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}})
    )
    node.call(configured["BinaryName"], "create", "--bundle", "/run/bundle", "c2")
    node.call(configured["prestart-hook"], "poststop", stdin='{"id": "c1"}')
    shim, hook = node.calls("python-calls")
    assert shim.startswith("python of 0.3.0: -IS -c ")  # the current version's, whole
    assert shim.endswith(f"{LAUNCHERS}/gpuwire-runtime create --bundle /run/bundle c2")
    assert hook.startswith("python of 0.3.0: -IS -c ")  # through gpuwire-call: no resident
    assert hook.endswith(f"{LAUNCHERS}/gpuwire-hook poststop")


def test_a_reset_containerd_config_is_restored_and_containerd_restarted(node: Node) -> None:
    node.install()
    (node.host / DROP_IN).unlink()
    node.install()
    assert (node.host / DROP_IN).exists()
    assert node.restarts() == 2


def test_restart_none_leaves_containerd_alone_and_says_so(node: Node) -> None:
    done = node.install(CONTAINERD_RESTART="none")
    assert "restart containerd to apply it" in done.stderr
    assert node.restarts() == 0


def test_grant_keys_on_the_host_mirror_the_secret(node: Node) -> None:
    node.install()
    node.secret({"key-1": b"first", "key-2": b"second"})
    node.install()
    keys = node.host / "etc/gpuwire/keys"
    assert sorted(p.name for p in keys.iterdir()) == ["key-1", "key-2"]
    node.secret({"key-2": b"second"})
    node.install()
    assert sorted(p.name for p in keys.iterdir()) == ["key-2"]
    assert node.restarts() == 1  # keys need no containerd restart


def test_upgrades_switch_current_and_keep_one_previous_version(node: Node) -> None:
    node.install()
    node.release("0.2.0")
    node.install()
    opt = node.host / "opt/gpuwire"
    assert os.readlink(opt / "current") == "0.2.0"
    assert sorted(p.name for p in opt.iterdir() if not p.name.startswith(".")) == [
        "0.1.0",
        "0.2.0",
        "current",
    ]
    node.release("0.3.0")
    node.install()
    assert os.readlink(opt / "current") == "0.3.0"
    assert sorted(p.name for p in opt.iterdir() if not p.name.startswith(".")) == [
        "0.2.0",
        "0.3.0",
        "current",
    ]


def test_a_rebuild_of_the_same_version_replaces_it(node: Node) -> None:
    node.install()
    (node.image / "0.1.0/BUILD_ID").write_text("rebuilt\n")
    node.install()
    assert node.read("opt/gpuwire/current/BUILD_ID") == "rebuilt\n"


def test_cdi_spec_is_written_on_the_host_and_left_alone_when_unchanged(node: Node) -> None:
    done = node.install(CDI_SPEC="/etc/cdi/gpuwire.yaml")
    assert done.returncode == 0, done.stderr
    assert node.read("etc/cdi/gpuwire.yaml") == "cdiVersion: 0.6.0\n"
    again = node.install(CDI_SPEC="/etc/cdi/gpuwire.yaml")
    assert "installed" not in again.stderr


def test_bad_arguments_are_refused(node: Node) -> None:
    for args, message in [
        (["--interval", "soon"], "--interval soon: a whole number of seconds"),
        (["--frobnicate"], "unknown argument --frobnicate"),
    ]:
        done = node.install(*args)
        assert done.returncode == 1
        assert message in done.stderr
    assert not (node.host / "opt/gpuwire").exists()


def test_interval_mode_syncs_until_sigterm(node: Node) -> None:
    proc = subprocess.Popen(
        [str(INSTALLER), "--interval", "1"],
        env=node.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (node.host / "etc/gpuwire/keys/key-1").exists())
        node.secret({"key-2": b"second"})
        wait_for(lambda: (node.host / "etc/gpuwire/keys/key-2").exists())
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not (node.host / "etc/gpuwire/keys/key-1").exists()


def wait_for(condition: object) -> None:
    assert callable(condition)
    for _ in range(600):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in 30 s")
