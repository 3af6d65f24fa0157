"""A prepared DRA claim as the proof the runtime's `granted` trust accepts: its token
(`gpuwire.claimtoken`) mounted once per device by the claim's CDI spec, bound to the claim's
owner pod or the pods it is reserved for, checked against the runtime's own CRI annotations;
and the record the start keeps of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwire import allocation, claimtoken, records, sim
from gpuwire.claimtoken import ClaimDevice, ClaimToken
from gpuwire.edits import ldcache_args
from gpuwire.grant import KeyRing
from runtime_hook.start import plan, recording, shim
from runtime_hook.start.config import Config
from runtime_hook.start.trust import GRANTED, REFUSED, evaluate
from testbed.lab import NAMESPACE, OTHER_POD, POD_UID, container_spec, cri_annotations
from testbed.rootfs import busybox_rootfs

CLAIM_UID = "0f7c2a34-5a1e-4d7e-9a0b-2c3d4e5f6a7b"
SHARER = "9d8c7b6a-0000-4000-8000-00000000000b"  # another pod a shared claim is reserved for


def uuids(config: Config) -> list[str]:
    return [d.uuid for d in sim.load_machine(config.roots.proc).devices]


def prepare(
    config: Config,
    keys: KeyRing,
    gpus: tuple[int, ...],
    pods: tuple[str, ...] = (POD_UID,),
    uid: str = CLAIM_UID,
    shares: tuple[int, ...] = (),
) -> ClaimToken:
    """What the DRA plugin writes at prepare for a claim of GPUs `gpus`, bound to `pods`."""
    ids = uuids(config)
    devices = tuple(ClaimDevice(f"gpu-{i}", ids[i], i in shares) for i in gpus)
    token = ClaimToken(uid, NAMESPACE, "trainer-gpus", pods, devices)
    claimtoken.write(config.allocation_dir, token, keys)
    return token


def claim_mount(config: Config, device: str, uid: str = CLAIM_UID) -> dict[str, Any]:
    """The mount the engine makes from the claim's CDI spec for one of its devices."""
    return {
        "destination": claimtoken.container_path(uid, device),
        "type": "bind",
        "source": claimtoken.path(config.allocation_dir, uid),
        "options": ["ro", "nosuid", "nodev", "bind"],
    }


