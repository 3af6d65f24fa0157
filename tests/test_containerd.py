"""containerd itself reads what `gpuwire containerd configure` writes, and runs the shim.

A private containerd (gpuwire/lab/containerd.py) starts from a main config an admin might
have, after `gpuwire containerd configure` added its drop-in: `config dump` must show the
handler, and the CRI plugin, which validates its runtimes when it loads, must load.
containerd 1.6 reads config version 2; version 3 needs containerd 2.x, which Debian 12 does
not ship, so version 3 is checked as TOML structure in test_containerd_config.py.

Then containers: `ctr run --runc-binary gpuwire-runtime`, with the CRI annotations and env a
kubelet and the webhook would give, shows the same GPU view as the runc tests
(tests/test_runtime_runc.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from gpuwire import allocation
from gpuwire.lab.containerd import CRI, Container, Containerd, Mount
from gpuwire.lab.image import NAME, PAUSE, write_layout_tar
from gpuwire.lab.rootfs import busybox_rootfs
from gpuwire.lab.view import VIEW_SCRIPT, granted_view, shown, view
from runtime_hook import launcher
from tests.conftest import requires_binary, requires_root
from tests.runtime_support import Lab, cri_annotations, grant_for, served_launchers
from tests.waiting import until

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuwire-runtime")
HOOK = str(BIN / "gpuwire-hook")


def gpuwire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpuwire"), *args], capture_output=True, text=True)


@pytest.fixture
def containerd() -> Iterator[Containerd]:
    with Containerd.create(cri=True) as instance:
        # what an admin's file holds besides the private paths: a setting the drop-in must keep
        text = instance.config.read_text()
        instance.config.write_text(
            "# the admin's comment\n"
            + text.replace(
                f'sandbox_image = "{PAUSE}"', 'sandbox_image = "registry.example/pause:9"'
            )
        )
        yield instance


def cri_section(dump: str) -> dict[str, Any]:
    section: dict[str, Any] = tomlkit.parse(dump).unwrap()["plugins"][CRI]
    return section


def cri_status(containerd: Containerd) -> str:
    return containerd.ctr("plugins", "ls", "id==cri").stdout.split()[-1]


def configure(containerd: Containerd, *args: str) -> None:
    out = gpuwire("containerd", "configure", "--config", str(containerd.config), *args)
    assert out.returncode == 0, out.stderr


def test_containerd_runs_the_shim_handler(containerd: Containerd) -> None:
    configure(containerd, "--runtime-path", SHIM)
    assert containerd.config.read_text().startswith("# the admin's comment\n")
    containerd.start()
    assert cri_status(containerd) == "ok"
    section = cri_section(containerd.dump())
    assert section["sandbox_image"] == "registry.example/pause:9"
    ctd = section["containerd"]
    assert isinstance(ctd, dict)
    assert ctd["default_runtime_name"] == "runc"  # still there: the drop-in keeps runc
    assert ctd["runtimes"]["gpuwire"]["runtime_type"] == "io.containerd.runc.v2"
    assert ctd["runtimes"]["gpuwire"]["options"]["BinaryName"] == SHIM
    containerd.stop()
    out = gpuwire(
        "containerd", "configure", "--config", str(containerd.config),
        "--runtime-path", SHIM, "--set-default", "--cdi",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "has no CDI support (needs 1.7): it ignores enable_cdi" in out.stderr
    containerd.start()
    assert cri_status(containerd) == "ok"  # 1.6 ignores the CDI keys rather than failing
    assert cri_section(containerd.dump())["containerd"]["default_runtime_name"] == "gpuwire"


def test_cri_refuses_a_broken_handler(containerd: Containerd) -> None:
    """The check above can fail: a default runtime that is not configured stops the CRI plugin."""
    with containerd.config.open("a") as f:
        f.write(f'  [plugins."{CRI}".containerd]\n    default_runtime_name = "gpuwire"\n')
    containerd.start()
    assert cri_status(containerd) == "error"


def test_containerd_loads_the_prestart_hook_base_spec(containerd: Containerd) -> None:
    """containerd reads base_runtime_spec files when the CRI plugin loads; a bad one fails it."""
    base = containerd.home / "base-spec.json"
    configure(containerd, "--prestart-hook", "--hook-path", HOOK, "--base-spec", str(base))
    spec = json.loads(base.read_text())
    assert spec["hooks"]["prestart"][-1]["path"] == HOOK
    assert spec["linux"]["namespaces"]  # containerd's own default spec (`ctr oci spec`)
    containerd.start()
    assert cri_status(containerd) == "ok"
    runtime = cri_section(containerd.dump())["containerd"]["runtimes"]["gpuwire"]
    assert runtime["base_runtime_spec"] == str(base)
    assert runtime["options"].get("BinaryName", "") == ""  # runc itself
    containerd.stop()
    base.write_text("{not json")
    containerd.start()
    assert cri_status(containerd) == "error"


def test_config_dump_as_the_source(containerd: Containerd) -> None:
    configure(containerd, "--runtime-path", SHIM, "--config-source", "command")
    drop_in = tomlkit.parse((containerd.home / "conf.d/99-gpuwire.toml").read_text()).unwrap()
    section = drop_in["plugins"][CRI]
    # the effective config, defaults included (containerd's own runc entry and options)
    assert section["sandbox_image"] == "registry.example/pause:9"
    assert "max_container_log_line_size" in section
    assert section["containerd"]["runtimes"]["gpuwire"]["options"]["BinaryName"] == SHIM
    again = gpuwire(
        "containerd", "configure", "--config", str(containerd.config),
        "--runtime-path", SHIM, "--config-source", "command",
    )  # fmt: skip
    assert again.stdout.startswith("no change:"), again.stdout
    containerd.start()
    assert cri_status(containerd) == "ok"


# Containers through the shim, as containerd's runc shim runs it (`BinaryName`).


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("containerd") / "lab")


@pytest.fixture(scope="module")
def node_containerd(lab: Lab) -> Iterator[Containerd]:
    """A private containerd whose shims (and so gpuwire-runtime) read the lab's config."""
    with Containerd.create() as instance:
        instance.start(env={"GPUWIRE_CONFIG": str(lab.config)})
        instance.import_image(write_layout_tar(lab.root / "busybox.tar"))
        yield instance


