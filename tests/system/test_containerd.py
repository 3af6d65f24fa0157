"""containerd itself reads what `gpuwire containerd configure` writes, and runs GPU pods
through the shim with its own CRI plugin, on each containerd generation a node may run: 1.6
(Debian 12), 1.7 (Debian 13) and 2.x (sid), those other than the system's fetched by
`scripts/install-system-deps` (testbed/containerds.py).

A private containerd (testbed/containerd.py) starts from a main config an admin might
have, after `gpuwire containerd configure` added its drop-in: `config dump` must show the
handler, and the CRI plugin, which validates its runtimes when it loads, must load. Each
generation gets the drop-in in its own config version (2 before containerd 2.0, 3 from it).

Then pods, over CRI: the kubelet stand-in (testbed/kuberuntime.py) sends the pod's metadata
and the env the webhook wrote, never an `io.kubernetes.cri.*` annotation, so what the shim's
trust decision reads is what containerd wrote. They show the same GPU view as the runc tests
(tests/system/test_runc.py); the device plugin's Allocate answer reaches the container as
the kubelet hands it over; the `cdi` overlay's path (no runtime class: the plugin names CDI
devices, containerd applies gpuwire's spec) gives exactly those GPUs from 1.7 on, and none on
1.6, which drops CRI's CDI devices. `ctr` remains only where these tests read containerd
itself (`ctr plugins ls`: did the CRI plugin load).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from deviceplugin.agent import mps as daemons
from deviceplugin.api import api_pb2
from deviceplugin.plugin.allocate import Strategies, response
from gpuwire import allocation, mps
from gpuwire.grant import POD_ANNOTATION
from runtime_hook.setup import launcher
from testbed import containerds
from testbed.containerd import CRI, CRI_NAMESPACE, RUNTIME_PLUGIN, Containerd
from testbed.containerds import Generation
from testbed.cri import api_pb2 as cri
from testbed.image import NAME, PAUSE, write_layout_tar
from testbed.kuberuntime import CRIError, KubeRuntime, run_pod
from testbed.lab import ADMISSION, Lab, grant_for, served_launchers
from testbed.view import VIEW_SCRIPT, granted_view, shown, view
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("containerd", "ctr")]

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuwire-runtime")
HOOK = str(BIN / "gpuwire-hook")
GPUWIRE = str(BIN / "gpuwire")
HANDLER = "gpuwire"  # deploy/base/runtimeclass.yaml: RuntimeClass gpuwire → handler gpuwire
SERVED = "gpuwire-served"


def gpuwire(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUWIRE, *args], capture_output=True, text=True)


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
    """`gpuwire containerd configure` as an admin runs it beside that containerd."""
    out = subprocess.run(
        [GPUWIRE, "containerd", "configure", "--config", str(containerd.config),
         "--containerd", containerd.binary("containerd"), *args],
        capture_output=True, text=True, env=containerd.generation.env(),
    )  # fmt: skip
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


# Pods through containerd's CRI plugin, on every generation.


def generation_of(suite: str) -> Generation:
    """Debian `suite`'s containerd (skipped where it is not fetched: CI requires it)."""
    found = containerds.generations().get(suite)
    if found is None:
        pytest.skip(f"no containerd of Debian {suite}: install-system-deps fetches it")
    return found


@pytest.fixture(scope="module", params=containerds.SUITES)
def generation(request: pytest.FixtureRequest) -> Generation:
    return generation_of(request.param)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("containerd") / "lab")


def node_containerd(generation: Generation, lab: Lab, *configured: list[str]) -> Containerd:
    """The generation's containerd configured by `configured` runs of configure, started
    with the lab's config for the shim, the busybox image among its pods' images, and in its
    CDI spec dir the spec `gpuwire cdi generate` writes for the lab's node."""
    containerd = Containerd.create(cri=True, generation=generation)
    try:
        for args in configured:
            configure(containerd, *args)
        spec = str(containerd.home / "cdi/gpuwire.yaml")
        out = subprocess.run([GPUWIRE, "cdi", "generate", "--output", spec], capture_output=True,
                             text=True, env={"GPUWIRE_CONFIG": str(lab.config)})  # fmt: skip
        assert out.returncode == 0, out.stderr
        containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
        containerd.import_image(write_layout_tar(containerd.home / "busybox.tar"), CRI_NAMESPACE)
    except BaseException:
        containerd.close()
        raise
    return containerd


