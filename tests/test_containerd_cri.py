"""Pods through containerd's own CRI plugin, on each containerd generation a node may run:
1.6 (Debian 12), 1.7 (Debian 13) and 2.x (sid), the ones other than the system's fetched by
`scripts/install-system-deps` (testbed/containerds.py).

For each: `gpuwire containerd configure` writes its drop-in in the generation's own config
version (2 before containerd 2.0, 3 from it) and the daemon itself loads it; a GPU pod goes
through the shim via CRI, the kubelet stand-in (testbed/kuberuntime.py) sending only the
pod's metadata, so the `io.kubernetes.cri.*` annotations the shim's trust decision reads are
written by containerd; the device plugin's Allocate answer reaches the container as the
kubelet hands it over; and the `cdi` overlay's path (no runtime class: the plugin names CDI
devices, containerd applies gpuwire's spec) gives exactly those GPUs on 1.7 and 2.x, and
none on 1.6, which drops CRI's CDI devices.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from deviceplugin.allocate import Strategies, response
from deviceplugin.api import api_pb2
from gpuwire import allocation
from gpuwire.lab.containerd import CRI_NAMESPACE, RUNTIME_PLUGIN, Containerd
from gpuwire.lab.image import NAME, write_layout_tar
from gpuwire.lab.view import VIEW_SCRIPT, granted_view, shown, view
from testbed import containerds
from testbed.containerds import Generation
from testbed.cri import api_pb2 as cri
from testbed.kuberuntime import KubeRuntime, run_pod
from tests.conftest import requires_root
from tests.runtime_support import Lab, grant_for

pytestmark = [requires_root()]

BIN = Path(sys.executable).parent
SHIM = str(BIN / "gpuwire-runtime")
GPUWIRE = str(BIN / "gpuwire")
HANDLER = "gpuwire"  # deploy/base/runtimeclass.yaml: RuntimeClass gpuwire → handler gpuwire
TRUSTED = ("sandbox-namespace", "sandbox-name", "sandbox-uid", "sandbox-id", "container-name")


@pytest.fixture(scope="module", params=containerds.SUITES)
def generation(request: pytest.FixtureRequest) -> Generation:
    found = containerds.generations().get(request.param)
    if found is None:
        pytest.skip(
            f"no containerd of Debian {request.param}: scripts/install-system-deps fetches it"
        )
    return found


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("cri") / "lab")


def configure(containerd: Containerd, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuwire containerd configure` as an admin runs it beside that containerd."""
    command = [
        GPUWIRE,
        "containerd",
        "configure",
        "--config",
        str(containerd.config),
        "--containerd",
        containerd.binary("containerd"),
        *args,
    ]
    out = subprocess.run(command, capture_output=True, text=True, env=containerd.generation.env())
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def node(generation: Generation, lab: Lab) -> Iterator[Containerd]:
    """The generation's containerd with the gpuwire handler and CDI on where it has CDI (the
    spec `gpuwire cdi generate` wrote for the lab's node in its spec dir), the busybox
    image among the CRI plugin's images."""
    with Containerd.create(cri=True, generation=generation) as containerd:
        configure(containerd, "--runtime-path", SHIM, *(("--cdi",) if generation.cdi else ()))
        spec = containerd.home / "cdi/gpuwire.yaml"
        out = subprocess.run(
            [GPUWIRE, "cdi", "generate", "--output", str(spec)],
            env={"GPUWIRE_CONFIG": str(lab.config)},
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
        containerd.import_image(write_layout_tar(containerd.home / "busybox.tar"), CRI_NAMESPACE)
        yield containerd


@pytest.fixture
def kubelet(node: Containerd) -> Iterator[KubeRuntime]:
    with node.kuberuntime() as runtime:
        yield runtime


def pod(namespace: str = "team-a", container: str = "trainer", **env: str) -> dict[str, Any]:
    """A pod as the API server stores it once the webhook has mutated it: `env` is what
    the webhook wrote (grant, visible devices)."""
    return {
        "metadata": {
            "name": "p-" + uuid.uuid4().hex[:6],
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
        },
        "spec": {
            "containers": [
                {
                    "name": container,
                    "image": NAME,
                    "command": ["sh", "-c", VIEW_SCRIPT],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ]
        },
    }


def seen(
    kubelet: KubeRuntime,
    obj: dict[str, Any],
    handler: str = HANDLER,
    answer: api_pb2.ContainerAllocateResponse | None = None,
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Run the pod to its end; what its container printed, and the OCI spec containerd made."""
    name = obj["spec"]["containers"][0]["name"]
    _, (cid,) = run_pod(kubelet, obj, handler, {name: [answer]} if answer else None)
    status = kubelet.exited(cid)
    assert status.exit_code == 0, kubelet.logs(cid)
    return view(kubelet.logs(cid)), kubelet.spec(cid)


def granted(lab: Lab, visible: str, namespace: str = "team-a") -> dict[str, str]:
    """What the webhook writes into a pod given GPUs `visible` in `namespace`."""
    grant = grant_for(lab.keys, visible, namespace=namespace)
    return {"NVIDIA_VISIBLE_DEVICES": visible, "GPUWIRE_GRANT": grant}


def test_the_daemon_loads_what_configure_writes(generation: Generation, node: Containerd) -> None:
    """Its own config version, loaded by that very containerd: `config dump` has the
    handler, and the CRI plugin (which validates its runtimes as it loads) reports ready."""
    drop_in = tomlkit.parse((node.home / "conf.d/99-gpuwire.toml").read_text()).unwrap()
    assert drop_in["version"] == generation.config_version
    plugin = RUNTIME_PLUGIN[generation.config_version]
    section = tomlkit.parse(node.dump()).unwrap()["plugins"][plugin]
    gpuwire = section["containerd"]["runtimes"][HANDLER]
    assert gpuwire["runtime_type"] == "io.containerd.runc.v2"
    assert gpuwire["options"]["BinaryName"] == SHIM
    if generation.cdi:
        assert section["enable_cdi"] is True
        assert section["cdi_spec_dirs"] == [f"{node.home}/cdi"]  # the testbed's, kept
    with node.kuberuntime() as kubelet:
        version = kubelet.version()
        ready = {
            c.type: c.status
            for c in kubelet.call(kubelet.runtime.Status, cri.StatusRequest()).status.conditions
        }
    assert version.runtime_name == "containerd"
    assert generation.version.startswith(version.runtime_version.split("+")[0].split("~")[0])
    assert ready["RuntimeReady"] is True  # NetworkReady is not: no CNI, host-network pods


def test_a_gpu_pod_through_the_shim(lab: Lab, kubelet: KubeRuntime) -> None:
    obj = pod(**granted(lab, "1,3"))
    got, spec = seen(kubelet, obj)
    expected = granted_view(lab.inventory.devices, (1, 3))
    assert shown(got, expected) == expected
    assert got["env"] == [f"{lab.uuid(1)},{lab.uuid(3)}"]
    annotations = spec["annotations"]
    meta = obj["metadata"]
    # written by containerd from the pod's metadata: the kubelet sent none of them
    assert annotations["io.kubernetes.cri.sandbox-namespace"] == "team-a"
    assert annotations["io.kubernetes.cri.sandbox-name"] == meta["name"]
    assert annotations["io.kubernetes.cri.sandbox-uid"] == meta["uid"]
    assert annotations["io.kubernetes.cri.container-name"] == "trainer"
    assert any("team-a/trainer: GPUs 1 (" in line for line in lab.log_lines())


def test_a_grant_moved_to_another_namespace_gives_no_gpu(lab: Lab, kubelet: KubeRuntime) -> None:
    """The grant is signed for team-a; containerd says the pod is in team-b."""
    got, _ = seen(kubelet, pod("team-b", **granted(lab, "0")))
    assert got["devices"] == ["nvidia*"]
    assert got["env"] == ["void"]


def test_without_the_handler_nothing_is_injected(lab: Lab, kubelet: KubeRuntime) -> None:
    """No runtimeClassName: containerd's default handler, runc, reads no grant."""
    got, _ = seen(kubelet, pod(**granted(lab, "0")), handler="")
    assert got["devices"] == ["nvidia*"]
    assert got["env"] == ["0"]


def allocated(lab: Lab, index: int, strategies: Strategies) -> api_pb2.ContainerAllocateResponse:
    """The device plugin's Allocate answer for GPU `index` (deviceplugin/allocate.py), its
    token file written as the plugin writes it."""
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(index)], lab.keys).token
    return response([lab.inventory.devices[index]], token, str(lab.allocations), strategies)


def test_the_device_plugins_answer_reaches_the_shim(lab: Lab, kubelet: KubeRuntime) -> None:
    """Envs and the token mount of Allocate, as the kubelet passes them; the webhook's
    `plugin` grant; the token binds to the pod UID containerd writes."""
    answer = allocated(lab, 2, Strategies())
    got, spec = seen(kubelet, pod(**granted(lab, "plugin")), answer=answer)
    expected = granted_view(lab.inventory.devices, (2,))
    assert shown(got, expected) == expected
    token = Path(answer.mounts[0].container_path).name
    assert any(m["destination"] == f"/run/gpuwire/allocations/{token}" for m in spec["mounts"])


def test_cdi_devices_through_cri(generation: Generation, lab: Lab, kubelet: KubeRuntime) -> None:
    """The `cdi` overlay: no runtime class, the plugin names GPU 1 as a CDI device (field 17
    of ContainerConfig), containerd applies gpuwire's spec. 1.6 ignores the field."""
    answer = allocated(lab, 1, Strategies(cdi="uuid"))
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={lab.uuid(1)}"]
    got, _ = seen(kubelet, pod(), handler="", answer=answer)
    if not generation.cdi:
        assert got["devices"] == ["nvidia*"]
        return
    control = "nvidia-modeset nvidia-uvm nvidia-uvm-tools"
    expected = granted_view(lab.inventory.devices, (1,), control=control)
    assert shown(got, expected) == expected
