"""Who gets a GPU: grants, device-plugin allocations, privilege, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwire import allocation, sim
from gpuwire.grant import KeyRing
from runtime_hook.start.config import Config
from runtime_hook.start.trust import GRANTED, NOT_GPU, REFUSED, evaluate
from testbed.lab import (
    OTHER_POD,
    POD_UID,
    SANDBOX,
    container_spec,
    cri_annotations,
    grant_for,
)


def uuids(config: Config) -> list[str]:
    return [d.uuid for d in sim.load_machine(config.roots.proc).devices]


def granted_indices(spec: dict[str, Any], config: Config) -> list[int] | None:
    outcome = evaluate(spec, config, claim=True)
    assert outcome.error is None, outcome.error
    if not outcome.inject:
        return None
    return [d.index for d in outcome.devices]


def test_not_a_gpu_container(node: tuple[Config, KeyRing]) -> None:
    config, _ = node
    for env in ([], ["NVIDIA_VISIBLE_DEVICES="], ["NVIDIA_VISIBLE_DEVICES=void"]):
        outcome = evaluate(container_spec(env), config, claim=True)
        assert outcome.verdict.status == NOT_GPU
        assert not outcome.inject


def test_image_asking_for_all_without_grant_gets_nothing_and_a_reason(
    node: tuple[Config, KeyRing],
) -> None:
    config, _ = node
    outcome = evaluate(container_spec({"NVIDIA_VISIBLE_DEVICES": "all"}), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert not outcome.inject
    assert outcome.verdict.reason == (
        "NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES= not honoured: no GPUWIRE_GRANT, "
        'no device-plugin allocation, and the container is not privileged (trust = "granted")'
    )


def test_valid_grant_gets_exactly_its_devices(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    env = {"NVIDIA_VISIBLE_DEVICES": "1,3", "GPUWIRE_GRANT": grant_for(keys, "3,1")}
    assert granted_indices(container_spec(env), config) == [1, 3]


@pytest.mark.parametrize(
    ("env", "annotations", "why"),
    [
        # the grant was made for other devices
        ({"NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}, None, "does not sign"),
        # copied into another namespace
        ({"NVIDIA_VISIBLE_DEVICES": "1"}, cri_annotations(namespace="team-b"), "does not sign"),
        # capabilities widened after signing
        (
            {"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "all"},
            None,
            "does not sign",
        ),
        # not a Kubernetes container: nothing to bind the grant to
        ({"NVIDIA_VISIBLE_DEVICES": "1"}, {}, "no CRI namespace"),
    ],
)
def test_grant_that_does_not_match_is_refused(
    node: tuple[Config, KeyRing], env: dict[str, str], annotations: dict[str, str] | None, why: str
) -> None:
    config, keys = node
    env = {**env, "GPUWIRE_GRANT": grant_for(keys, "1")}
    outcome = evaluate(container_spec(env, annotations), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert why in outcome.verdict.reason


def test_grant_with_a_non_ascii_mac_is_refused_with_a_reason(node: tuple[Config, KeyRing]) -> None:
    config, _ = node
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": "2026-06:" + "é" * 64}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert "GPUWIRE_GRANT is not valid (invalid: key '2026-06' does not sign" in (
        outcome.verdict.reason
    )


def test_grant_from_a_key_this_node_does_not_hold(node: tuple[Config, KeyRing]) -> None:
    config, _ = node
    other = KeyRing({"2099-01": b"someone else"})
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(other, "0")}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert "which this node does not hold (held: 2026-06)" in outcome.verdict.reason


def test_privileged_container_is_honoured_without_grant(node: tuple[Config, KeyRing]) -> None:
    config, _ = node
    spec = container_spec({"NVIDIA_VISIBLE_DEVICES": "all"}, bounding=["CAP_SYS_ADMIN"])
    assert granted_indices(spec, config) == [0, 1, 2, 3]


def test_trust_any_honours_the_env(node: tuple[Config, KeyRing]) -> None:
    config, _ = node
    config.trust = "any"
    assert granted_indices(container_spec({"NVIDIA_VISIBLE_DEVICES": "2"}), config) == [2]


def test_grant_for_an_unknown_device_fails_the_start(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    env = {"NVIDIA_VISIBLE_DEVICES": "7", "GPUWIRE_GRANT": grant_for(keys, "7")}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.verdict.status == GRANTED
    assert not outcome.inject
    assert outcome.error is not None
    assert outcome.error.startswith("unknown device '7'")


def test_duplicate_env_keys_last_value_wins(node: tuple[Config, KeyRing]) -> None:
    """containerd may emit a key twice: the grant is checked against the last value."""
    config, keys = node
    env = [
        "NVIDIA_VISIBLE_DEVICES=all",
        f"GPUWIRE_GRANT={grant_for(keys, '0')}",
        "NVIDIA_VISIBLE_DEVICES=0",
    ]
    outcome = evaluate(container_spec(env), config, claim=True)
    assert [d.index for d in outcome.devices] == [0]
    assert outcome.request.conflicts == {"NVIDIA_VISIBLE_DEVICES": ["all", "0"]}
    # ... and a grant for the first value does not carry the last one
    env = ["NVIDIA_VISIBLE_DEVICES=0", f"GPUWIRE_GRANT={grant_for(keys, '0')}"]
    env.append("NVIDIA_VISIBLE_DEVICES=all")
    assert evaluate(container_spec(env), config, claim=True).verdict.status == REFUSED


def allocation_mount(directory: str, token: str) -> dict[str, Any]:
    return {
        "destination": allocation.container_path(token),
        "type": "bind",
        "source": f"{directory}/{token}",
        "options": ["rbind", "ro"],
    }


def test_allocation_gives_the_tokens_devices_not_the_envs(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    ids = uuids(config)
    token = allocation.write(config.allocation_dir, "nvidia.com/gpu", [ids[2]], keys).token
    spec = container_spec(
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        mounts=[allocation_mount(config.allocation_dir, token)],
    )
    assert granted_indices(spec, config) == [2]
    # the same pod again (a restart, a second container) is fine
    assert granted_indices(spec, config) == [2]


def presenting(token: str, config: Config, sandbox: str, pod: str | None) -> dict[str, Any]:
    """A container of pod `pod` in sandbox `sandbox` that carries the allocation mount."""
    return container_spec(
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        annotations=cri_annotations(sandbox=sandbox, pod=pod),
        mounts=[allocation_mount(config.allocation_dir, token)],
    )


@pytest.mark.parametrize(
    ("pod", "thief", "refusal"),
    [
        (POD_UID, OTHER_POD, f"belongs to pod {POD_UID}, not {OTHER_POD}"),
        (None, None, f"belongs to sandbox {SANDBOX[:12]}, not 777777777777"),
    ],
    ids=["pod-uid", "no-pod-uid"],
)
def test_allocation_stays_with_its_pod(
    node: tuple[Config, KeyRing], pod: str | None, thief: str | None, refusal: str
) -> None:
    """With the pod's UID in the spec (containerd >= 1.6.11) the pod keeps its GPU in a new
    sandbox: its pause container died, or the node rebooted and the kubelet started it again
    with the Allocate answer it checkpointed. Without one (older containerd) the sandbox is
    all there is to bind."""
    config, keys = node
    token = allocation.write(config.allocation_dir, "nvidia.com/gpu", [uuids(config)[1]], keys)
    assert granted_indices(presenting(token.token, config, SANDBOX, pod), config) == [1]
    again = granted_indices(presenting(token.token, config, "6" * 64, pod), config)
    assert again == ([1] if pod else None)
    outcome = evaluate(presenting(token.token, config, "7" * 64, thief), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert refusal in outcome.verdict.reason


def test_allocation_mount_from_elsewhere_proves_nothing(
    node: tuple[Config, KeyRing], tmp_path: Path
) -> None:
    """A token file planted outside the allocation dir (a hostPath volume) is not a proof."""
    config, keys = node
    token = allocation.write(tmp_path / "planted", "nvidia.com/gpu", uuids(config), keys).token
    spec = container_spec(
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        mounts=[allocation_mount(str(tmp_path / "planted"), token)],
    )
    outcome = evaluate(spec, config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert outcome.request.stray_tokens == (token,)


def test_tampered_allocation_is_refused(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    token = allocation.write(config.allocation_dir, "nvidia.com/gpu", uuids(config)[:1], keys).token
    path = Path(config.allocation_dir, token)
    path.write_text(path.read_text().replace(uuids(config)[0], uuids(config)[3]))
    spec = container_spec(
        {"NVIDIA_VISIBLE_DEVICES": "plugin"},
        mounts=[allocation_mount(config.allocation_dir, token)],
    )
    outcome = evaluate(spec, config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert "invalid MAC" in outcome.verdict.reason


def test_plugin_grant_without_allocation_gets_no_gpu(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    env = {"NVIDIA_VISIBLE_DEVICES": "plugin", "GPUWIRE_GRANT": grant_for(keys, "plugin")}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.verdict.status == REFUSED
    assert "no device-plugin allocation" in outcome.verdict.reason


def test_checking_without_claiming_writes_nothing(node: tuple[Config, KeyRing]) -> None:
    config, keys = node
    token = allocation.write(config.allocation_dir, "nvidia.com/gpu", uuids(config)[:1], keys).token
    spec = container_spec(
        {"NVIDIA_VISIBLE_DEVICES": "plugin"},
        mounts=[allocation_mount(config.allocation_dir, token)],
    )
    assert evaluate(spec, config, claim=False).inject
    assert not Path(config.allocation_dir, f"{token}.claim").exists()


def test_only_a_start_that_names_a_mig_device_reads_the_mig_map(
    node: tuple[Config, KeyRing], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a node with MIG devices the map names them by UUID; a start that asks for whole
    GPUs needs no names, so it does not pay for reading the map (nor fail on it)."""
    config, keys = node
    machine = sim.with_mig(sim.load_machine(config.roots.proc), 0, ("3g.40gb", "3g.40gb"))
    sim.write_node(config.roots.proc, machine)
    from deviceplugin.gpus.simulated import SimDiscovery
    from gpuwire import mig

    found = SimDiscovery(config.roots.proc).discover().mig_devices
    mig_map = tmp_path / "mig-map"
    mig.write_map(str(mig_map), found)
    config.mig_map = str(mig_map)
    read: list[str] = []

    def read_map(path: str) -> mig.Names:
        read.append(path)
        return real(path)

    real = mig.read_map
    monkeypatch.setattr(mig, "read_map", read_map)
    whole = {"1,3": [1, 3], "all": [0, 1, 2, 3], uuids(config)[2]: [2], "0": [0]}
    for entries, indices in whole.items():
        env = {"NVIDIA_VISIBLE_DEVICES": entries, "GPUWIRE_GRANT": grant_for(keys, entries)}
        assert granted_indices(container_spec(env), config) == indices
    assert read == []
    named = found[1].uuid
    env = {"NVIDIA_VISIBLE_DEVICES": named, "GPUWIRE_GRANT": grant_for(keys, named)}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.error is None, outcome.error
    assert [m.uuid for m in outcome.mig] == [named]
    assert read == [str(mig_map)]
    config.mig_map = str(tmp_path)  # unreadable as a map: whole GPUs start all the same
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(keys, "0")}
    assert granted_indices(container_spec(env), config) == [0]
    env = {"NVIDIA_VISIBLE_DEVICES": named, "GPUWIRE_GRANT": grant_for(keys, named)}
    outcome = evaluate(container_spec(env), config, claim=True)
    assert outcome.error is not None
    assert f"cannot read the MIG map {tmp_path}" in outcome.error
