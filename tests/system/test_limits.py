"""Limits that hold, with real runc on the simulated node: a container asking for MPS limits is
joined to its GPU's control daemon (the node agent's, here the stand-in of testbed/
mps_control.py run by deviceplugin/agent/mps.py), one asking for HAMi-core limits preloads the
node's HAMi-core (the simulated library), and one asking for none gets nothing of either. A
limit the node cannot hold (no daemon up, no library, an MPS client with two GPUs) fails the
start with the reason: no silent unlimited GPU. Through the shim and the prestart hook, each
also served by a resident gpuwire.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.agent import mps as daemons
from deviceplugin.plugin.allocate import Strategies, response
from gpuwire import allocation, claimtoken, hamicore, mps, sim
from gpuwire.claimtoken import ClaimDevice, ClaimToken
from gpuwire.driver import discover
from gpuwire.edits import bind_mount, container_edits, host_layout
from gpuwire.roots import Roots
from runtime_hook.start import spec as ocispec
from testbed import mps_control
from testbed.lab import NAMESPACE, POD_UID, Lab
from testbed.rootfs import Bundle
from testbed.view import VIEW_SCRIPT, view
from tests.conftest import requires_binary, requires_root
from tests.system.test_runc import DELIVERIES, granted_env, make_bundle, run

pytestmark = [requires_root(), requires_binary("runc")]

MPS_LIMITS = {
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
}
HAMI_LIMITS = {"CUDA_DEVICE_MEMORY_LIMIT": "4096m", "CUDA_DEVICE_SM_LIMIT": "30"}


@pytest.fixture
def lab(tmp_path: Path, socket_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """The lab node with the node agent's MPS control daemons for GPUs 0 and 1, each with a
    quarter of its GPU as the default."""
    lab = Lab(tmp_path / "lab")
    root = str(socket_dir / "mps")
    lab.configure(**{"mps-root": root})
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))  # the shim inherits it
    control = daemons.control_binary(str(lab.node))
    assert control is not None
    quarter = mps.Defaults(25, lab.machine.devices[0].memory_mib // 4)
    joined = daemons.clients(str(lab.records))
    supervisor = daemons.Supervisor(root, control, lambda gpu: quarter, joined=joined)
    supervisor.step(lab.machine.devices[:2], frozenset())
    lab.mps = supervisor  # type: ignore[attr-defined]
    try:
        yield lab
    finally:
        supervisor.close()


def supervisor(lab: Lab) -> daemons.Supervisor:
    found: daemons.Supervisor = lab.mps  # type: ignore[attr-defined]
    return found


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_an_mps_client_is_joined_to_its_gpus_daemon_with_its_limits(
    lab: Lab, delivery: str
) -> None:
    shared = Path(mps.shm_dir(supervisor(lab).root, lab.uuid(1)), f"mark-{delivery}")
    shared.write_text("")  # what GPU 1's daemon's /dev/shm holds
    out = run(
        make_bundle(lab, granted_env(lab, "1", limits=MPS_LIMITS), delivery=delivery), delivery
    )
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert mps.ready(supervisor(lab).root, lab.uuid(1)) is not None
    # GPU 1's daemon's own pipe directory: its socket and pid file, in the container
    assert seen["mps"] == ["control", "nvidia-cuda-mps-control.pid"]
    assert shared.name in seen["shm"]
    on_top = dict(m.split() for m in seen["mounted"])  # the last mount of a path wins
    assert on_top["/tmp/nvidia-mps"].startswith("ro,nosuid,nodev,noexec")
    assert on_top["/dev/shm"].startswith("rw,nosuid,nodev,noexec")
    assert on_top.keys() == {"/dev/shm", "/tmp/nvidia-mps"}
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in seen["var"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in seen["var"]
    if delivery.startswith("shim"):  # where the env can still be set; else MPS's default
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in seen["var"]
    assert seen["smi"] == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {lab.uuid(1)})"]
    assert "preload" not in seen
    assert lab.log_lines()[-1].endswith(
        f"GPUs 1 ({lab.uuid(1)}), capabilities compute,utility, limits held by mps: grant"
    )


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_an_mps_client_whose_daemon_is_down_does_not_start(lab: Lab, delivery: str) -> None:
    supervisor(lab).stop(lab.uuid(0), "the test stops it")
    out = run(
        make_bundle(lab, granted_env(lab, "0", limits=MPS_LIMITS), delivery=delivery), delivery
    )
    assert out.returncode != 0
    assert (
        f"GPU 0 ({lab.uuid(0)}) has no MPS control daemon running (no live daemon in "
        f"{supervisor(lab).root}/{lab.uuid(0)}/ready); without one its client would run unlimited"
    ) in out.stderr
    asked = ", ".join(f"{k}={v}" for k, v in MPS_LIMITS.items())
    assert f"cannot start: the container asks for MPS limits ({asked})" in lab.log_lines()[-1]


@functools.cache
def tenant_program() -> Path:
    """A static client of an MPS daemon's socket, for an image (testbed.mps_control.tenant)."""
    return mps_control.tenant(Path(tempfile.mkdtemp(prefix="gpuwire-tenant-"), "tenant"))


