"""The DRA plugin on an AMD node: every GPU and partition a device with AMD's DRA driver's
attribute names (a selector written for `gpu.amd.com` selects the same devices here once the
domain is changed), slices the schemas accept, and a prepared claim's CDI spec of `/dev/kfd`
and exactly its render nodes, with the claim's token, through the kubelet DRA stand-in."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deviceplugin.config import Config
from deviceplugin.dra import cdi, devices, slices, vendors
from deviceplugin.dra.devices import DraDevice, Sharing
from deviceplugin.dra.plugin import DraPlugin
from deviceplugin.gpus.amd import AmdDiscovery, AmdNodeGpus
from gpuwire import amdsim, claimtoken
from gpuwire.dra import DRIVER
from testbed import dracel
from testbed.apiserver import ApiServer
from testbed.kubelet_dra import DraKubelet
from testbed.lab import write_keys
from testbed.waiting import until

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ROOT / "deploy/overlays/dra/deviceclasses.yaml"
AMD_DRIVER = "gpu.amd.com"
NODE = "amd-node-1"


def amd_node(root: Path, gpus: int = 2, compute: str = "SPX", memory: str = "NPS1") -> AmdNodeGpus:
    amdsim.write_node(root, amdsim.make_machine(gpus, "MI300X", compute=compute, memory=memory))
    return AmdDiscovery(str(root)).discover()


def published(node: AmdNodeGpus) -> list[DraDevice]:
    return devices.devices(node, Sharing(), vendors.AMD_DRA.kinds)


def attrs(device: DraDevice) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in device.entry["attributes"].items()}


@pytest.fixture
def spx(tmp_path: Path) -> AmdNodeGpus:
    return amd_node(tmp_path / "spx")


@pytest.fixture
def cpx(tmp_path: Path) -> AmdNodeGpus:
    return amd_node(tmp_path / "cpx", compute="CPX", memory="NPS4")


def test_every_gpu_is_a_device_with_amds_attribute_names(spx: AmdNodeGpus) -> None:
    found = published(spx)
    gpu = spx.kfd.gpus[0]
    assert [d.name for d in found] == [f"gpu-{g.card}-{g.device.minor}" for g in spx.kfd.gpus]
    assert attrs(found[0]) == {
        "type": "amdgpu",
        "uuid": gpu.device.uuid,
        "productName": "AMD Instinct MI300X",
        "deviceID": "0x74a1",
        "family": "AI",
        "driverVersion": "6.12.12",
        "partitionProfile": "spx_nps1",
        "numaNode": 0,
        "model": "mi300x",
        "xgmiIsland": 0,
        "resource.kubernetes.io/pciBusID": gpu.device.pci_bus_id,
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "resource.kubernetes.io/numaNode": 0,
    }
    assert found[0].entry["capacity"] == {
        "memory": {"value": "192Gi"},
        "computeUnits": {"value": "304"},
        "simdUnits": {"value": "1216"},
    }
    assert not any("allowMultipleAllocations" in d.entry for d in found)


def test_each_partition_is_a_device_of_its_share_under_its_gpus_bus_id(cpx: AmdNodeGpus) -> None:
    found = published(cpx)
    assert len(found) == 16  # 2 GPUs in CPX: 8 partitions each
    assert {attrs(d)["type"] for d in found} == {"amdgpu-partition"}
    assert {attrs(d)["partitionProfile"] for d in found} == {"cpx_nps4"}
    buses = [attrs(d)["resource.kubernetes.io/pciBusID"] for d in found]
    assert [len(set(buses[:8])), len(set(buses[8:])), len(set(buses))] == [1, 1, 2]
    assert found[0].entry["capacity"] == {
        "memory": {"value": "24Gi"},
        "computeUnits": {"value": "38"},
        "simdUnits": {"value": "152"},
    }
    assert len({d.name for d in found}) == 16


def test_a_gpu_without_partition_modes_has_no_profile(tmp_path: Path) -> None:
    root = tmp_path / "mi210"
    amdsim.write_node(root, amdsim.make_machine(2, "MI210", hive_size=0))
    found = published(AmdDiscovery(str(root)).discover())
    assert [attrs(d)["type"] for d in found] == ["amdgpu", "amdgpu"]
    assert not any("partitionProfile" in attrs(d) for d in found)
    assert [attrs(d)["xgmiIsland"] for d in found] == [0, 1]  # PCIe only: each its own


@pytest.mark.parametrize(
    "selector",
    [
        'device.attributes["{d}"].type == "amdgpu-partition"',
        'device.attributes["{d}"].partitionProfile == "cpx_nps4"',
        'device.attributes["{d}"].deviceID == "0x74a1"',
        'device.attributes["{d}"].productName.contains("MI300X")',
        'device.attributes["{d}"].family == "AI"',
        'device.attributes["{d}"].numaNode == 1',
        'device.attributes["{d}"].driverVersion.isGreaterThan(semver("6.10.0"))',
        'device.attributes["resource.kubernetes.io"].pciBusID == "{bus}"',
        'device.capacity["{d}"].memory.compareTo(quantity("24Gi")) >= 0',
        'device.capacity["{d}"].computeUnits.compareTo(quantity("38")) == 0',
    ],
)
def test_a_claim_written_for_amds_driver_selects_the_same_devices_with_the_domain_changed(
    cpx: AmdNodeGpus, selector: str
) -> None:
    """The same devices as AMD's driver would publish them (its domain) and as gpuwire's: a
    selector for one selects the same devices of the other once `gpu.amd.com` is replaced by
    `gpu.gpuwire.io`."""
    found = published(cpx)
    bus = attrs(found[9])["resource.kubernetes.io/pciBusID"]

    def chosen(domain: str) -> list[str]:
        expression = selector.format(d=domain, bus=bus)
        return [d.name for d in found if dracel.matches(expression, dracel.device(d.entry, domain))]

    amd_side = chosen(AMD_DRIVER)
    assert amd_side == chosen(DRIVER)
    assert amd_side  # the selector selects something


def classes() -> dict[str, list[str]]:
    docs = yaml.safe_load_all(CLASSES.read_text())
    return {d["metadata"]["name"]: [s["cel"]["expression"] for s in d["spec"]["selectors"]]
            for d in docs}  # fmt: skip


def test_the_amd_class_selects_every_amd_device_and_nvidias_classes_none(
    spx: AmdNodeGpus, cpx: AmdNodeGpus
) -> None:
    found = published(spx) + published(cpx)
    chosen = {
        name: [d.name for d in found
               if all(dracel.matches(e, dracel.device(d.entry, DRIVER)) for e in expressions)]
        for name, expressions in classes().items()
    }  # fmt: skip
    assert chosen == {"gpu.gpuwire.io": [], "shared.gpu.gpuwire.io": [], "mig.gpu.gpuwire.io": [],
                      "amd.gpu.gpuwire.io": [d.name for d in found]}  # fmt: skip


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_slices_validate_against_the_schemas(cpx: AmdNodeGpus, version: str) -> None:
    pool = slices.Pool(DRIVER, NODE, "0c9f3e52-4d7c-4b8e-9a43-0a5e2f8e6d11")
    for obj in slices.plan(slices.wanted(pool, published(cpx), {}), [], "").create:
        kubernetes_validate.validate(obj, version, strict=True)


# --- prepare, through the kubelet DRA stand-in


@pytest.fixture
def plugin(tmp_path: Path, socket_dir: Path) -> Iterator[tuple[ApiServer, DraKubelet, Config]]:
    """The DRA plugin on a simulated AMD node (two MI300X in CPX), registered and serving."""
    root = tmp_path / "node"
    amdsim.write_node(root, amdsim.make_machine(2, "MI300X", compute="CPX", memory="NPS1"))
    write_keys(tmp_path / "keys")
    config = Config(
        sim=str(root), vendor="amd", kubelet_root=str(socket_dir / "kubelet"),
        cdi_dir=str(tmp_path / "cdi"), allocation_dir=str(tmp_path / "allocations"),
        grant_key_dir=str(tmp_path / "keys"), node_name=NODE,
    )  # fmt: skip
    with ApiServer(schema="1.34") as api, DraKubelet(socket_dir / "kubelet", NODE) as kubelet:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        stop = threading.Event()
        dra = DraPlugin(config, api_client=api.client())
        thread = threading.Thread(target=dra.run, args=(stop,), daemon=True)
        thread.start()
        try:
            kubelet.wait_registered(DRIVER)
            yield api, kubelet, config
        finally:
            stop.set()
            thread.join(timeout=20)


def put_claim(api: ApiServer, devices: list[str]) -> tuple[str, str, str]:
    results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    spec = {"devices": {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": "amd.gpu.gpuwire.io", "count": len(devices)}}]}}  # fmt: skip
    stored = api.put({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{uuid.uuid4().hex[:6]}", "namespace": "default"},
        "spec": spec, "status": {"allocation": {"devices": {"results": results}}},
    })  # fmt: skip
    return "default", stored["metadata"]["name"], stored["metadata"]["uid"]


def test_prepare_gives_kfd_and_exactly_the_claims_render_nodes_with_its_token(
    tmp_path: Path, plugin: tuple[ApiServer, DraKubelet, Config]
) -> None:
    api, kubelet, config = plugin
    until(lambda: len([d for s in api.objects("resourceslices") for d in s["spec"]["devices"]])
          == 16)  # fmt: skip
    node = AmdDiscovery(str(tmp_path / "node")).discover()
    chosen = [node.kfd.gpus[i] for i in (3, 9)]  # a partition of each GPU
    names = [f"gpu-{g.card}-{g.device.minor}" for g in chosen]
    ref = put_claim(api, names)
    uid = ref[2]
    (answer,) = kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    assert [list(d.cdi_device_ids) for d in answer.devices] == [
        [f"k8s.gpu.gpuwire.io/claim={uid}-{n}"] for n in names
    ]
    spec = json.loads((Path(config.cdi_dir) / cdi.spec_file(uid)).read_text())
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
             for d in spec["devices"]}  # fmt: skip
    assert nodes == {f"{uid}-{n}": [f"/dev/dri/renderD{g.device.minor}"]
                     for n, g in zip(names, chosen, strict=True)}  # fmt: skip
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/kfd"]
    assert common["env"] == [f"AMD_VISIBLE_DEVICES={','.join(g.device.uuid for g in chosen)}"]
    assert common["hooks"] == common["mounts"] == []  # no driver files: ROCm is in the image
    token = claimtoken.path(config.allocation_dir, uid)
    assert [[m["hostPath"] for m in d["containerEdits"]["mounts"]] for d in spec["devices"]] == [
        [token],
        [token],
    ]
    proved = claimtoken.read(config.allocation_dir, uid, write_keys(tmp_path / "keys"))
    assert sorted((d.name, d.uuid) for d in proved.devices) == sorted(
        (n, g.device.uuid) for n, g in zip(names, chosen, strict=True)
    )
    assert kubelet.unprepare(DRIVER, [ref]) == {uid: ""}
    assert not (Path(config.cdi_dir) / cdi.spec_file(uid)).exists()
