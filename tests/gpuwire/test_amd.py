"""AMD's names and grammars: AMD_VISIBLE_DEVICES as AMD's toolkit reads it, libdrm's table."""

from __future__ import annotations

import pytest

from gpuwire import amd
from gpuwire.devices import Kind, Request


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, Request(Kind.VOID)),
        ("", Request(Kind.VOID)),
        ("void", Request(Kind.VOID)),
        ("0,void", Request(Kind.VOID)),
        ("none", Request(Kind.NONE)),
        ("All", Request(Kind.ALL)),
        ("1,ALL", Request(Kind.ALL)),
        ("0-3", Request(Kind.LIST, ("0", "1", "2", "3"))),
        ("5, 0-1", Request(Kind.LIST, ("5", "0", "1"))),
        ("3-1", Request(Kind.LIST, ("3-1",))),  # kept, for selection to refuse by name
        ("GPU-56e1d2b4c8575698", Request(Kind.LIST, ("GPU-56e1d2b4c8575698",))),
    ],
)
def test_visible_devices_grammar(value: str | None, expected: Request) -> None:
    assert amd.parse_request(value) == expected


@pytest.mark.parametrize(
    ("entry", "uuid"),
    [
        ("GPU-56E1D2B4C8575698", "GPU-56e1d2b4c8575698"),
        ("0x56e1d2b4c8575698", "GPU-56e1d2b4c8575698"),
        ("0x1", "GPU-0000000000000001"),
        ("56e1d2b4c8575698", "GPU-56e1d2b4c8575698"),  # bare hex of more than 8 digits
        ("GPU-56e1d2b4c8575698-p3", "GPU-56e1d2b4c8575698-p3"),
        ("12345678", None),  # 8 digits: an index to AMD's toolkit, not an id
        ("3", None),
        ("0000:05:00.0", None),
        ("GPU-xyz", None),
        ("0x" + "f" * 17, None),
    ],
)
def test_unique_id_spellings(entry: str, uuid: str | None) -> None:
    assert amd.uuid_of(entry) == uuid


def test_product_names_as_libdrm_looks_them_up() -> None:
    names = amd.parse_ids(
        "# comment\n\n1.0.0\n744C,\tC8,\tAMD Radeon RX 7900 XTX\n"
        "744C,\tCC,\tAMD Radeon RX 7900 XT\n74A1,\t00,\tAMD Instinct MI300X\nnot a line\n"
    )
    assert amd.product_name(names, 0x744C, 0xCC) == "AMD Radeon RX 7900 XT"
    assert amd.product_name(names, 0x74A1, None) == "AMD Instinct MI300X"  # one name for the id
    assert amd.product_name(names, 0x744C, None) == "AMD GPU 744c"  # which of two: unknown
    assert amd.product_name(names, 0x1234, 0) == "AMD GPU 1234"


def test_the_labellers_spellings() -> None:
    assert [amd.gfx_name(v) for v in (90010, 90402, 110000, 100302)] == [
        "gfx90a", "gfx942", "gfx1100", "gfx1032"
    ]  # fmt: skip
    assert [amd.family(v) for v in (90402, 100302, 110000, 120001, 80003)] == [
        "AI", "NV", "GC_11_0_0", "GC_12_0_0", "unknown"
    ]  # fmt: skip
    assert amd.label_value("AMD Instinct MI300X (OAM)") == "AMD_Instinct_MI300X_OAM"
    assert amd.partition_type("CPX", "NPS4") == "cpx_nps4"
