"""Contract value types behave as the frozen dataclasses they replace."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

from gpuwire.devices import Device, Kind, Request, parse_request
from gpuwire.grant import Subject


def test_values_compare_hash_print_and_refuse_assignment() -> None:
    a = Device(0, 0, "GPU-a", "0000:07:00.0", "A100", nvlinks=((1, 12),))
    b = Device(
        index=0,
        minor=0,
        uuid="GPU-a",
        pci_bus_id="0000:07:00.0",
        product="A100",
        nvlinks=((1, 12),),
    )
    assert a == b
    assert hash(a) == hash(b)
    assert a != Device(1, 1, "GPU-a", "0000:07:00.0", "A100")
    assert repr(Request(Kind.LIST, ("0",))) == "Request(kind=<Kind.LIST: 'list'>, entries=('0',))"
    assert a.as_dict()["nvlinks"] == ((1, 12),)
    with pytest.raises(AttributeError, match="cannot assign to field 'index' of Device"):
        a.index = 3
    assert Subject("ns", "c", "0", "compute") != ("ns", "c", "0", "compute")


def test_copies_and_pickles_keep_values_and_kinds() -> None:
    request = parse_request("0,1")
    for clone in (copy.copy(request), copy.deepcopy(request), pickle.loads(pickle.dumps(request))):
        assert clone == request
        assert clone.kind is Kind.LIST


def test_contract_imports_stay_light() -> None:
    """The node side imports these on every container start: no dataclasses, enum, re, json."""
    code = (
        "import sys, gpuwire.devices, gpuwire.grant, gpuwire.allocation, gpuwire.nvidia;"
        "print(sorted({'dataclasses','enum','re','json','typing','pathlib'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