def run_view(
    containerd: Containerd,
    env: dict[str, str],
    *,
    runc_binary: str | None = SHIM,
    annotations: dict[str, str] | None = None,
    mounts: tuple[Mount, ...] = (),
) -> dict[str, list[str]]:
    container = Container(
        NAME,
        ("sh", "-c", VIEW_SCRIPT),
        runc_binary=runc_binary,
        annotations=cri_annotations() if annotations is None else annotations,
        env=env,
        mounts=mounts,
    )
    out = containerd.run(container)
    assert out.returncode == 0, out.stderr
    return view(out.stdout)


def granted(lab: Lab, visible: str) -> dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": visible, "GPUWIRE_GRANT": grant_for(lab.keys, visible)}


@pytest.mark.parametrize("served", [False, True], ids=["python", "resident"])
def test_ctr_run_through_the_shim_gives_the_granted_gpus(
    lab: Lab, node_containerd: Containerd, served: bool
) -> None:
    shim = str(served_launchers() / launcher.RUNTIME) if served else SHIM
    seen = run_view(node_containerd, granted(lab, "1,3"), runc_binary=shim)
    expected = granted_view(lab.inventory.devices, (1, 3))
    assert shown(seen, expected) == expected
    assert seen["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]
    assert any("team-a/trainer: GPUs 1 (" in line for line in lab.log_lines())


def test_no_grant_no_gpu(lab: Lab, node_containerd: Containerd) -> None:
    seen = run_view(node_containerd, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert seen["devices"] == ["nvidia*"]  # the glob matched nothing
    assert "libcuda" not in seen
    assert seen["env"] == ["void"]
    assert "team-a/trainer: no GPU: NVIDIA_VISIBLE_DEVICES=all" in lab.log_lines()[-1]


def test_a_grant_for_another_namespace_gives_no_gpu(lab: Lab, node_containerd: Containerd) -> None:
    seen = run_view(
        node_containerd, granted(lab, "0"), annotations=cri_annotations(namespace="team-b")
    )
    assert seen["devices"] == ["nvidia*"]


def test_without_the_shim_nothing_is_injected(lab: Lab, node_containerd: Containerd) -> None:
    seen = run_view(node_containerd, granted(lab, "0"), runc_binary=None)
    assert seen["devices"] == ["nvidia*"]
    assert seen["env"] == ["0"]  # as the image asked: nobody read it


def test_device_plugin_allocation_arrives_as_a_mount(lab: Lab, node_containerd: Containerd) -> None:
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(2)], lab.keys).token
    mount = Mount(lab.allocations / token, allocation.container_path(token))
    seen = run_view(node_containerd, {"NVIDIA_VISIBLE_DEVICES": "plugin"}, mounts=(mount,))
    expected = granted_view(lab.inventory.devices, (2,))
    assert shown(seen, expected) == expected


