"""What holds a DRA claim to its share of a shared GPU: the limits env its profile writes and,
for HAMi-core, the library and preload list its containers get; a claim whose enforced profile
nothing on the node holds fails its prepare (the share would run unlimited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.dra.claims import ClaimError, ClaimRef, GpuConfig, Result, results
from deviceplugin.dra.devices import DraDevice
from deviceplugin.dra.shares import NOTHING, Holders, hold
from gpuwire import hamicore, sim
from gpuwire.dra import CONFIG_API_VERSION, CONFIG_KIND, DRIVER
from gpuwire.edits import bind_mount

GPU = sim.make_machine(gpus=1).devices[0]  # an A100, 80 GiB


def shared(profile: str = "hami", consumed: dict[str, str] | None = None) -> list[Result]:
    device = DraDevice("gpu-0", GPU, {}, shared=True)
    used = {"memory": "20Gi", "cores": "25"} if consumed is None else consumed
    return [Result("gpus", device, "share-1", used, GpuConfig(limit_profile=profile))]


def test_a_hami_share_gets_its_limits_and_the_library_preloaded(tmp_path: Path) -> None:
    holders = Holders("/usr/local/vgpu/libvgpu.so", str(tmp_path))
    env, mounts = hold(shared(), holders)
    assert env == {
        "CUDA_DEVICE_MEMORY_LIMIT": "20480m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "GPU_CORE_UTILIZATION_POLICY": "force",
    }
    assert mounts == [
        bind_mount("/usr/local/vgpu/libvgpu.so", hamicore.CONTAINER_LIBRARY),
        bind_mount(hamicore.preload_file(str(tmp_path)), "/etc/ld.so.preload"),
    ]


@pytest.mark.parametrize("profile", ["hami", "mps"])
def test_an_enforced_share_nothing_here_holds_fails_naming_what_is_held(profile: str) -> None:
    with pytest.raises(ClaimError) as caught:
        hold(shared(profile), NOTHING)
    assert str(caught.value) == (
        f"limitProfile {profile}: nothing on this node holds a claim to its share with "
        f"{profile} (held here: none; informational, not held: jax, pytorch, tensorflow); "
        "the share would run unlimited"
    )
    with pytest.raises(ClaimError, match=r"limitProfile mps: .*held here: hami;"):
        hold(shared("mps"), Holders("/lib/libvgpu.so", "/state"))  # MPS: not on this path


def test_an_informational_share_or_no_share_needs_no_holder() -> None:
    env, mounts = hold(shared("pytorch"), NOTHING)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.25"}
    assert mounts == []
    whole = [Result("gpus", DraDevice("gpu-0", GPU, {}), config=GpuConfig())]
    assert hold(whole, NOTHING) == ({}, [])  # an exclusive GPU: no share, no limits


def allocated(*configs: tuple[str, str]) -> dict[str, object]:
    """A claim of a share of GPU 0, allocated with opaque configs (source, limitProfile)."""
    return {
        "metadata": {"uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": "node-a",
                         "device": "gpu-0", "shareID": "s1", "consumedCapacity": {"memory": "20Gi"}}
                    ],
                    "config": [
                        {"source": source, "opaque": {"driver": DRIVER, "parameters": {
                            "apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND,
                            "limitProfile": profile}}}
                        for source, profile in configs
                    ],
                }
            }
        },
    }  # fmt: skip


def test_a_claim_cannot_put_an_advisory_profile_over_its_classs_enforced_one(
    tmp_path: Path,
) -> None:
    """Before: the claim's `pytorch` replaced its class's `hami`, and its share was prepared
    with no library, unlimited."""
    devices = {"gpu-0": DraDevice("gpu-0", GPU, {}, shared=True)}
    ref = ClaimRef("team-a", "shared", "u1")
    claim = allocated(("FromClass", "hami"), ("FromClaim", "pytorch"))
    with pytest.raises(ClaimError) as caught:
        results(claim, ref, DRIVER, "node-a", devices, {})
    assert str(caught.value) == (
        "claim team-a/shared: config 1 (FromClaim): limitProfile 'pytorch' would replace "
        "'hami', which its DeviceClass enforces (claim team-a/shared: config 0 (FromClass)); "
        "a class's enforced profile holds: drop the claim's limitProfile, or use a class that "
        "enforces none"
    )
    # the class's own, or a class that enforces none: the claim's profile stands
    for configs, profile in [
        ((("FromClass", "hami"), ("FromClaim", "hami")), "hami"),
        ((("FromClass", "pytorch"), ("FromClaim", "hami")), "hami"),
        ((("FromClaim", "jax"),), "jax"),
    ]:
        (found,) = results(allocated(*configs), ref, DRIVER, "node-a", devices, {})
        assert found.config.limit_profile == profile
    holders = Holders("/usr/local/vgpu/libvgpu.so", str(tmp_path))
    (held,) = results(allocated(("FromClass", "hami")), ref, DRIVER, "node-a", devices, {})
    assert hold([held], holders)[1]  # the library is preloaded
