"""The kubelet's DRA APIs as the kubelet speaks them: every message field and number from the
published definitions (kubernetes/kubelet pkg/apis/dra/{v1,v1beta1}, dra-health/{v1alpha1,v1},
pluginregistration/v1), the packages and the gRPC method paths. (The stubs' freshness is
checked for every proto by tests/deviceplugin/test_api.py.)"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from deviceplugin.api import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)

# (message, field, number)
DRA_FIELDS = [
    ("NodePrepareResourcesRequest", "claims", 1),
    ("NodePrepareResourcesResponse", "claims", 1),
    ("NodePrepareResourceResponse", "devices", 1),
    ("NodePrepareResourceResponse", "error", 2),
    ("Device", "request_names", 1),
    ("Device", "pool_name", 2),
    ("Device", "device_name", 3),
    ("Device", "cdi_device_ids", 4),
    ("NodeUnprepareResourcesRequest", "claims", 1),
    ("NodeUnprepareResourcesResponse", "claims", 1),
    ("NodeUnprepareResourceResponse", "error", 1),
    ("Claim", "namespace", 1),
    ("Claim", "uid", 2),
    ("Claim", "name", 3),
]
HEALTH_FIELDS = [
    ("NodeWatchResourcesResponse", "devices", 1),
    ("DeviceIdentifier", "pool_name", 1),
    ("DeviceIdentifier", "device_name", 2),
    ("DeviceHealth", "device", 1),
    ("DeviceHealth", "health", 2),
    ("DeviceHealth", "last_updated_time", 3),
    ("DeviceHealth", "health_check_timeout_seconds", 4),
    ("DeviceHealth", "message", 5),
]
REGISTRATION_FIELDS = [
    ("PluginInfo", "type", 1),
    ("PluginInfo", "name", 2),
    ("PluginInfo", "endpoint", 3),
    ("PluginInfo", "supported_versions", 4),
    ("RegistrationStatus", "plugin_registered", 1),
    ("RegistrationStatus", "error", 2),
]


def _fields(module: ModuleType) -> dict[str, dict[str, int]]:
    """Every message of the file (map entries left out) → its fields and numbers."""
    return {
        name: {f.name: f.number for f in desc.fields}
        for name, desc in module.DESCRIPTOR.message_types_by_name.items()
    }


def _expected(rows: list[tuple[str, str, int]], empty: tuple[str, ...] = ()) -> dict[str, Any]:
    expected: dict[str, dict[str, int]] = {name: {} for name in empty}
    for message, name, number in rows:
        expected.setdefault(message, {})[name] = number
    return expected


def _methods(module: ModuleType) -> dict[str, tuple[str, str, bool]]:
    return {
        f"/{service.full_name}/{method.name}": (
            method.input_type.name,
            method.output_type.name,
            method.server_streaming,
        )
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


@pytest.mark.parametrize(
    ("module", "package", "share_id"),
    [
        (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", True),
        (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1", False),
    ],
    ids=["v1", "v1beta1"],
)
def test_dra_plugin_messages_and_methods(module: ModuleType, package: str, share_id: bool) -> None:
    assert module.DESCRIPTOR.package == package
    rows = DRA_FIELDS + ([("Device", "share_id", 5)] if share_id else [])
    assert _fields(module) == _expected(rows)
    assert _methods(module) == {
        f"/{package}.DRAPlugin/NodePrepareResources": (
            "NodePrepareResourcesRequest",
            "NodePrepareResourcesResponse",
            False,
        ),
        f"/{package}.DRAPlugin/NodeUnprepareResources": (
            "NodeUnprepareResourcesRequest",
            "NodeUnprepareResourcesResponse",
            False,
        ),
    }
    claims = module.DESCRIPTOR.message_types_by_name["NodePrepareResourcesResponse"]
    assert claims.fields_by_name["claims"].message_type.GetOptions().map_entry


def test_share_id_is_optional_so_absent_differs_from_empty() -> None:
    assert not dra_v1_pb2.Device().HasField("share_id")
    assert dra_v1_pb2.Device(share_id="").HasField("share_id")


@pytest.mark.parametrize(
    ("module", "package"),
    [(dra_health_v1alpha1_pb2, "v1alpha1"), (dra_health_v1_pb2, "v1")],
    ids=["v1alpha1", "v1"],
)
def test_health_messages_and_stream(module: ModuleType, package: str) -> None:
    assert module.DESCRIPTOR.package == package
    assert _fields(module) == _expected(HEALTH_FIELDS, ("NodeWatchResourcesRequest",))
    assert _methods(module) == {
        f"/{package}.DRAResourceHealth/NodeWatchResources": (
            "NodeWatchResourcesRequest",
            "NodeWatchResourcesResponse",
            True,
        )
    }
    status = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }


def test_registration_messages_and_methods() -> None:
    module = pluginregistration_pb2
    assert module.DESCRIPTOR.package == "pluginregistration"
    assert _fields(module) == _expected(
        REGISTRATION_FIELDS, ("RegistrationStatusResponse", "InfoRequest")
    )
    assert _methods(module) == {
        "/pluginregistration.Registration/GetInfo": ("InfoRequest", "PluginInfo", False),
        "/pluginregistration.Registration/NotifyRegistrationStatus": (
            "RegistrationStatus",
            "RegistrationStatusResponse",
            False,
        ),
    }


def test_wire_format_is_the_kubelets() -> None:
    """Bytes as Go's protobuf encodes them: a device's pool (2), name (3), CDI id (4)."""
    device = dra_v1_pb2.Device(pool_name="n", device_name="gpu-0", cdi_device_ids=["k/c=x"])
    assert device.SerializeToString() == b"\x12\x01n\x1a\x05gpu-0\x22\x05k/c=x"
