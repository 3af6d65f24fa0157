"""What the DRA plugin publishes: one device per GPU with NVIDIA's attribute names, shared GPUs
with consumable capacity, taints from health, and ResourceSlices that the Kubernetes 1.34 and
1.37 schemas accept and that change (with a new pool generation) only when something did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import celpy.adapter
import kubernetes_validate
import pytest
import yaml

from deviceplugin.dra import devices, slices, taints
from deviceplugin.dra.devices import DraDevice, Sharing
from deviceplugin.gpus.discovery import Gpu, HealthEvent, NodeGpus
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import nvidia, quantity, sim
from gpuwire.dra import DRIVER

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ROOT / "deploy/overlays/dra/deviceclasses.yaml"
POOL = slices.Pool(DRIVER, "gpu-node-1", "0c9f3e52-4d7c-4b8e-9a43-0a5e2f8e6d11")
NOW = "2026-03-01T10:00:00Z"
VERSIONS = ["1.34", "1.37"]


def node(root: Path, **kwargs: Any) -> NodeGpus:
    sim.write_node(root, sim.make_machine(**kwargs))
    return SimDiscovery(root).discover()


@pytest.fixture
def four(tmp_path: Path) -> NodeGpus:
    return node(tmp_path / "node", gpus=4)


# What the simulated node's GPU 0 says of itself, and each of its MIG devices says of it.
GPU_0 = {
    "productName": "NVIDIA A100-SXM4-80GB",
    "brand": "Nvidia",
    "architecture": "Ampere",
    "cudaComputeCapability": "8.0.0",
    "driverVersion": "550.54.15",
    "cudaDriverVersion": "12.4.0",
    "model": "a100",
    "resource.kubernetes.io/pciBusID": "0000:07:00.0",
    "resource.kubernetes.io/pcieRoot": "pci0000:00",
    "resource.kubernetes.io/numaNode": 0,
}


def attrs(device: DraDevice) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in device.entry["attributes"].items()}


def test_every_gpu_is_a_device_with_nvidias_attribute_names(four: NodeGpus) -> None:
    published = devices.devices(four, Sharing())
    assert [d.name for d in published] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    first = attrs(published[0])
    gpu = four.gpus[0].device
    assert first == {"type": "gpu", "uuid": gpu.uuid, "nvlinkIsland": 0, "shared": False,
                     **GPU_0}  # fmt: skip
    assert published[0].entry["capacity"] == {"memory": {"value": "80Gi"}}
    assert "allowMultipleAllocations" not in published[0].entry


@pytest.mark.parametrize(
    ("topology", "expected"),
    [("pairs", [0, 0, 2, 2]), ("mesh", [0, 0, 0, 0]), ("none", [0, 1, 2, 3])],
)
def test_nvlink_island_is_equal_exactly_for_gpus_linked_together(
    tmp_path: Path, topology: str, expected: list[int]
) -> None:
    published = devices.devices(node(tmp_path, gpus=4, nvlink=topology), Sharing())
    assert [attrs(d)["nvlinkIsland"] for d in published] == expected


def test_versions_are_strict_semver() -> None:
    assert devices.version("535.104.05") == {"version": "535.104.5"}
    assert devices.version("12.4") == {"version": "12.4.0"}
    assert devices.version("560.35.03.1") is None
    assert devices.version("r550") is None


def test_mixed_node_keeps_each_models_facts(tmp_path: Path) -> None:
    products = ("NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4")
    published = devices.devices(node(tmp_path, gpus=3, products=products), Sharing())
    seen = [(a["model"], a["architecture"], a["brand"]) for a in map(attrs, published)]
    assert seen == [("h100", "Hopper", "Nvidia"), ("l4", "Ada Lovelace", "Nvidia"),
                    ("t4", "Turing", "Tesla")]  # fmt: skip
    assert published[0].entry["capacity"]["memory"]["value"] == "81559Mi"


def test_brand_from_the_product_name_where_nvml_does_not_say() -> None:
    assert nvidia.brand_of("NVIDIA GeForce RTX 4090") == "GeForceRTX"
    assert nvidia.brand_of("Quadro P4000") == "Quadro"
    assert nvidia.brand_of("NVIDIA A100-SXM4-80GB") == "Nvidia"


def test_shared_gpus_offer_memory_and_cores_as_consumable_capacity(four: NodeGpus) -> None:
    uuid = four.gpus[1].device.uuid
    published = devices.devices(four, Sharing((uuid.upper(),)))
    assert [d.shared for d in published] == [False, True, False, False]
    shared = published[1].entry
    assert shared["allowMultipleAllocations"] is True
    assert attrs(published[1])["shared"] is True
    assert shared["capacity"]["memory"]["value"] == "80Gi"
    assert set(shared["capacity"]) == {"memory", "cores"}
    by_model = devices.devices(four, Sharing(("*a100*",)))
    assert all(d.shared for d in by_model)


def test_a_shared_gpu_says_which_limits_hold_a_claim_to_its_share(four: NodeGpus) -> None:
    """hamiLimits / mpsLimits on shared GPUs only, true where the plugin joins claims to the
    mechanism; a claim selects them by CEL."""
    shared = (four.gpus[1].device.uuid,)
    held = devices.devices(four, Sharing(shared, ("hami",)))
    assert {k: v for k, v in attrs(held[1]).items() if k.endswith("Limits")} == {
        "hamiLimits": True,
        "mpsLimits": False,
    }
    assert not any(k.endswith("Limits") for k in attrs(held[0]))  # a whole GPU: no share
    selector = f'device.attributes["{DRIVER}"].hamiLimits == true'
    chosen = [d.name for d in held
              if d.shared and selects(selector, cel_device(d.entry, DRIVER, ()))]  # fmt: skip
    assert chosen == ["gpu-1"]
    unheld = devices.devices(four, Sharing(shared))
    assert not selects(selector, cel_device(unheld[1].entry, DRIVER, ()))


def _value(text: str) -> int:
    numerator, denominator = quantity.api_value(text)
    assert numerator % denominator == 0
    return numerator // denominator


def test_request_policies_obey_the_apis_rules(four: NodeGpus) -> None:
    """The API server's rules for a validRange (k8s pkg/apis/resource/validation): min ≤
    value, default ≥ min, max within value, min + step within value, default and max whole
    steps from min. A slice breaking one is refused whole."""
    for device in devices.devices(four, Sharing(("*",))):
        for name, capacity in device.entry["capacity"].items():
            value = _value(capacity["value"])
            policy = capacity["requestPolicy"]
            rng = policy["validRange"]
            low, step, default = _value(rng["min"]), _value(rng["step"]), _value(policy["default"])
            high = _value(rng.get("max", capacity["value"]))
            assert low <= default <= high <= value, name
            assert low + step <= value, name
            assert (default - low) % step == 0, name
            if "max" in rng:
                assert (high - low) % step == 0, name


def test_taint_effect_follows_the_xid_class() -> None:
    def one(*events: HealthEvent) -> taints.Taint:
        return taints.taint(events)

    assert one(HealthEvent("u", 79, "")) == {"key": "gpu.gpuwire.io/xid", "value": "79",
                                             "effect": "NoExecute"}  # fmt: skip
    assert one(HealthEvent("u", 74, ""))["effect"] == "NoSchedule"
    assert one(HealthEvent("u", None, "does not answer"))["key"] == "gpu.gpuwire.io/gpu-lost"
    # the worst since the GPU was last healthy, the latest among equals
    assert one(HealthEvent("u", 48, ""), HealthEvent("u", 74, ""))["value"] == "48"
    assert one(HealthEvent("u", 74, ""), HealthEvent("u", 92, ""))["value"] == "92"


def published_slices(plan: slices.Plan) -> list[dict[str, Any]]:
    """What the API server holds after `plan` is carried out on an empty pool."""
    out = []
    for i, obj in enumerate(plan.create + plan.update):
        stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(100 + i)}}
        out.append(stored)
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_slices_validate_against_the_kubernetes_schemas(four: NodeGpus, version: str) -> None:
    published = devices.devices(four, Sharing((four.gpus[3].device.uuid,)))
    bad = {published[0].gpu.uuid: [taints.taint([HealthEvent(None, 79, "")])]}
    plan = slices.plan(slices.wanted(POOL, published, bad), [], NOW)
    assert len(plan.create) == 1
    for obj in plan.create:
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_large_node_is_cut_into_slices_of_at_most_64(tmp_path: Path) -> None:
    machine = sim.make_machine(gpus=130, nvlink="none")
    big = NodeGpus("550.54.15", "12.4", tuple(Gpu(g.device, (9, 0)) for g in machine.gpus))
    plan = slices.plan(slices.wanted(POOL, devices.devices(big, Sharing()), {}), [], NOW)
    assert [len(o["spec"]["devices"]) for o in plan.create] == [64, 64, 2]
    pools = [o["spec"]["pool"] for o in plan.create]
    assert {(p["generation"], p["resourceSliceCount"]) for p in pools} == {(1, 3)}
    names = [o["metadata"]["name"] for o in plan.create]
    assert names == [f"gpu-node-1-gpu.gpuwire.io-{i}" for i in range(3)]
    for obj in plan.create:
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_nothing_changed_means_nothing_written(four: NodeGpus) -> None:
    wanted = slices.wanted(POOL, devices.devices(four, Sharing()), {})
    first = slices.plan(wanted, [], NOW)
    assert (first.generation, len(first.create)) == (1, 1)
    again = slices.plan(wanted, published_slices(first), "2026-03-01T10:05:00Z")
    assert again.empty


def test_a_taint_bumps_the_generation_and_keeps_its_time_added(four: NodeGpus) -> None:
    published = devices.devices(four, Sharing())
    first = published_slices(slices.plan(slices.wanted(POOL, published, {}), [], NOW))
    bad = {published[2].gpu.uuid: [taints.taint([HealthEvent(None, 74, "")])]}
    tainted = slices.plan(slices.wanted(POOL, published, bad), first, "2026-03-01T10:01:00Z")
    assert tainted.generation == 2
    assert (tainted.create, tainted.delete) == ([], [])
    (obj,) = tainted.update
    assert obj["metadata"]["resourceVersion"] == "100"
    entries = {d["name"]: d for d in obj["spec"]["devices"]}
    assert entries["gpu-2"]["taints"] == [
        {"key": "gpu.gpuwire.io/xid", "value": "74", "effect": "NoSchedule",
         "timeAdded": "2026-03-01T10:01:00Z"}
    ]  # fmt: skip
    assert all("taints" not in entries[n] for n in ("gpu-0", "gpu-1", "gpu-3"))
    later = slices.plan(
        slices.wanted(POOL, published, bad), published_slices(tainted), "2026-03-01T10:09:00Z"
    )
    assert later.empty  # the same taint, published at 10:01, stays as it was
    cleared = slices.plan(slices.wanted(POOL, published, {}), published_slices(tainted), NOW)
    assert cleared.generation == 3
    assert all("taints" not in d for d in cleared.update[0]["spec"]["devices"])


def test_omitted_devices_leave_the_slice_and_extra_slices_go(four: NodeGpus) -> None:
    published = devices.devices(four, Sharing())
    first = published_slices(slices.plan(slices.wanted(POOL, published, {}), [], NOW))
    stray = {**first[0], "metadata": {**first[0]["metadata"], "name": "gpu-node-1-old"}}
    plan = slices.plan(
        slices.wanted(POOL, published, {}, omit={published[0].gpu.uuid}), [*first, stray], NOW
    )
    assert plan.delete == ["gpu-node-1-old"]
    assert [d["name"] for d in plan.update[0]["spec"]["devices"]] == ["gpu-1", "gpu-2", "gpu-3"]


def test_long_node_names_still_give_valid_slice_names() -> None:
    long = slices.Pool(DRIVER, "n" * 250, "uid")
    name = slices.slice_name(long, 7)
    assert len(name) <= 253
    assert name.endswith("-gpu.gpuwire.io-7")
    assert slices.slice_name(slices.Pool(DRIVER, "m" * 250, "uid"), 7) != name


# The DeviceClasses' CEL, evaluated as the scheduler evaluates it (k8s.io/dynamic-resource-
# allocation cel/compile.go): `device.driver`, `device.attributes[domain][name]` with unprefixed
# names under the driver's domain and an empty map for any other domain asked for.


def cel_device(entry: dict[str, Any], driver: str, domains: tuple[str, ...]) -> Any:
    attributes: dict[str, dict[str, Any]] = {d: {} for d in (*domains, driver)}
    for name, value in entry["attributes"].items():
        domain, _, short = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[short] = next(iter(value.values()))
    device = {"driver": driver, "attributes": attributes, "capacity": {}}
    return celpy.adapter.json_to_cel(device)


def classes() -> dict[str, list[str]]:
    docs = yaml.safe_load_all(CLASSES.read_text())
    return {d["metadata"]["name"]: [s["cel"]["expression"] for s in d["spec"]["selectors"]]
            for d in docs}  # fmt: skip


def selects(expression: str, device: Any) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"device": device})
    assert isinstance(result, celpy.celtypes.BoolType), f"{expression}: {result!r}"
    return bool(result)


@pytest.mark.parametrize("version", VERSIONS)
def test_device_classes_validate(version: str) -> None:
    for obj in yaml.safe_load_all(CLASSES.read_text()):
        kubernetes_validate.validate(obj, version, strict=True)


def test_device_classes_select_whole_and_shared_gpus_apart(four: NodeGpus) -> None:
    published = devices.devices(four, Sharing((four.gpus[1].device.uuid,)))
    domains = ("gpu.nvidia.com",)
    chosen = {
        name: [d.name for d in published
               if all(selects(e, cel_device(d.entry, DRIVER, domains)) for e in expressions)]
        for name, expressions in classes().items()
    }  # fmt: skip
    assert chosen == {"gpu.gpuwire.io": ["gpu-0", "gpu-2", "gpu-3"],
                      "shared.gpu.gpuwire.io": ["gpu-1"], "mig.gpu.gpuwire.io": [],
                      "amd.gpu.gpuwire.io": []}  # fmt: skip


def test_device_classes_leave_other_drivers_devices_alone(four: NodeGpus) -> None:
    """Another driver's device (NVIDIA's, same attributes in its own domain) matches no class,
    and evaluating a class on it is no CEL error (which would fail the pod's scheduling)."""
    entry = devices.devices(four, Sharing())[0].entry
    foreign = cel_device(entry, "gpu.nvidia.com", (DRIVER,))
    for expressions in classes().values():
        assert not any(selects(e, foreign) for e in expressions)


@pytest.mark.parametrize(
    "selector",
    [
        'device.attributes["{d}"].productName.contains("A100")',
        'device.attributes["{d}"].type == "gpu" && '
        'device.attributes["{d}"].architecture == "Ampere"',
        'device.attributes["{d}"].uuid == "{uuid}"',
        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:40"',
        'device.attributes["{d}"].brand == "Nvidia"',
    ],
)
def test_a_claim_written_for_nvidia_selects_the_same_gpus_with_the_domain_changed(
    four: NodeGpus, selector: str
) -> None:
    """The same devices published by NVIDIA's driver (its attribute names, its domain) and by
    gpuwire's: a selector for one selects the same GPUs from the other once `gpu.nvidia.com`
    is replaced by `gpu.gpuwire.io`."""
    published = devices.devices(four, Sharing())
    uuid = published[2].gpu.uuid
    nvidia_side = [d.name for d in published
                   if selects(selector.format(d="gpu.nvidia.com", uuid=uuid),
                              cel_device(d.entry, "gpu.nvidia.com", ()))]  # fmt: skip
    gpuwire_side = [d.name for d in published
                    if selects(selector.format(d=DRIVER, uuid=uuid),
                               cel_device(d.entry, DRIVER, ()))]  # fmt: skip
    assert nvidia_side == gpuwire_side
    assert gpuwire_side  # the selector selects something
