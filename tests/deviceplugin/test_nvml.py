"""NVML discovery and XID events, against a pynvml stand-in with pynvml's signatures and
error codes: NVSwitch and direct NVLink topologies, PCIe boards, old drivers, lost GPUs."""

from __future__ import annotations

import inspect
from pathlib import Path

import pynvml
import pytest

from deviceplugin.gpus.discovery import HealthEvent
from deviceplugin.gpus.nvml import NvmlDiscovery
from gpuwire.devices import Device
from testbed.nvml import FUNCTIONS, SWITCH, FakeGpu, StandIn

BUSES = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")


def gpu(i: int, **kw: object) -> FakeGpu:
    fields: dict[str, object] = {
        "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000",
        "name": "NVIDIA A100-SXM4-80GB",
        "minor": i,
        "bus": f"00000000:{BUSES[i]}:00.0",
        "memory_mib": 81920,
        "numa": 0 if i < 4 else 1,
    }
    fields.update(kw)
    return FakeGpu(**fields)  # type: ignore[arg-type]


def discover(stand_in: StandIn, sysfs: Path | None = None) -> NvmlDiscovery:
    return NvmlDiscovery(stand_in.module(), sysfs=str(sysfs or "/nonexistent"))


def test_stand_in_has_pynvmls_signatures_and_structures() -> None:
    for name in FUNCTIONS:
        real = inspect.signature(getattr(pynvml, name)).parameters
        ours = inspect.signature(getattr(StandIn([]), name)).parameters
        assert list(ours) == list(real), name
    event_fields = [f for f, _ in pynvml.c_nvmlEventData_t._fields_]
    assert event_fields == [
        "device",
        "eventType",
        "eventData",
        "gpuInstanceId",
        "computeInstanceId",
    ]
    assert type(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) is pynvml.NVMLError_NotSupported


def test_nvswitch_system_joins_every_pair_by_the_fabric() -> None:
    """DGX A100: 12 links per GPU, all to NVSwitches; every pair counts 12."""
    switches = [f"00000000:{0xC0 + s:02X}:00.0" for s in range(6)]
    gpus = [gpu(i, links=[(SWITCH, switches[k % 6]) for k in range(12)]) for i in range(8)]
    node = discover(StandIn(gpus)).discover()
    assert node.driver_version == "550.54.15"
    assert node.cuda_version == "12.4"
    assert node.devices[3] == Device(
        index=3,
        minor=3,
        uuid="GPU-00000003-0000-0000-0000-000000000000",
        pci_bus_id="0000:4e:00.0",
        product="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        numa_node=0,
        nvlinks=tuple((j, 12) for j in range(8) if j != 3),
    )
    assert [g.compute_capability for g in node.gpus] == [(8, 0)] * 8


def test_direct_links_count_per_peer_and_down_links_are_skipped() -> None:
    bus = [f"00000000:{b}:00.0" for b in BUSES]
    gpus = [
        gpu(0, links=[("gpu", bus[1]), ("gpu", bus[1]), None, ("gpu", bus[2])]),
        gpu(1, links=[("gpu", bus[0]), ("gpu", bus[0]), None, None]),
        gpu(2, links=[("gpu", bus[0]), None, None, None]),
        gpu(3),  # a PCIe board: NVLink queries are NOT_SUPPORTED
    ]
    links = [d.nvlinks for d in discover(StandIn(gpus)).discover().devices]
    assert links == [((1, 2), (2, 1)), ((0, 2),), ((0, 1),), ()]


def test_old_driver_without_remote_type_judges_by_bus_id() -> None:
    """No nvmlDeviceGetNvLinkRemoteDeviceType: a far end that is no GPU is a switch."""
    bus1 = "00000000:0F:00.0"
    gpus = [
        gpu(0, links=[("gpu", bus1), (SWITCH, "00000000:C0:00.0"), (SWITCH, "00000000:C1:00.0")]),
        gpu(1, links=[("gpu", "00000000:07:00.0"), (SWITCH, "00000000:C0:00.0"), None]),
        gpu(2, links=[(SWITCH, "00000000:C1:00.0"), (SWITCH, "00000000:C0:00.0"), None]),
    ]
    links = [d.nvlinks for d in discover(StandIn(gpus, old_driver=True)).discover().devices]
    # 0-1: one direct + min(2, 1) through switches; 0-2: min(2, 2); 1-2: min(1, 2)
    assert links == [((1, 2), (2, 2)), ((0, 2), (2, 1)), ((0, 2), (1, 1))]