@pytest.fixture(scope="module")
def node(generation: Generation, lab: Lab) -> Iterator[Containerd]:
    """Handlers `gpuwire` (gpuwire-runtime) and `gpuwire-served` (its launcher, served by a
    resident gpuwire); CDI on where there is CDI."""
    cdi = ["--cdi"] if generation.cdi else []
    served = [
        "--runtime-name",
        SERVED,
        "--runtime-path",
        str(served_launchers() / launcher.RUNTIME),
    ]
    with node_containerd(generation, lab, ["--runtime-path", SHIM, *cdi], served) as containerd:
        yield containerd


@pytest.fixture
def kubelet(node: Containerd) -> Iterator[KubeRuntime]:
    with node.kuberuntime() as runtime:
        yield runtime


def pod(
    namespace: str = "team-a", command: str = VIEW_SCRIPT, admission: str = ADMISSION, **env: str
) -> dict[str, Any]:
    """A pod as the API server stores it once the webhook has mutated it: `env` is what the
    webhook wrote (grant, visible devices, limits), `admission` the request its grants bind."""
    name = f"p-{uuid.uuid4().hex[:6]}"
    container = {"name": "trainer", "image": NAME, "command": ["sh", "-c", command],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}  # fmt: skip
    meta = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
            "annotations": {POD_ANNOTATION: admission}}  # fmt: skip
    return {"metadata": meta, "spec": {"containers": [container]}}