def started(
    config: Config,
    devices: list[str],
    visible: str,
    annotations: dict[str, str] | None = None,
    uid: str = CLAIM_UID,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A container the engine applied the claim's spec to: its env and one mount a device."""
    env = {"NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    return container_spec(
        env,
        annotations=annotations,
        mounts=mounts or [claim_mount(config, d, uid) for d in devices],
    )


def test_a_prepared_claim_gives_exactly_the_devices_mounted(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    ids = uuids(config)
    prepare(config, keys, (1, 3))
    outcome = evaluate(
        started(config, ["gpu-1", "gpu-3"], f"{ids[1]},{ids[3]}"), config, claim=True
    )
    assert outcome.inject, outcome.error
    assert [d.index for d in outcome.devices] == [1, 3]
    assert outcome.verdict.basis == "claim"
    assert outcome.verdict.reason == "DRA claim team-a/trainer-gpus (gpu-1, gpu-3)"
    # a container of one request of the claim: its spec's env names all the claim's GPUs,
    # the engine gave it one, and that one is what it holds
    one = evaluate(started(config, ["gpu-3"], f"{ids[1]},{ids[3]}"), config, claim=True)
    assert [d.index for d in one.devices] == [3]


def test_a_claim_beside_an_allocation_names_both_proofs(node: tuple[Config, KeyRing]) -> None:
    """The decision rests on each proof it used, and only the claim's devices are the engine's:
    the plan injects and joins the rest (tests/system/test_limits.py)."""
    config, keys = node
    ids = uuids(config)
    prepare(config, keys, (1,))
    token = allocation.write(config.allocation_dir, "nvidia.com/gpu", [ids[2]], keys).token
    mounted = {"destination": allocation.container_path(token), "type": "bind",
               "source": f"{config.allocation_dir}/{token}", "options": ["ro"]}  # fmt: skip
    spec = started(config, [], ids[1], mounts=[claim_mount(config, "gpu-1"), mounted])
    outcome = evaluate(spec, config, claim=True)
    assert outcome.inject, outcome.error
    assert outcome.verdict.basis == "allocation+claim"
    assert outcome.verdict.reason == (
        f"device-plugin allocation {token}; DRA claim team-a/trainer-gpus (gpu-1)"
    )
    assert [d.index for d in outcome.devices] == [2, 1]


def test_a_container_of_two_claims_holds_both(node: tuple[Config, KeyRing]) -> None:
    """Each claim's spec sets NVIDIA_VISIBLE_DEVICES; the last one applied wins the env, the
    mounts say what the container holds."""
    config, keys = node
    ids = uuids(config)
    other = "7a1b2c3d-0000-4000-8000-000000000001"
    prepare(config, keys, (0,))
    prepare(config, keys, (2,), uid=other)
    mounts = [claim_mount(config, "gpu-0"), claim_mount(config, "gpu-2", other)]
    outcome = evaluate(started(config, [], ids[2], mounts=mounts), config, claim=True)
    assert [d.index for d in outcome.devices] == [0, 2]


@pytest.mark.parametrize(
    ("pods", "annotations", "why"),
    [
        # a claim generated for one pod, in a container of another pod of its namespace
        ((POD_UID,), cri_annotations(pod=OTHER_POD),
         f" is reserved for pod {POD_UID}, not {OTHER_POD}"),
        # a shared claim, in a pod of its namespace it is not reserved for
        ((POD_UID, SHARER), cri_annotations(pod=OTHER_POD),
         f" is reserved for pods {', '.join(sorted((POD_UID, SHARER)))}, not {OTHER_POD}"),
        # a runtime that names no pod UID cannot show it is one of them
        ((POD_UID,), cri_annotations(pod=None),
         f" is reserved for pod {POD_UID}; the spec names no pod"),
        # a claim in a container of another namespace
        ((POD_UID,), cri_annotations(namespace="team-b"), " is in namespace team-a, not team-b"),
        # a spec without the CRI annotations (not a Kubernetes container)
        ((POD_UID,), {}, ": the spec names no pod namespace"),
    ],
    ids=["other-pod", "shared-other-pod", "no-pod-uid", "other-namespace", "no-namespace"],
)  # fmt: skip
def test_a_claim_replayed_outside_whom_it_binds_fails_the_start(
    node: tuple[Config, KeyRing], pods: tuple[str, ...], annotations: dict[str, str], why: str
) -> None:
    """The engine has applied the claim's devices already, so a refusal fails the start
    (with the reason) rather than leave the container running with them."""
    config, keys = node
    prepare(config, keys, (1,), pods=pods)
    outcome = evaluate(
        started(config, ["gpu-1"], uuids(config)[1], annotations), config, claim=True
    )
    assert outcome.verdict.status == REFUSED
    assert f"claim team-a/trainer-gpus{why}" in outcome.verdict.reason
    assert outcome.error is not None
    assert "the start fails rather than run with GPUs gpuwire refuses" in outcome.error
    assert not outcome.inject


def test_each_pod_a_claim_is_reserved_for_is_served(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    prepare(config, keys, (1,))
    mine = started(config, ["gpu-1"], uuids(config)[1], cri_annotations(pod=POD_UID))
    assert evaluate(mine, config, claim=True).verdict.status == GRANTED
    prepare(config, keys, (1,), pods=(POD_UID, OTHER_POD))  # the plugin saw a second pod
    other = started(config, ["gpu-1"], uuids(config)[1], cri_annotations(pod=OTHER_POD))
    assert evaluate(other, config, claim=True).verdict.status == GRANTED
    assert evaluate(mine, config, claim=True).verdict.status == GRANTED


@pytest.mark.parametrize(
    ("visible", "mounted", "why"),
    [
        ("{2}", ["gpu-1"], "reaches beyond the devices of claim team-a/trainer-gpus: {2}"),
        ("all", ["gpu-1"], "reaches beyond the devices of claim team-a/trainer-gpus: all"),
        ("{1}", ["gpu-2"], "claim team-a/trainer-gpus has no device gpu-2"),
    ],
    ids=["another-gpu", "all", "a-device-mount-of-another"],
)
def test_devices_beyond_the_claim_are_refused(
    node: tuple[Config, KeyRing], visible: str, mounted: list[str], why: str
) -> None:
    config, keys = node
    ids = uuids(config)
    prepare(config, keys, (1,))
    spec = started(config, mounted, visible.format(*ids))
    outcome = evaluate(spec, config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert why.format(*ids) in outcome.verdict.reason
    assert outcome.error is not None


def test_a_forged_or_stale_token_proves_nothing(
    node: tuple[Config, KeyRing], tmp_path: Path
) -> None:
    config, keys = node
    ids = uuids(config)
    spec = started(config, ["gpu-1"], ids[1])
    token = Path(claimtoken.path(config.allocation_dir, CLAIM_UID))

    prepare(config, keys, (1,))
    body = json.loads(token.read_text())
    body["namespace"] = "team-b"  # widened by hand: the MAC no longer holds
    token.write_text(json.dumps(body))
    assert "its token has an invalid MAC" in evaluate(spec, config, claim=True).verdict.reason

    prepare(config, KeyRing({"2026-07": b"another cluster's"}), (1,))  # a key this node lacks
    assert "signed with unknown key '2026-07'" in evaluate(spec, config, claim=True).verdict.reason

    token.unlink()  # unprepared: the plugin removed it
    outcome = evaluate(spec, config, claim=True)
    assert f"claim {CLAIM_UID}: no token on this node" in outcome.verdict.reason
    assert outcome.error is not None


def test_a_token_planted_elsewhere_proves_nothing(
    node: tuple[Config, KeyRing], tmp_path: Path
) -> None:
    """A valid token copied anywhere but the allocation dir (a hostPath volume): ignored, so
    the container is left with its env alone, which nothing grants."""
    config, keys = node
    prepare(config, keys, (1,))
    planted = tmp_path / "planted"
    planted.write_bytes(Path(claimtoken.path(config.allocation_dir, CLAIM_UID)).read_bytes())
    mount = {**claim_mount(config, "gpu-1"), "source": str(planted)}
    outcome = evaluate(started(config, [], uuids(config)[1], mounts=[mount]), config, claim=True)
    assert outcome.request.stray_claims == ((CLAIM_UID, "gpu-1"),)
    assert outcome.verdict.status == REFUSED
    assert "no GPUWIRE_GRANT, no device-plugin allocation" in outcome.verdict.reason


def test_a_claims_container_is_recorded_as_a_dra_holder(
    node: tuple[Config, KeyRing], tmp_path: Path
) -> None:
    """Its record names the claim and the GPUs it holds as a share; the edits are laid out
    as the claim's CDI spec lays them out, and the engine applied them already."""
    config, keys = node
    ids = uuids(config)
    prepare(config, keys, (1, 3), shares=(3,))
    spec = started(config, ["gpu-1", "gpu-3"], f"{ids[1]},{ids[3]}")
    (tmp_path / "bundle/rootfs").mkdir(parents=True)
    decided = plan.make(spec, str(tmp_path / "bundle"), config)
    assert decided.by_engine
    assert decided.edits is not None
    assert decided.edits.env["NVIDIA_VISIBLE_DEVICES"] == f"{ids[1]},{ids[3]}"
    recording.keep("test", config, "c1", spec, decided, pid=None, state="/run/runc/c1")
    [entry] = records.scan(config.records_dir)
    assert entry.record is not None
    record = entry.record
    assert (record.path, record.gpus) == (records.DRA, tuple(sorted((ids[1], ids[3]))))
    assert (record.claims, record.shares) == (("team-a/trainer-gpus",), (ids[3],))


def test_the_shim_makes_a_claim_specs_ld_cache_hook_itself_and_runc_runs_none(
    node: tuple[Config, KeyRing], tmp_path: Path
) -> None:
    """The engine applied the claim's spec, its ld-cache hook included: the shim makes those
    links and that cache in the root before runc, and leaves runc only the hooks that are
    not gpuwire's."""
    config, keys = node
    ids = uuids(config)
    prepare(config, keys, (1,))
    bundle = tmp_path / "bundle"
    busybox_rootfs(bundle / "rootfs")
    spec = started(config, ["gpu-1"], ids[1])
    decided = plan.make(spec, str(bundle), config)
    assert decided.edits is not None
    args = ldcache_args(decided.edits, config.ldconfig)  # as the claim's CDI spec names them
    other = {"path": "/usr/bin/true", "args": ["true"]}
    spec["hooks"] = {
        "createRuntime": [other, {"path": "/x/gpuwire-hook", "args": ["gpuwire-hook", *args]}]
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    shim.edit_bundle(str(bundle), "c1", config)
    written = json.loads((bundle / "config.json").read_text())
    assert written["hooks"] == {"createRuntime": [other]}
    libdir = bundle / "rootfs/usr/lib/x86_64-linux-gnu"
    assert (libdir / "libcuda.so.1").is_symlink()
    assert b"libcuda.so.1" in (bundle / "rootfs/etc/ld.so.cache").read_bytes()