def test_unknown_device_fails_the_start(lab: Lab, node_containerd: Containerd) -> None:
    container = Container(
        NAME, ("true",), runc_binary=SHIM, annotations=cri_annotations(), env=granted(lab, "9")
    )
    out = node_containerd.run(container)
    assert out.returncode != 0
    assert "unknown device '9'" in out.stderr


def test_a_gpu_container_is_deleted_after_upgrades_removed_its_version(
    lab: Lab, node_containerd: Containerd, tmp_path: Path
) -> None:
    """containerd keeps the runtime path a container started with (its task's options.json)
    and the runc shim calls it again to kill and delete: through `current`, as the installer
    configures it, that path reaches the version installed by then."""
    opt = tmp_path / "opt/gpuwire"
    for version in ("0.1.0", "0.2.0"):
        launcher.install(str(opt / version / "libexec"))

    def switch(version: str) -> None:  # as the installer does: one rename
        (opt / ".current").symlink_to(version)
        os.replace(opt / ".current", opt / "current")

    switch("0.1.0")
    binary = str(opt / "current/libexec/gpuwire-runtime")
    cid = f"gpuwire-{uuid.uuid4().hex[:12]}"
    container = Container(
        NAME, ("sleep", "600"), runc_binary=binary, annotations=cri_annotations(),
        env=granted(lab, "0"),
    )  # fmt: skip
    try:
        started = node_containerd.run_detached(container, cid, tmp_path / "log")
        assert started.returncode == 0, started.stderr
        assert (lab.records / cid).exists()  # gpuwire holds GPU 0 for it
        switch("0.2.0")
        shutil.rmtree(opt / "0.1.0")  # two upgrades later the installer has removed it
        node_containerd.ctr("tasks", "kill", "--signal", "SIGKILL", cid)
        until(lambda: node_containerd.task_status(cid) == "STOPPED")
        deleted = node_containerd.ctr("tasks", "delete", cid, check=False)
        assert deleted.returncode == 0, deleted.stderr
        assert not (lab.records / cid).exists()  # the delete went through gpuwire
    finally:  # whatever failed, runc itself behind that path lets the container go
        (opt / "runc/libexec").mkdir(parents=True)
        (opt / "runc/libexec/gpuwire-runtime").symlink_to(str(shutil.which("runc")))
        switch("runc")
        node_containerd.remove(cid)


@pytest.mark.parametrize("served", [False, True], ids=["python", "resident"])
def test_prestart_hook_from_the_base_spec_injects(lab: Lab, tmp_path: Path, served: bool) -> None:
    """containerd starts a container from the base spec `configure --prestart-hook` wrote
    (with the process a pod would add), and the hook in it gives the granted GPU."""
    hook = str(served_launchers() / launcher.HOOK) if served else HOOK
    with Containerd.create(cri=True) as containerd:
        base = containerd.home / "base-spec.json"
        configure(containerd, "--prestart-hook", "--hook-path", hook, "--base-spec", str(base))
        containerd.start()
        spec = json.loads(base.read_text())
        spec["root"] = {"path": str(busybox_rootfs(tmp_path / "rootfs"))}
        spec["process"]["args"] = ["sh", "-c", VIEW_SCRIPT]
        env = {"PATH": "/usr/bin:/bin", **granted(lab, "2")}
        spec["process"]["env"] = [f"{k}={v}" for k, v in env.items()]
        spec["annotations"] = cri_annotations()
        # the lab's config is not at the default path the hook reads
        spec["hooks"]["prestart"][-1]["env"].append(f"GPUWIRE_CONFIG={lab.config}")
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        out = containerd.run(Container(spec=tmp_path / "spec.json"))
    assert out.returncode == 0, out.stderr
    expected = granted_view(lab.inventory.devices, (2,))
    assert shown(view(out.stdout), expected) == expected