def run_view(
    kubelet: KubeRuntime,
    obj: dict[str, Any],
    handler: str = HANDLER,
    answer: api_pb2.ContainerAllocateResponse | None = None,
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Run the pod to its end; what its container printed, and the OCI spec containerd made."""
    answers = {obj["spec"]["containers"][0]["name"]: [answer]} if answer else None
    _, (cid,) = run_pod(kubelet, obj, handler, answers)
    status = kubelet.exited(cid)
    assert status.exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid)), kubelet.spec(cid)


def granted(lab: Lab, visible: str, **limits: str) -> dict[str, str]:
    env = {"NVIDIA_VISIBLE_DEVICES": visible, **limits}
    return {**env, "GPUWIRE_GRANT": grant_for(lab.keys, visible, env=env)}


def shims(containerd: Containerd) -> set[str]:
    """The executables of the shims serving this containerd (their command line names its
    socket)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if b"containerd-shim" in cmdline and str(containerd.address).encode() in cmdline:
                found.add(os.readlink(proc / "exe"))
        except OSError:
            continue
    return found


def test_each_generation_loads_what_configure_writes(
    generation: Generation, node: Containerd, kubelet: KubeRuntime
) -> None:
    """In its own config version, loaded by that very containerd (its CRI Version, its own
    shim): `config dump` has the handlers, the CRI plugin (which validates its runtimes as
    it loads) is ready."""
    drop_in = tomlkit.parse((node.home / "conf.d/99-gpuwire.toml").read_text()).unwrap()
    assert drop_in["version"] == generation.config_version
    section = tomlkit.parse(node.dump()).unwrap()["plugins"][
        RUNTIME_PLUGIN[generation.config_version]
    ]
    runtimes = section["containerd"]["runtimes"]
    assert runtimes[HANDLER]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes[HANDLER]["options"]["BinaryName"] == SHIM
    assert runtimes[SERVED]["options"]["BinaryName"] == str(served_launchers() / launcher.RUNTIME)
    if generation.cdi:
        assert section["enable_cdi"] is True
        assert section["cdi_spec_dirs"] == [f"{node.home}/cdi"]  # the testbed's, kept
    version = kubelet.version()
    assert version.runtime_name == "containerd"
    assert generation.version.startswith(version.runtime_version.split("+")[0].split("~")[0])
    status = kubelet.call(kubelet.runtime.Status, cri.StatusRequest()).status
    ready = {c.type: c.status for c in status.conditions}
    assert ready["RuntimeReady"] is True  # NetworkReady is not: no CNI, host-network pods
    kubelet.run_sandbox(pod())
    assert shims(node) == {str(generation.bin / "containerd-shim-runc-v2")}


@pytest.mark.parametrize("handler", [HANDLER, SERVED], ids=["python", "resident"])
def test_a_gpu_pod_through_the_shim_gets_the_granted_gpus(
    lab: Lab, kubelet: KubeRuntime, handler: str
) -> None:
    obj = pod(**granted(lab, "1,3"))
    seen, spec = run_view(kubelet, obj, handler)
    expected = granted_view(lab.machine.devices, (1, 3))
    assert shown(seen, expected) == expected
    assert seen["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]
    assert any("team-a/trainer: GPUs 1 (" in line for line in lab.log_lines())
    # what the shim trusted, written by containerd from the pod's metadata
    annotations, meta = spec["annotations"], obj["metadata"]
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "team-a"
    assert annotations["io.kubernetes.cri.sandbox-name"] == meta["name"]
    assert annotations["io.kubernetes.cri.sandbox-uid"] == meta["uid"]
    assert annotations["io.kubernetes.cri.container-name"] == "trainer"
    # and the one pod annotation `containerd configure` passes through: what the grant binds
    assert annotations[POD_ANNOTATION] == meta["annotations"][POD_ANNOTATION]


def test_no_grant_no_gpu(lab: Lab, kubelet: KubeRuntime) -> None:
    seen, _ = run_view(kubelet, pod(NVIDIA_VISIBLE_DEVICES="all"))
    assert seen["devices"] == ["nvidia*"]  # the glob matched nothing
    assert "libcuda" not in seen
    assert seen["env"] == ["void"]
    assert "team-a/trainer: no GPU: NVIDIA_VISIBLE_DEVICES=all" in lab.log_lines()[-1]


def test_a_grant_for_another_namespace_gives_no_gpu(lab: Lab, kubelet: KubeRuntime) -> None:
    """The grant is signed for team-a; containerd says the pod is in team-b."""
    seen, _ = run_view(kubelet, pod("team-b", **granted(lab, "0")))
    assert seen["devices"] == ["nvidia*"]


def test_a_grant_in_another_pod_of_its_namespace_gives_no_gpu(
    lab: Lab, kubelet: KubeRuntime
) -> None:
    """The same env (grant and all) in a pod of another admission, as containerd passes its
    gpuwire.io/grant-pod through. Before: the grant held for any pod of the namespace."""
    seen, _ = run_view(kubelet, pod(admission="another-admission", **granted(lab, "0")))
    assert seen["devices"] == ["nvidia*"]
    assert "does not sign" in lab.log_lines()[-1]


def test_a_pods_sandbox_is_found_by_its_uid_as_the_kubelet_finds_it(kubelet: KubeRuntime) -> None:
    """A sandbox whose RunPodSandbox answer was lost (containerd restarting mid-call) is the
    pod's at the next try, not a second one refused on its reserved name; one no longer
    ready is removed, and the next runs at the next attempt."""
    obj = pod()
    lost = kubelet.run_sandbox(obj)
    kubelet.sandboxes.clear()  # as if its answer never arrived
    found = kubelet.run_sandbox(obj)
    assert found.id == lost.id
    kubelet.call(kubelet.runtime.StopPodSandbox, cri.StopPodSandboxRequest(pod_sandbox_id=lost.id))
    again = kubelet.run_sandbox(obj)
    assert (again.id != lost.id, again.config.metadata.attempt) == (True, 1)
    listed = kubelet.call(kubelet.runtime.ListPodSandbox, cri.ListPodSandboxRequest()).items
    assert [s.id for s in listed if s.metadata.uid == obj["metadata"]["uid"]] == [again.id]


def test_without_the_shim_nothing_is_injected(lab: Lab, kubelet: KubeRuntime) -> None:
    """No runtimeClassName: containerd's default handler, runc, reads no grant."""
    seen, _ = run_view(kubelet, pod(**granted(lab, "0")), handler="")
    assert seen["devices"] == ["nvidia*"]
    assert seen["env"] == ["0"]  # as the image asked: nobody read it


def test_the_pods_env_comes_after_the_plugins_and_wins(kubelet: KubeRuntime) -> None:
    """containerd keeps both entries in the spec, in the kubelet's order; runc lets the last
    one win."""
    answer = api_pb2.ContainerAllocateResponse(envs={"A": "plugin", "B": "plugin"})
    obj = pod(command="env | grep -E '^(A|B)='", A="pod")
    _, (cid,) = run_pod(kubelet, obj, "", {"trainer": [answer]})
    kubelet.exited(cid)
    assert sorted(kubelet.logs(cid).splitlines()) == ["A=pod", "B=plugin"]
    env = [e for e in kubelet.spec(cid)["process"]["env"] if e[:2] in ("A=", "B=")]
    assert set(env[:2]) == {"A=plugin", "B=plugin"}  # the answer's map, in no order
    assert env[2:] == ["A=pod"]


def allocated(lab: Lab, index: int, strategies: Strategies) -> api_pb2.ContainerAllocateResponse:
    """The device plugin's Allocate answer for GPU `index` (deviceplugin/plugin/allocate.py), its
    token file written as the plugin writes it."""
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(index)], lab.keys).token
    return response([lab.machine.devices[index]], token, str(lab.allocations), strategies)


