"""Allocate: refused requests name the device and the reason; answers carry the allocation
proof the runtime side verifies, plus the optional DeviceSpecs and CDI names."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.plugin.allocate import AllocateError, Strategies, granted, response
from deviceplugin.plugin.resources import Resource
from gpuwire import allocation, sim
from gpuwire.grant import KeyRing

GPUS = sim.make_machine(gpus=4).devices
WHOLE = Resource("nvidia.com/gpu", GPUS)
SHARED = Resource("nvidia.com/gpu", GPUS, replicas=4)
STRICT = Resource("nvidia.com/gpu", GPUS, replicas=4, fail_requests_greater_than_one=True)


def test_granted_is_the_physical_gpus_by_index() -> None:
    ids = [GPUS[3].uuid, GPUS[1].uuid]
    assert granted(WHOLE, ids, ()) == [GPUS[1], GPUS[3]]
    replicas = [f"{GPUS[2].uuid}::0", f"{GPUS[2].uuid}::3", f"{GPUS[0].uuid}::1"]
    assert granted(SHARED, replicas, ()) == [GPUS[0], GPUS[2]]


@pytest.mark.parametrize(
    ("resource", "ids", "message"),
    [
        (
            WHOLE,
            ["GPU-nope"],
            "unknown device 'GPU-nope': not a nvidia.com/gpu device of this node",
        ),
        (SHARED, [GPUS[0].uuid], "IDs are <uuid>::<0-3> of its 4 GPUs"),
        (WHOLE, [GPUS[0].uuid, GPUS[0].uuid], f"device '{GPUS[0].uuid}' is requested twice"),
        (
            WHOLE,
            [GPUS[2].uuid],
            f"device '{GPUS[2].uuid}' \\(GPU 2, {GPUS[2].uuid}\\) is unhealthy",
        ),
        (
            STRICT,
            [f"{GPUS[0].uuid}::0", f"{GPUS[1].uuid}::0"],
            "request for 'nvidia.com/gpu: 2' too large: "
            "maximum request size for shared resources is 1",
        ),
        (WHOLE, [], "empty request"),
    ],
)
def test_refusals_name_device_and_reason(resource: Resource, ids: list[str], message: str) -> None:
    with pytest.raises(AllocateError, match=message):
        granted(resource, ids, {GPUS[2].uuid})


def test_one_shared_replica_is_fine_with_fail_requests_greater_than_one() -> None:
    assert granted(STRICT, [f"{GPUS[1].uuid}::2"], ()) == [GPUS[1]]


def test_answer_mounts_a_token_the_runtime_side_accepts(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    (keys_dir / "k1").write_text("s3cret")
    keys = KeyRing.load(keys_dir)
    alloc_dir = tmp_path / "alloc"
    gpus = [GPUS[1], GPUS[3]]
    token = allocation.write(alloc_dir, "nvidia.com/gpu", [g.uuid for g in gpus], keys).token
    answer = response(gpus, token, str(alloc_dir), Strategies())
    assert dict(answer.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{GPUS[1].uuid},{GPUS[3].uuid}"}
    [mount] = answer.mounts
    assert mount.read_only
    assert mount.host_path == str(alloc_dir / token)
    assert allocation.token_of(mount.container_path) == token
    proof = allocation.read(Path(mount.host_path).parent, token, keys)
    assert proof.devices == tuple(sorted(g.uuid for g in gpus))
    assert not answer.devices
    assert not answer.cdi_devices


def test_device_specs_strategy(tmp_path: Path) -> None:
    strategies = Strategies(device_specs=True, dev_root="/run/driver")
    answer = response([GPUS[2]], "0" * 32, str(tmp_path), strategies, ("nvidiactl", "nvidia-uvm"))
    assert [(d.container_path, d.host_path, d.permissions) for d in answer.devices] == [
        ("/dev/nvidiactl", "/run/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia2", "/run/driver/dev/nvidia2", "rw"),
    ]


@pytest.mark.parametrize(
    ("naming", "names"),
    [
        ("uuid", [f"nvidia.com/gpu={GPUS[0].uuid}", f"nvidia.com/gpu={GPUS[3].uuid}"]),
        ("index", ["nvidia.com/gpu=0", "nvidia.com/gpu=3"]),
    ],
)
def test_cdi_strategy_names_devices_as_cdi_generate_does(
    naming: str, names: list[str], tmp_path: Path
) -> None:
    answer = response([GPUS[0], GPUS[3]], "0" * 32, str(tmp_path), Strategies(cdi=naming))
    assert [d.name for d in answer.cdi_devices] == names