def test_numa_node_falls_back_to_sysfs_then_unknown(tmp_path: Path) -> None:
    pci = tmp_path / "bus/pci/devices/0000:07:00.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    gpus = [gpu(0, numa=None), gpu(1, numa=None), gpu(2, numa=0)]
    numa = [d.numa_node for d in discover(StandIn(gpus), tmp_path).discover().devices]
    assert numa == [1, -1, 0]


def test_brand_and_pcie_root_for_the_dra_attributes(tmp_path: Path) -> None:
    """NVML's brand by go-nvlib's names; the PCIe root complex from the device's sysfs link
    (`/sys/bus/pci/devices/<bus>` → `../../../devices/pci0000:40/…/<bus>`)."""
    devices = tmp_path / "bus/pci/devices"
    devices.mkdir(parents=True)
    (devices / "0000:07:00.0").symlink_to("../../../devices/pci0000:40/0000:40:01.0/0000:07:00.0")
    gpus = [gpu(0), gpu(1, brand=pynvml.NVML_BRAND_GEFORCE_RTX), gpu(2, brand=None)]
    found = discover(StandIn(gpus), tmp_path).discover().gpus
    assert [g.brand for g in found] == ["Nvidia", "GeForceRTX", ""]
    assert [g.pcie_root for g in found] == ["pci0000:40", None, None]


def test_xid_events_name_their_device() -> None:
    stand_in = StandIn([gpu(0), gpu(1)])
    nvml = discover(stand_in)
    assert nvml.wait_events(0.01) == []  # NVML_ERROR_TIMEOUT: nothing happened
    assert stand_in.registered == [g.uuid for g in stand_in.gpus]
    stand_in.xid(stand_in.gpus[1], 79)
    assert nvml.wait_events(0.01) == [HealthEvent(stand_in.gpus[1].uuid, 79, "XID 79")]


def test_event_for_an_unreadable_device_concerns_all() -> None:
    stand_in = StandIn([gpu(0), gpu(1, lost=False)])
    nvml = discover(stand_in)
    nvml.wait_events(0.01)
    lost = gpu(7, lost=True)
    stand_in.xid(lost, 79)
    assert nvml.wait_events(0.01) == [HealthEvent(None, 79, "XID 79")]


def test_failed_wait_marks_every_device() -> None:
    stand_in = StandIn([gpu(0)])
    nvml = discover(stand_in)
    stand_in.wait_error = pynvml.NVML_ERROR_UNKNOWN
    assert nvml.wait_events(0.01) == [
        HealthEvent(None, None, "NVML event wait failed: Unknown Error")
    ]


def test_event_registration_failures() -> None:
    """Too old for events: stays healthy (logged); any other failure: unhealthy at once."""
    stand_in = StandIn([gpu(0, events_supported=False), gpu(1), gpu(2)])
    nvml = discover(stand_in)
    nvml.discover()
    stand_in.gpus[2].lost = True
    assert nvml.wait_events(0.01) == [
        HealthEvent(stand_in.gpus[2].uuid, None, "cannot watch XID events: GPU is lost")
    ]
    assert stand_in.registered == [stand_in.gpus[1].uuid]
    assert nvml.wait_events(0.01) == []


def test_alive_is_false_for_a_lost_or_vanished_gpu() -> None:
    stand_in = StandIn([gpu(0), gpu(1)])
    nvml = discover(stand_in)
    assert nvml.alive(stand_in.gpus[0].uuid)
    stand_in.gpus[0].lost = True
    assert not nvml.alive(stand_in.gpus[0].uuid)
    assert not nvml.alive("GPU-not-here")


def test_close_shuts_nvml_down() -> None:
    stand_in = StandIn([gpu(0)])
    nvml = discover(stand_in)
    nvml.wait_events(0.01)
    nvml.close()
    assert stand_in.initialised == 0
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.discover()