def test_device_plugin_allocation_arrives_as_a_mount(lab: Lab, kubelet: KubeRuntime) -> None:
    """Envs and the token mount of Allocate as the kubelet passes them, the webhook's
    `plugin` grant; the token binds to the pod UID containerd writes."""
    answer = allocated(lab, 2, Strategies())
    seen, spec = run_view(kubelet, pod(**granted(lab, "plugin")), answer=answer)
    expected = granted_view(lab.machine.devices, (2,))
    assert shown(seen, expected) == expected
    token = Path(answer.mounts[0].container_path).name
    assert any(m["destination"] == allocation.container_path(token) for m in spec["mounts"])


def test_unknown_device_fails_the_start(lab: Lab, kubelet: KubeRuntime) -> None:
    obj = pod(command="true", **granted(lab, "9"))
    with pytest.raises(CRIError, match="unknown device '9'"):
        run_pod(kubelet, obj, HANDLER)


def test_cdi_devices_through_cri(generation: Generation, lab: Lab, kubelet: KubeRuntime) -> None:
    """The `cdi` overlay: no runtime class, the plugin names GPU 1 as a CDI device (field 17
    of ContainerConfig), containerd applies gpuwire's spec. 1.6 drops the field."""
    answer = allocated(lab, 1, Strategies(cdi="uuid"))
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={lab.uuid(1)}"]
    seen, _ = run_view(kubelet, pod(), handler="", answer=answer)
    if not generation.cdi:
        assert seen["devices"] == ["nvidia*"]
        return
    control = "nvidia-modeset nvidia-uvm nvidia-uvm-tools"  # the spec's, with display
    expected = granted_view(lab.machine.devices, (1,), control=control)
    assert shown(seen, expected) == expected


