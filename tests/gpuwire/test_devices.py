"""NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES with NVIDIA's semantics."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwire import nvidia, sim
from gpuwire.devices import (
    Kind,
    Selection,
    UnknownDevice,
    normalise_bus_id,
    parse_request,
    select,
)

DEVICES = sim.make_machine(gpus=4).devices


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, Kind.VOID),
        ("", Kind.VOID),
        (" , ", Kind.VOID),
        ("void", Kind.VOID),
        ("0,void", Kind.VOID),
        ("none", Kind.NONE),
        ("all", Kind.ALL),
        ("ALL", Kind.ALL),
        ("0,all", Kind.ALL),
        ("0, 1", Kind.LIST),
        # the toolkit's precedence where special values mix with devices: void, none, all
        ("all,void", Kind.VOID),
        ("all,none", Kind.NONE),
        ("none,all,0", Kind.NONE),
        ("0,ALL", Kind.ALL),
        ("NONE", Kind.LIST),  # exact words but for all: the toolkit takes NONE for a device
    ],
)
def test_request_kinds(value: str | None, kind: Kind) -> None:
    assert parse_request(value).kind is kind


def test_select_by_index_uuid_and_bus_id_in_request_order_once() -> None:
    d0, d1, d2, _ = DEVICES
    request = parse_request(f"2,{d1.uuid.upper()},7:0.0,0")
    assert select(request, DEVICES).gpus == (d2, d1, d0)
    assert d0.pci_bus_id == "0000:07:00.0"


def test_select_all_and_none() -> None:
    assert select(parse_request("all"), DEVICES).gpus == DEVICES
    assert select(parse_request("none"), DEVICES) == Selection()


@pytest.mark.parametrize("entry", ["4", "GPU-0000", "0000:99:00.0", "bogus", "GPU-" + "a" * 36])
def test_unknown_device_names_entry_and_what_exists(entry: str) -> None:
    with pytest.raises(UnknownDevice) as err:
        select(parse_request(f"0,{entry}"), DEVICES)
    assert repr(entry) in str(err.value)
    assert DEVICES[3].uuid in str(err.value)


def test_uuid_prefix_is_not_a_match() -> None:
    with pytest.raises(UnknownDevice):
        select(parse_request(DEVICES[0].uuid[:12]), DEVICES)


def test_bus_id_forms() -> None:
    assert normalise_bus_id("00000000:0B:00.0") == "0000:0b:00.0"
    assert normalise_bus_id("b:0.0") == "0000:0b:00.0"
    assert normalise_bus_id("GPU-1") is None


@given(st.lists(st.sampled_from(["0", "1", "2", "3"]), min_size=1))
def test_canonical_form_ignores_order_and_repeats(entries: list[str]) -> None:
    forward = parse_request(",".join(entries)).canonical()
    backward = parse_request(",".join(reversed(entries + entries))).canonical()
    assert forward == backward == ",".join(sorted(set(entries)))


@pytest.mark.parametrize(
    ("value", "caps"),
    [
        (None, "compute,utility"),
        ("", "compute,utility"),
        ("utility, compute ,utility", "compute,utility"),
        ("video", "video"),
        ("compute,all", "all"),
        ("compat32,compute,display,graphics,ngx,utility,video", "all"),
    ],
)
def test_capabilities(value: str | None, caps: str) -> None:
    assert nvidia.canonical_capabilities(value) == caps


def test_unknown_capability_lists_accepted() -> None:
    with pytest.raises(nvidia.CapabilityError, match=r"unknown driver capability gaming.*graphics"):
        nvidia.parse_capabilities("compute,gaming")


def test_video_brings_compute_libraries() -> None:
    assert nvidia.with_implied(("video",)) == ("compute", "video")


def test_gfd_product_and_family() -> None:
    assert nvidia.gfd_product("Tesla T4") == "Tesla-T4"
    assert nvidia.gfd_product("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    assert nvidia.gfd_family(7, 5) == "turing"
    assert nvidia.gfd_family(8, 9) == "ada-lovelace"
    assert nvidia.gfd_family(9, 0) == "hopper"
