"""Token sweep: tokens the kubelet's checkpoint still references stay, others go after the
grace period, and an unreadable checkpoint removes nothing."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from deviceplugin.plugin.allocate import Strategies, response
from deviceplugin.plugin.sweep import CheckpointError, sweep, tokens_in_use
from gpuwire import allocation, sim
from gpuwire.grant import KeyRing

GPUS = sim.make_machine(gpus=2).devices


def checkpoint(*tokens: str, alloc_dir: str = "/var/lib/gpuwire/allocations") -> str:
    entries = [
        {
            "PodUID": f"pod-{i}",
            "ContainerName": "main",
            "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [GPUS[0].uuid]},
            "AllocResp": base64.b64encode(
                response([GPUS[0]], token, alloc_dir, Strategies()).SerializeToString()
            ).decode(),
        }
        for i, token in enumerate(tokens)
    ]
    data = {"PodDeviceEntries": entries, "RegisteredDevices": {"nvidia.com/gpu": []}}
    return json.dumps({"Data": data, "Checksum": 1234})


def test_tokens_in_use_come_from_the_allocate_answers() -> None:
    a, b = "a" * 32, "b" * 32
    assert tokens_in_use(checkpoint(a, b)) == {a, b}
    other_plugin = {"PodUID": "p", "AllocResp": base64.b64encode(b"").decode()}
    text = json.dumps({"Data": {"PodDeviceEntries": [other_plugin]}, "Checksum": 0})
    assert tokens_in_use(text) == set()
    assert tokens_in_use(json.dumps({"Data": {"PodDeviceEntries": None}})) == set()


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"Data": {}}',
        '{"Data": {"PodDeviceEntries": [{"AllocResp": "%%"}]}}',
        '{"Data": {"PodDeviceEntries": [{"AllocResp": "/w=="}]}}',
    ],
)
def test_unreadable_checkpoint(text: str) -> None:
    with pytest.raises(CheckpointError):
        tokens_in_use(text)


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[Path, list[str]]:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k").write_text("secret")
    alloc = tmp_path / "alloc"
    written = [
        allocation.write(alloc, "nvidia.com/gpu", [GPUS[0].uuid], KeyRing.load(keys)).token
        for _ in range(3)
    ]
    allocation.claim(alloc, written[1], "sandbox-1")
    for name in os.listdir(alloc):
        os.utime(alloc / name, (1000, 1000))
    return alloc, written


def test_sweep_removes_unreferenced_tokens_past_the_grace_period(
    tokens: tuple[Path, list[str]],
) -> None:
    alloc, (kept, gone, fresh) = tokens
    os.utime(alloc / fresh, (1950, 1950))
    cp = alloc.parent / "kubelet_internal_checkpoint"
    cp.write_text(checkpoint(kept))
    assert sweep(str(alloc), cp, grace=100, now=2000) == [gone]
    assert sorted(os.listdir(alloc)) == sorted([kept, fresh])  # gone's claim went too


def test_a_write_cut_short_goes_with_its_token(tokens: tuple[Path, list[str]]) -> None:
    alloc, (kept, gone, unclaimed) = tokens
    for token in (kept, gone, "c" * 32):  # "c…": only the temporary file was ever made
        (alloc / f".{token}.77.tmp").write_text('{"resour')
        os.utime(alloc / f".{token}.77.tmp", (1000, 1000))
    cp = alloc.parent / "kubelet_internal_checkpoint"
    cp.write_text(checkpoint(kept))
    assert sorted(sweep(str(alloc), cp, grace=100, now=2000)) == sorted([gone, unclaimed, "c" * 32])
    assert sorted(os.listdir(alloc)) == sorted([kept, f".{kept}.77.tmp"])


def test_no_checkpoint_no_sweep(tokens: tuple[Path, list[str]]) -> None:
    alloc, _ = tokens
    assert sweep(str(alloc), alloc.parent / "missing", grace=0, now=2000) == []
    (alloc.parent / "broken").write_text("{")
    assert sweep(str(alloc), alloc.parent / "broken", grace=0, now=2000) == []
    assert len(os.listdir(alloc)) == 4


def test_unrelated_files_are_left_alone(tokens: tuple[Path, list[str]]) -> None:
    alloc, _ = tokens
    (alloc / "README").write_text("not a token")
    os.utime(alloc / "README", (0, 0))
    cp = alloc.parent / "cp"
    cp.write_text(checkpoint())
    assert len(sweep(str(alloc), cp, grace=0, now=2000)) == 3
    assert os.listdir(alloc) == ["README"]