def test_a_gpu_container_is_deleted_after_upgrades_removed_its_version(
    generation: Generation, lab: Lab, tmp_path: Path
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
    containerd = node_containerd(generation, lab, ["--runtime-path", binary])
    try:
        with containerd.kuberuntime() as kubelet:
            _, (cid,) = run_pod(kubelet, pod(command="sleep 600", **granted(lab, "0")), HANDLER)
            assert (lab.records / cid).exists()  # gpuwire holds GPU 0 for it
            switch("0.2.0")
            shutil.rmtree(opt / "0.1.0")  # two upgrades later the installer has removed it
            kubelet.stop(cid)
            kubelet.remove(cid)
            assert not (lab.records / cid).exists()  # the delete went through gpuwire
    finally:  # whatever failed, runc itself behind that path lets the container go
        (opt / "runc/libexec").mkdir(parents=True)
        (opt / "runc/libexec/gpuwire-runtime").symlink_to(str(shutil.which("runc")))
        switch("runc")
        containerd.close()


@pytest.mark.parametrize("served", [False, True], ids=["python", "resident"])
def test_prestart_hook_from_the_base_spec_injects(
    generation: Generation, lab: Lab, served: bool
) -> None:
    """The CRI plugin starts the pod's container from the base spec `configure
    --prestart-hook` wrote, and the hook in it gives the granted GPU."""
    hook = str(served_launchers() / launcher.HOOK) if served else HOOK
    containerd = Containerd.create(cri=True, generation=generation)
    with containerd:
        base = containerd.home / "base-spec.json"
        configure(containerd, "--prestart-hook", "--hook-path", hook, "--base-spec", str(base))
        spec = json.loads(base.read_text())
        # the lab's config is not at the default path the hook reads
        spec["hooks"]["prestart"][-1]["env"].append(f"GPUWIRE_CONFIG={lab.config}")
        base.write_text(json.dumps(spec))
        containerd.start()
        containerd.import_image(write_layout_tar(containerd.home / "busybox.tar"), CRI_NAMESPACE)
        with containerd.kuberuntime() as kubelet:
            seen, _ = run_view(kubelet, pod(**granted(lab, "2")))
    expected = granted_view(lab.machine.devices, (2,))
    assert shown(seen, expected) == expected


# Limits that hold, over CRI: the lab's node with the node agent's MPS control daemons.


@pytest.fixture(scope="module")
def mps_daemons(lab: Lab) -> Iterator[str]:
    """MPS control daemons (the stand-in program, as the node agent runs it) for the lab's
    GPUs 0 and 1, named in the lab's node config; a short root: a socket path is short."""
    root = tempfile.mkdtemp(prefix="gw-mps-")
    control = daemons.control_binary(str(lab.node))
    assert control is not None
    supervisor = daemons.Supervisor(root, control, lambda gpu: mps.Defaults(25, None))
    supervisor.step(lab.machine.devices[:2], frozenset())
    lab.configure(**{"mps-root": root})
    try:
        yield root
    finally:
        supervisor.close()
        lab.configure()
        shutil.rmtree(root, ignore_errors=True)


def test_an_mps_pod_is_joined_to_its_gpus_daemon_through_cri(
    lab: Lab, kubelet: KubeRuntime, mps_daemons: str
) -> None:
    limits = {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    shared = Path(mps.shm_dir(mps_daemons, lab.uuid(1)), "mark-cri")
    shared.write_text("")  # what GPU 1's daemon's /dev/shm holds
    seen, _ = run_view(kubelet, pod(**granted(lab, "1", **limits)))
    assert seen["mps"] == ["control", "nvidia-cuda-mps-control.pid"]  # GPU 1's daemon's pipes
    assert shared.name in seen["shm"]
    on_top = dict(m.split() for m in seen["mounted"])
    assert on_top.keys() == {"/dev/shm", "/tmp/nvidia-mps"}
    without, _ = run_view(kubelet, pod(**granted(lab, "1")))
    assert not {"mps", "shm"} & set(without)


def test_a_hami_core_pod_preloads_it_through_cri(lab: Lab, kubelet: KubeRuntime) -> None:
    seen, _ = run_view(kubelet, pod(**granted(lab, "2", CUDA_DEVICE_MEMORY_LIMIT="4096m")))
    assert seen["preload"] == ["/usr/local/vgpu/libvgpu.so"]
    assert seen["memory"] == ["4096 MiB"]
    without, _ = run_view(kubelet, pod(**granted(lab, "2")))
    assert "preload" not in without
    assert without["memory"] == ["81920 MiB"]
