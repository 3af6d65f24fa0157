"""The v1beta1 API as the kubelet speaks it: every message field and number from the
published definition, the gRPC method paths, and stubs that match the .proto."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.api import api_pb2, generate
from testbed.cri import generate as cri_generate

# (message, field, number) of kubernetes/kubelet pkg/apis/deviceplugin/v1beta1/api.proto
FIELDS = [
    ("DevicePluginOptions", "pre_start_required", 1),
    ("DevicePluginOptions", "get_preferred_allocation_available", 2),
    ("RegisterRequest", "version", 1),
    ("RegisterRequest", "endpoint", 2),
    ("RegisterRequest", "resource_name", 3),
    ("RegisterRequest", "options", 4),
    ("ListAndWatchResponse", "devices", 1),
    ("TopologyInfo", "nodes", 1),
    ("NUMANode", "ID", 1),
    ("Device", "ID", 1),
    ("Device", "health", 2),
    ("Device", "topology", 3),
    ("PreStartContainerRequest", "devices_ids", 1),
    ("PreferredAllocationRequest", "container_requests", 1),
    ("ContainerPreferredAllocationRequest", "available_deviceIDs", 1),
    ("ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
    ("ContainerPreferredAllocationRequest", "allocation_size", 3),
    ("PreferredAllocationResponse", "container_responses", 1),
    ("ContainerPreferredAllocationResponse", "deviceIDs", 1),
    ("AllocateRequest", "container_requests", 1),
    ("ContainerAllocateRequest", "devices_ids", 1),
    ("CDIDevice", "name", 1),
    ("AllocateResponse", "container_responses", 1),
    ("ContainerAllocateResponse", "envs", 1),
    ("ContainerAllocateResponse", "mounts", 2),
    ("ContainerAllocateResponse", "devices", 3),
    ("ContainerAllocateResponse", "annotations", 4),
    ("ContainerAllocateResponse", "cdi_devices", 5),
    ("Mount", "container_path", 1),
    ("Mount", "host_path", 2),
    ("Mount", "read_only", 3),
    ("DeviceSpec", "container_path", 1),
    ("DeviceSpec", "host_path", 2),
    ("DeviceSpec", "permissions", 3),
]
EMPTY = ("Empty", "PreStartContainerResponse")


def test_every_message_has_exactly_the_published_fields() -> None:
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1beta1"
    expected: dict[str, dict[str, int]] = {name: {} for name in EMPTY}
    for message, name, number in FIELDS:
        expected.setdefault(message, {})[name] = number
    actual = {
        name: {f.name: f.number for f in desc.fields}
        for name, desc in file.message_types_by_name.items()
    }
    assert actual == expected


def test_services_have_the_kubelets_method_paths() -> None:
    methods = {
        f"/{service.full_name}/{method.name}": (method.input_type.name, method.output_type.name)
        for service in api_pb2.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods == {
        "/v1beta1.Registration/Register": ("RegisterRequest", "Empty"),
        "/v1beta1.DevicePlugin/GetDevicePluginOptions": ("Empty", "DevicePluginOptions"),
        "/v1beta1.DevicePlugin/ListAndWatch": ("Empty", "ListAndWatchResponse"),
        "/v1beta1.DevicePlugin/GetPreferredAllocation": (
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
        ),
        "/v1beta1.DevicePlugin/Allocate": ("AllocateRequest", "AllocateResponse"),
        "/v1beta1.DevicePlugin/PreStartContainer": (
            "PreStartContainerRequest",
            "PreStartContainerResponse",
        ),
    }
    list_and_watch = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name[
        "ListAndWatch"
    ]
    assert list_and_watch.server_streaming
    assert not list_and_watch.client_streaming


def test_wire_format_is_the_kubelets() -> None:
    """Bytes as the kubelet's Go code encodes them: field 1 of NUMANode is `ID`, etc."""
    device = api_pb2.Device(
        ID="GPU-1", health="Healthy", topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)])
    )
    assert device.SerializeToString() == b"\n\x05GPU-1\x12\x07Healthy\x1a\x04\n\x02\x08\x01"


# `make protos`: the device plugin's protos, and the testbed's CRI subset
PROTOS = [*generate.protos(), *generate.protos(cri_generate.HERE)]


@pytest.mark.parametrize("proto", PROTOS, ids=lambda p: str(p.relative_to(generate.ROOT)))
def test_committed_stubs_are_what_make_protos_generates(proto: Path, tmp_path: Path) -> None:
    written = generate.generate(tmp_path, proto.parent)
    for name in generate.generated(proto):
        fresh = next(p for p in written if p.name == name)
        committed = proto.parent / name
        assert committed.exists(), f"{committed} is missing: run `make protos`"
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed} is stale: run `make protos`"
        )