TENANT = """
tenant 'set_default_active_thread_percentage 100' 'set_default_device_pinned_mem_limit 0 80G'
tenant get_default_active_thread_percentage 'get_default_device_pinned_mem_limit 0' |
  sed 's/^/now: /'
tenant cuda_init | sed 's/^/server: /'
rm /tmp/nvidia-mps/control 2>&1 | sed 's/^/rm: /'
command -v nvidia-cuda-mps-control nvidia-cuda-mps-server | sed 's/^/program: /'
true
"""


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_a_tenant_keeps_neither_its_daemons_socket_nor_what_it_sets_there(
    lab: Lab, delivery: str
) -> None:
    """A container of GPU 0's 25 % share reaches its daemon through the one socket NVIDIA's
    MPS gives clients and commands alike (gpuwire.mps), sets the defaults to the whole GPU,
    and connects as a CUDA client does, which starts a server with them. It cannot remove or
    replace that socket (the pipe directory is read-only), has no MPS program, and the
    agent's next pass sets the share back and ends that server (and so its clients) by
    restarting the daemon. Before: it could remove the socket (the next client would find no
    daemon and run unlimited), had both programs, the daemon kept 100 %, and then the
    server kept it."""
    bundle = make_bundle(
        lab, granted_env(lab, "0", limits=MPS_LIMITS), delivery=delivery, script=TENANT
    )
    shutil.copy(tenant_program(), bundle.path / "rootfs/bin/tenant")
    out = run(bundle, delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["now"] == ["100.0", "80G"]  # connected through the read-only directory
    assert seen["rm"] == ["rm: can't remove '/tmp/nvidia-mps/control': Read-only file system"]
    assert "program" not in seen
    root, uuid = supervisor(lab).root, lab.uuid(0)
    (server,) = (Path(f"/proc/{pid}") for pid in seen["server"])
    assert server.exists()
    share = mps.Defaults(25, lab.machine.devices[0].memory_mib // 4)
    lifted = mps.Defaults(None, 80 * 1024)
    assert daemons.read(supervisor(lab).control, root, uuid) == (lifted, {int(server.name): lifted})
    supervisor(lab).step(lab.machine.devices[:2], frozenset())
    assert not server.exists()
    assert daemons.read(supervisor(lab).control, root, uuid) == (share, {})
    assert (supervisor(lab).restored, supervisor(lab).ended) == ({uuid: 1}, {uuid: 1})


WRITES = VIEW_SCRIPT + "echo secret > /dev/shm/team-a\n"


def test_a_gpus_dev_shm_is_its_clients_alone_and_empty_once_they_are_gone(lab: Lab) -> None:
    """team-a's container on GPU 0 leaves a file in its /dev/shm; team-b's on GPU 1 does not
    see it (before: one /dev/shm for every daemon and client, namespace and GPU), and once
    no container is joined to GPU 0's daemon the agent restarts it on an empty one (before:
    the file outlived both)."""
    a_env = granted_env(lab, "0", limits=MPS_LIMITS)
    first = run(make_bundle(lab, a_env, delivery="prestart", script=WRITES), "prestart")
    assert first.returncode == 0, first.stderr
    b_env = granted_env(lab, "1", limits=MPS_LIMITS)
    other = run(make_bundle(lab, b_env, delivery="prestart"), "prestart")
    assert other.returncode == 0, other.stderr
    assert "team-a" not in view(other.stdout).get("shm", [])
    left = Path(mps.shm_dir(supervisor(lab).root, lab.uuid(0)), "team-a")
    assert left.read_text() == "secret\n"  # until its daemon has no client
    supervisor(lab).step(lab.machine.devices[:2], frozenset())
    assert not left.exists()
    assert os.listdir(left.parent) == []
    assert mps.ready(supervisor(lab).root, lab.uuid(0)) is not None


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_an_mps_client_with_two_gpus_or_another_pipe_directory_does_not_start(
    lab: Lab, delivery: str
) -> None:
    two = run(
        make_bundle(lab, granted_env(lab, "0,1", limits=MPS_LIMITS), delivery=delivery), delivery
    )
    assert two.returncode != 0
    assert "and has 2 GPUs; an MPS client joins one GPU's control daemon" in two.stderr
    away = granted_env(lab, "0", limits=MPS_LIMITS) | {"CUDA_MPS_PIPE_DIRECTORY": "/elsewhere"}
    out = run(make_bundle(lab, away, delivery=delivery), delivery)
    assert out.returncode != 0
    assert "sets CUDA_MPS_PIPE_DIRECTORY=/elsewhere, which would lead its client away" in out.stderr


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_hami_core_container_preloads_the_library_and_sees_its_limit(
    lab: Lab, delivery: str
) -> None:
    out = run(
        make_bundle(lab, granted_env(lab, "2", limits=HAMI_LIMITS), delivery=delivery), delivery
    )
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["preload"] == ["/usr/local/vgpu/libvgpu.so"]
    assert seen["memory"] == ["4096 MiB"]  # nvidia-smi through HAMi-core's NVML hook
    assert not {"mps", "shm"} & set(seen)  # runc's own /dev/shm, empty
    assert [m.split()[0] for m in seen["mounted"]] == ["/dev/shm"]
    assert lab.log_lines()[-1].endswith("limits held by hami: grant")


@pytest.mark.parametrize(
    ("link", "target", "proof", "volume"),
    [
        ("etc/ld.so.preload", "ld.so.preload.image", "hami", None),
        ("tmp", "var/tmp", "mps", None),
        ("etc/ld.so.preload", "ld.so.preload.image", "claim", None),
        ("vgpu", "tmp", "hami", "/usr/local"),
        ("vgpu", "tmp", "claim", "/usr/local"),
    ],
)
@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_an_image_whose_link_leads_a_limits_mount_elsewhere_does_not_start(
    lab: Lab, delivery: str, link: str, target: str, proof: str, volume: str | None
) -> None:
    """runc (the shim) and the hook would mount HAMi-core's preload list and library, or
    MPS's pipes, where a link leads: the image's, or one in a volume over their path (the
    pod's files: an init container's); the container could then remove the link, and with
    it the limit (ld.so reads /etc/ld.so.preload, an MPS client its pipe directory, by
    path). Whatever proves the start: a grant with limits, or a claim alone whose CDI spec
    the engine applied (its HAMi-core share). Before: a claim alone was not checked, and
    under the shim nothing under a volume was."""
    mounts = []
    if volume is not None:
        directory = lab.root / f"volume-{uuid.uuid4().hex[:8]}"
        directory.mkdir()
        (directory / link).symlink_to(f"/{target}")
        mounts.append({"destination": volume, "type": "bind", "source": str(directory),
                       "options": ["rbind", "rw"]})  # fmt: skip
    if proof == "claim":
        if volume is None:  # without the link: the engine's start, checked, held
            out = run(claimed(lab, 0, delivery, share=True), delivery)
            assert out.returncode == 0, out.stderr
            assert view(out.stdout)["preload"] == ["/usr/local/vgpu/libvgpu.so"]
            assert lab.log_lines()[-1].endswith(": claim")
        bundle = claimed(lab, 0, delivery, mounts=mounts, share=True)
    else:
        limits = HAMI_LIMITS if proof == "hami" else MPS_LIMITS
        bundle = make_bundle(lab, granted_env(lab, "0", limits=limits), delivery=delivery,
                             mounts=mounts)  # fmt: skip
    if volume is None:
        rootfs = bundle.path / "rootfs"
        (rootfs / target).parent.mkdir(parents=True, exist_ok=True)
        if (rootfs / link).is_dir():
            (rootfs / link).rename(rootfs / target)
        (rootfs / link).symlink_to(f"/{target}")
    out = run(bundle, delivery)
    assert out.returncode != 0
    where = f"the volume at {volume}" if volume else "the image"
    assert f"{where} has a link on the way there, which the container could take away" in (
        out.stderr
    )


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_a_container_without_limits_gets_nothing_of_either(lab: Lab, delivery: str) -> None:
    out = run(make_bundle(lab, granted_env(lab, "1"), delivery=delivery), delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["memory"] == ["81920 MiB"]
    assert not {"preload", "mps", "shm"} & set(seen)
    assert [m.split()[0] for m in seen["mounted"]] == ["/dev/shm"]  # runc's own
    assert not any(v.startswith("CUDA_MPS_PIPE_DIRECTORY") for v in seen.get("var", []))
    assert "limits held" not in lab.log_lines()[-1]


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_hami_core_limits_on_a_node_without_it_do_not_start(lab: Lab, delivery: str) -> None:
    lab.configure(**{"mps-root": supervisor(lab).root, "hami-library": str(lab.root / "none.so")})
    out = run(
        make_bundle(lab, granted_env(lab, "0", limits=HAMI_LIMITS), delivery=delivery), delivery
    )
    assert out.returncode != 0
    assert (
        f"the container asks for HAMi-core limits and {lab.root}/none.so (hami-library in "
        f"{lab.config}) is not there"
    ) in out.stderr


# A shared replica is held to the share its allocation token names: the device plugin's
# Allocate answer (deviceplugin/plugin/allocate.py), mounted and in the env as the kubelet hands it.


def replica(
    lab: Lab, index: int, share: allocation.Share | None, strategies: Strategies | None = None
) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """A container's Allocate answer for GPU `index` (a replica held to `share`) as the kubelet
    hands it to containerd: its env, its mounts, and its DeviceSpecs as `linux.devices`."""
    token = allocation.write(lab.allocations, "nvidia.com/gpu", [lab.uuid(index)], lab.keys, share)
    answer = response(
        [lab.machine.devices[index]],
        token.token,
        str(lab.allocations),
        strategies or Strategies(),
        share=share,
    )
    mounts = [
        {
            "destination": m.container_path,
            "type": "bind",
            "source": m.host_path,
            "options": ["rbind", "ro"],
        }
        for m in answer.mounts
    ]
    nodes = []
    for spec in answer.devices:
        st = os.stat(spec.host_path)
        nodes.append(
            {
                "path": spec.container_path,
                "type": "c",
                "major": os.major(st.st_rdev),
                "minor": os.minor(st.st_rdev),
                "fileMode": 0o666,
                "uid": 0,
                "gid": 0,
            }
        )
    return {**answer.envs, "NVIDIA_VISIBLE_DEVICES": "plugin"}, mounts, nodes


QUARTER = allocation.Share("hami", 20480, 25)
CLAIM_UID = "0f7c2a34-5a1e-4d7e-9a0b-2c3d4e5f6a7b"


@pytest.mark.parametrize("delivery", ["shim", "shim-resident"])
def test_the_shim_holds_a_replica_to_its_share_whatever_its_env_says(
    lab: Lab, delivery: str
) -> None:
    env, mounts, _ = replica(lab, 2, QUARTER)
    env |= {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g", "GPU_CORE_UTILIZATION_POLICY": "disable"}
    out = run(make_bundle(lab, env, delivery=delivery, mounts=mounts), delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["preload"] == ["/usr/local/vgpu/libvgpu.so"]
    assert seen["memory"] == ["20480 MiB"]
    assert {
        "CUDA_DEVICE_MEMORY_LIMIT=20480m",
        "CUDA_DEVICE_MEMORY_LIMIT_0=20480m",
        "CUDA_DEVICE_SM_LIMIT=25",
        "GPU_CORE_UTILIZATION_POLICY=force",
    } <= set(seen["var"])


def test_a_tighter_limit_of_its_own_stays(lab: Lab) -> None:
    env, mounts, _ = replica(lab, 2, QUARTER)
    out = run(
        make_bundle(lab, env | {"CUDA_DEVICE_MEMORY_LIMIT": "4g"}, delivery="shim", mounts=mounts),
        "shim",
    )
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["memory"] == ["4096 MiB"]


@pytest.mark.parametrize("delivery", ["prestart", "prestart-resident"])
def test_the_prestart_hook_starts_a_replica_only_with_its_share_in_effect(
    lab: Lab, delivery: str
) -> None:
    env, mounts, _ = replica(lab, 2, QUARTER)
    out = run(make_bundle(lab, env, delivery=delivery, mounts=mounts), delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["memory"] == ["20480 MiB"]
    bundle = make_bundle(lab, env, delivery=delivery, mounts=mounts)
    bundle.spec["process"]["env"].append("CUDA_DEVICE_MEMORY_LIMIT=80g")  # the pod's, after
    bundle.save()
    refused = run(bundle, delivery)
    assert refused.returncode != 0
    assert (
        "its environment has CUDA_DEVICE_MEMORY_LIMIT=20480m,80g where 20480m is needed; the "
        "prestart hook cannot change a created container's environment"
    ) in refused.stderr


# A container may hold a DRA claim and a device-plugin allocation at once: the engine
# applied the claim's CDI spec (its devices, the driver's files as the host lays them out, its
# token), the kubelet the Allocate answer (env, the token's mount, DeviceSpecs where the plugin
# passes them).


def claimed(
    lab: Lab,
    claim: int,
    delivery: str,
    env: dict[str, str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    share: bool = False,
) -> Bundle:
    """A bundle of a container holding a claim of GPU `claim` (`share`: a share held by
    HAMi-core, its limits, library and preload list), as the engine applied its CDI spec
    after `mounts`, beside `env`."""
    device = ClaimDevice("gpu-0", lab.uuid(claim), share)
    token = ClaimToken(CLAIM_UID, NAMESPACE, "trainer-gpus", (POD_UID,), (device,))
    claimtoken.write(str(lab.allocations), token, lab.keys)
    own = {"NVIDIA_VISIBLE_DEVICES": lab.uuid(claim)} if env is None else env
    bundle = make_bundle(lab, own, delivery=delivery, mounts=mounts)
    driver = discover(Roots(str(lab.node)), ("compute", "utility"))
    edits = container_edits(
        driver, driver.devices[claim : claim + 1], ("compute", "utility"), host_layout(driver)
    )
    edits.mounts.append(
        bind_mount(claimtoken.path(str(lab.allocations), CLAIM_UID),
                   claimtoken.container_path(CLAIM_UID, "gpu-0"))
    )  # fmt: skip
    if share:
        state, library = str(lab.root / "claim-hami"), str(lab.node / sim.HAMI_LIBRARY)
        hamicore.write_preload(state)
        edits.env.update(HAMI_LIMITS)
        edits.mounts += [bind_mount(*b) for b in hamicore.binds(library, state)]
    bundle.spec = ocispec.apply(bundle.spec, edits)
    bundle.save()
    return bundle


def claimed_beside(
    lab: Lab, claim: int, allocated: int, share: allocation.Share | None, delivery: str
) -> Bundle:
    """A bundle of a container holding a claim of GPU `claim` and an allocation of GPU
    `allocated` (`-specs`: with its DeviceSpecs)."""
    strategies = Strategies(device_specs=delivery.endswith("-specs"), dev_root=str(lab.node))
    env, mounts, nodes = replica(lab, allocated, share, strategies)
    bundle = claimed(lab, claim, delivery.removesuffix("-specs"), env, mounts)
    bundle.spec["linux"]["devices"] += nodes
    bundle.save()
    return bundle


@pytest.mark.parametrize("delivery", ["shim", "prestart", "prestart-specs"])
def test_a_replica_beside_a_claim_is_held_or_does_not_start(lab: Lab, delivery: str) -> None:
    """Before: the claim made the whole start the engine's, and the replica of GPU 2 ran
    without HAMi-core (no preload), unlimited."""
    out = run(claimed_beside(lab, 1, 2, QUARTER, delivery), delivery.removesuffix("-specs"))
    assert out.returncode != 0
    assert (
        "the container holds a replica of a shared GPU, held to 20480 MiB and 25 % by hami, and "
        f"2 GPUs and MIG devices in all ({lab.uuid(2)}, {lab.uuid(1)}); a share holds a "
        "container's one GPU"
    ) in out.stderr


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_an_allocation_beside_a_claim_is_injected_and_named(lab: Lab, delivery: str) -> None:
    """The GPU no engine gave the container is gpuwire's to give (before: not under the
    prestart hook), and the decision names both proofs (before: `claim`)."""
    out = run(claimed_beside(lab, 1, 2, None, delivery), delivery)
    assert out.returncode == 0, out.stderr
    assert view(out.stdout)["devices"] == ["nvidia-uvm nvidia-uvm-tools nvidia1 nvidia2 nvidiactl"]
    assert lab.log_lines()[-1].endswith(": allocation+claim")


@pytest.mark.parametrize("delivery", ["shim", "prestart"])
def test_an_mps_replica_joins_its_gpus_daemon_whose_defaults_are_its_share(
    lab: Lab, delivery: str
) -> None:
    share = allocation.Share("mps", lab.machine.devices[0].memory_mib // 4, 25)
    env, mounts, _ = replica(lab, 0, share)
    out = run(make_bundle(lab, env, delivery=delivery, mounts=mounts), delivery)
    assert out.returncode == 0, out.stderr
    seen = view(out.stdout)
    assert seen["mps"] == ["control", "nvidia-cuda-mps-control.pid"]
    daemon = mps.ready(supervisor(lab).root, lab.uuid(0))
    assert daemon is not None
    assert daemon.defaults == mps.Defaults(share.cores, share.memory_mib)
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={share.memory_mib}M" in seen["var"]
