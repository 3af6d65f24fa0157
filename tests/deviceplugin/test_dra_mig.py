"""MIG devices as DRA devices: a GPU in MIG mode is published as its MIG devices, named and
described as NVIDIA's DRA driver publishes them, selected by the MIG DeviceClass and by a
claim written for NVIDIA's `mig.nvidia.com` once the domain is changed; prepared with the
parent's node and exactly their capability nodes; tainted by their own XIDs and their
parent's; and published again at a new pool generation when instances are created or
destroyed, without a restart. The plugin runs against the kubelet DRA stand-in and the API
stand-in (every write validated against the 1.34 schema)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from deviceplugin.dra import cdi, devices, slices, taints
from deviceplugin.dra.claims import ClaimError, ClaimRef, Result
from deviceplugin.dra.devices import DraDevice, Sharing
from deviceplugin.gpus.discovery import HealthEvent, NodeGpus
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import cli, driver, migprofiles, sim
from gpuwire.claimtoken import ClaimToken
from gpuwire.dra import DRIVER
from gpuwire.roots import Roots
from testbed.waiting import until
from tests.deviceplugin.test_dra_plugin import HOOK, Cluster, cluster_of, put_claim
from tests.deviceplugin.test_dra_slices import (
    GPU_0,
    NOW,
    POOL,
    VERSIONS,
    attrs,
    cel_device,
    classes,
    selects,
)

# GPU 0 mig-parted's all-balanced, GPU 1 two profiles, GPU 2 MIG mode without MIG devices,
# GPU 3 no MIG: the A100 80 GB's GPU instance profile IDs are 19 (1g.10gb), 20 (1g.10gb+me),
# 14 (2g.20gb) and 9 (3g.40gb) (`nvidia-smi mig -lgip`).
LAYOUT = {0: ("balanced",), 1: ("1g.10gb+me", "3g.40gb"), 2: ()}
MIG_NAMES = [
    "gpu-0-mig-1g10gb-19-0",
    "gpu-0-mig-1g10gb-19-1",
    "gpu-0-mig-2g20gb-14-2",
    "gpu-0-mig-3g40gb-9-4",
    "gpu-1-mig-1g10gb-me-20-0",
    "gpu-1-mig-3g40gb-9-4",
]
MIG_CLASS = "mig.gpu.gpuwire.io"


def machine_with(layout: dict[int, tuple[str, ...]], **kwargs: Any) -> sim.Machine:
    machine = sim.make_machine(**kwargs)
    for index, profiles in layout.items():
        machine = sim.with_mig(machine, index, profiles)
    return machine


def discovered(root: Path, machine: sim.Machine) -> NodeGpus:
    sim.write_node(root, machine)
    return SimDiscovery(root).discover()


@pytest.fixture
def node(tmp_path: Path) -> NodeGpus:
    return discovered(tmp_path / "node", machine_with(LAYOUT, gpus=4))


def by_name(node: NodeGpus) -> dict[str, DraDevice]:
    return {d.name: d for d in devices.devices(node, Sharing())}


# -- what is published -----------------------------------------------------------------------


def test_a_gpu_in_mig_mode_is_published_as_its_mig_devices_with_nvidias_names(
    node: NodeGpus,
) -> None:
    """Whole GPUs first, then each GPU's MIG devices smallest first; a GPU in MIG mode is
    never a whole device, with or without MIG devices."""
    published = devices.devices(node, Sharing())
    assert [d.name for d in published] == ["gpu-3", *MIG_NAMES]
    three = by_name(node)["gpu-0-mig-3g40gb-9-4"]
    parent = node.gpus[0].device
    (m,) = [m.device for m in node.mig_of(parent.uuid) if m.device.profile == "3g.40gb"]
    assert (three.mig, three.gpu, three.uuid) == (m, parent, m.uuid)
    assert attrs(three) == {"type": "mig", "uuid": m.uuid, "parentUUID": parent.uuid,
                            "profile": "3g.40gb", **GPU_0}  # fmt: skip
    capacity = {k: v["value"] for k, v in three.entry["capacity"].items()}
    assert capacity == {
        "multiprocessors": "42", "copyEngines": "3", "decoders": "2", "encoders": "0",
        "jpegEngines": "0", "ofaEngines": "0", "memory": "40192Mi",
        "memorySlice4": "1", "memorySlice5": "1", "memorySlice6": "1", "memorySlice7": "1",
    }  # fmt: skip
    me = attrs(by_name(node)["gpu-1-mig-1g10gb-me-20-0"])
    assert (me["profile"], me["parentUUID"]) == ("1g.10gb+me", node.gpus[1].device.uuid)
    assert "allowMultipleAllocations" not in three.entry


@pytest.mark.parametrize("product", sorted(migprofiles.PROFILES))
def test_the_largest_mig_device_of_each_model_stays_within_the_apis_limits(
    tmp_path: Path, product: str
) -> None:
    """At most 32 attributes and capacities per device (resource.k8s.io/v1 Device): the
    whole-GPU profile has all eight memory slices."""
    largest = migprofiles.profiles(product)[-1]
    machine = machine_with({0: (largest.name,)}, gpus=1, products=(product,))
    (device,) = devices.devices(discovered(tmp_path, machine), Sharing())
    assert device.name == f"gpu-0-mig-{largest.name.replace('.', '')}-0-0"
    assert len(device.entry["attributes"]) + len(device.entry["capacity"]) <= 32
    assert [f"memorySlice{i}" for i in range(8)] == [
        k for k in device.entry["capacity"] if k.startswith("memorySlice")
    ]
    plan = slices.plan(slices.wanted(POOL, [device], {}), [], NOW)
    kubernetes_validate.validate(plan.create[0], "1.34", strict=True)


def test_mig_devices_nvidia_does_not_publish_are_left_out_saying_why(node: NodeGpus) -> None:
    split, unnamed, *rest = node.mig
    mig = (replace(split, ci_slices=1), replace(unnamed, profile_id=-1), *rest)
    changed = replace(node, mig=mig)
    assert devices.unpublished(changed.mig[0]) == (
        "its compute instance is smaller than its GPU instance"
    )
    assert "NVML did not say" in str(devices.unpublished(changed.mig[1]))
    assert devices.unpublished(changed.mig[2]) is None
    names = {d.name for d in devices.devices(changed, Sharing())}
    assert len(names & set(MIG_NAMES)) == len(MIG_NAMES) - 2


def test_sharing_a_gpu_in_mig_mode_shares_none_of_its_mig_devices(node: NodeGpus) -> None:
    published = devices.devices(node, Sharing(("*A100*",)))
    assert [d.name for d in published if d.shared] == ["gpu-3"]


@pytest.mark.parametrize("version", VERSIONS)
def test_slices_with_mig_devices_and_their_taints_validate(node: NodeGpus, version: str) -> None:
    published = devices.devices(node, Sharing())
    bad = {published[1].uuid: [taints.taint([HealthEvent(None, 48, "")])]}
    (obj,) = slices.plan(slices.wanted(POOL, published, bad), [], NOW).create
    kubernetes_validate.validate(obj, version, strict=True)
    tainted = [d["name"] for d in obj["spec"]["devices"] if "taints" in d]
    assert tainted == [published[1].name]


# -- DeviceClasses and claims ----------------------------------------------------------------


def test_the_mig_class_selects_mig_devices_and_the_gpu_classes_none(node: NodeGpus) -> None:
    published = devices.devices(node, Sharing())
    chosen = {
        name: [d.name for d in published
               if all(selects(e, cel_device(d.entry, DRIVER, ())) for e in expressions)]
        for name, expressions in classes().items()
    }  # fmt: skip
    assert chosen == {"gpu.gpuwire.io": ["gpu-3"], "shared.gpu.gpuwire.io": [],
                      MIG_CLASS: MIG_NAMES, "amd.gpu.gpuwire.io": []}  # fmt: skip


# The selector of NVIDIA's `mig.nvidia.com` (kubernetes-sigs/dra-driver-nvidia-gpu's chart).
NVIDIA_MIG_CLASS = (
    'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"'
)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"', MIG_NAMES[:2]),
        ('device.attributes["gpu.nvidia.com"].profile.startsWith("3g.")', MIG_NAMES[3::2]),
        ('device.attributes["gpu.nvidia.com"].parentUUID == "{parent}"', MIG_NAMES[4:]),
        ('device.attributes["gpu.nvidia.com"].productName.contains("A100") && '
         'device.attributes["resource.kubernetes.io"].pciBusID == "0000:0f:00.0"', MIG_NAMES[4:]),
    ],
)  # fmt: skip
def test_a_claim_written_for_nvidias_mig_class_selects_the_same_mig_devices(
    node: NodeGpus, selector: str, expected: list[str]
) -> None:
    """NVIDIA's `mig.nvidia.com` class and a claim's selector, `gpu.nvidia.com` replaced by
    `gpu.gpuwire.io` in both: gpuwire's MIG class selects the devices NVIDIA's names say."""
    parent = node.gpus[1].device.uuid
    expressions = [NVIDIA_MIG_CLASS, selector.format(parent=parent)]
    ours = [e.replace("gpu.nvidia.com", DRIVER) for e in expressions]
    published = devices.devices(node, Sharing())
    chosen = [d.name for d in published
              if all(selects(e, cel_device(d.entry, DRIVER, ())) for e in ours)]  # fmt: skip
    assert chosen == expected
    assert ours[0] == classes()[MIG_CLASS][0]


# -- prepare ---------------------------------------------------------------------------------


def test_a_mig_device_destroyed_after_allocation_fails_its_claim_naming_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "node"
    machine = machine_with({0: ("1g.10gb", "2g.20gb")}, gpus=1)
    target = by_name(discovered(root, machine))["gpu-0-mig-2g20gb-14-2"]
    ref = ClaimRef("team-a", "small", "5a4f6b1e-0000-4000-8000-000000000001")
    assert target.mig is not None
    caps = ("compute", "utility")
    found = driver.discover(Roots(str(root)), caps)
    token = f"/var/lib/gpuwire/allocations/claims/{ref.uid}"
    results = [Result("gpus", target)]
    named = cdi.claim_devices(results)
    spec = cdi.claim_spec(found, ref, results, caps, named, HOOK, "/sbin/ldconfig", token)
    (device,) = spec["devices"]
    nodes = [f"/dev/nvidia-caps/nvidia-cap{c}" for c in (target.mig.gi_cap, target.mig.ci_cap)]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0", *nodes]
    # the runtime selects it, and its token names it, by its own UUID
    assert f"NVIDIA_VISIBLE_DEVICES={target.mig.uuid}" in spec["containerEdits"]["env"]
    assert [d.uuid for d in named] == [target.mig.uuid]
    sim.write_node(root, sim.destroy_mig(machine, 0, target.mig.gi))
    found = driver.discover(Roots(str(root)), caps)
    gone = f"claim team-a/small: MIG device {target.mig.uuid} .* does not exist any more"
    with pytest.raises(ClaimError, match=gone):
        cdi.claim_spec(found, ref, results, caps, named, HOOK, "/sbin/ldconfig", token)


def test_a_claims_devices_are_visible_in_the_order_they_were_allocated(tmp_path: Path) -> None:
    """The token lists its devices by name; the container gets them in the allocation's
    order, which NVIDIA_VISIBLE_DEVICES hands to CUDA as its device ordinals."""
    root = tmp_path / "node"
    machine = machine_with({}, gpus=4)
    gpus = by_name(discovered(root, machine))
    ref = ClaimRef("team-a", "pair", "5a4f6b1e-0000-4000-8000-000000000002")
    caps = ("compute", "utility")
    found = driver.discover(Roots(str(root)), caps)
    results = [Result("gpus", gpus["gpu-3"]), Result("gpus", gpus["gpu-1"])]
    named = cdi.claim_devices(results)
    spec = cdi.claim_spec(found, ref, results, caps, named, HOOK, "/sbin/ldconfig", "/t")
    visible = ",".join(gpus[n].gpu.uuid for n in ("gpu-3", "gpu-1"))
    assert f"NVIDIA_VISIBLE_DEVICES={visible}" in spec["containerEdits"]["env"]
    assert [d["name"] for d in spec["devices"]] == [f"{ref.uid}-gpu-3", f"{ref.uid}-gpu-1"]
    token = ClaimToken(ref.uid, ref.namespace, ref.name, (), named)
    assert [d.name for d in token.devices] == ["gpu-1", "gpu-3"]


# -- the plugin ------------------------------------------------------------------------------


@pytest.fixture(name="c")
def mig_cluster(tmp_path: Path, socket_dir: Path) -> Iterator[Cluster]:
    with cluster_of(machine_with(LAYOUT, gpus=4), tmp_path, socket_dir) as c:
        yield c


def spec_nodes(c: Cluster, uid: str) -> dict[str, list[str]]:
    spec = json.loads((Path(c.config.cdi_dir) / cdi.spec_file(uid)).read_text())
    return {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
            for d in spec["devices"]}  # fmt: skip


def caps_of(c: Cluster, name: str) -> list[str]:
    mig = by_name(SimDiscovery(c.root).discover())[name].mig
    assert mig is not None
    return [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (mig.gi_cap, mig.ci_cap)]


def test_a_claim_for_a_mig_device_gets_its_parent_and_exactly_its_capabilities(
    c: Cluster,
) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    until(lambda: list(c.devices()) == ["gpu-3", *MIG_NAMES])
    until(lambda: set(c.kubelet.device_health(DRIVER)) == {"gpu-3", *MIG_NAMES})
    wanted = ["gpu-0-mig-1g10gb-19-1", "gpu-1-mig-3g40gb-9-4"]
    ref = put_claim(c.api, "two-mig", wanted, device_class=MIG_CLASS)
    (answer,) = c.kubelet.prepare(DRIVER, [ref]).values()
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == wanted
    uid = ref[2]
    assert spec_nodes(c, uid) == {
        f"{uid}-{wanted[0]}": ["/dev/nvidia0", *caps_of(c, wanted[0])],
        f"{uid}-{wanted[1]}": ["/dev/nvidia1", *caps_of(c, wanted[1])],
    }
    assert c.kubelet.unprepare(DRIVER, [ref]) == {uid: ""}
    assert not (Path(c.config.cdi_dir) / cdi.spec_file(uid)).exists()


def test_mig_changes_are_published_at_a_new_generation_without_a_restart(c: Cluster) -> None:
    c.start_plugin()
    c.kubelet.wait_registered(DRIVER)
    until(lambda: list(c.devices()) == ["gpu-3", *MIG_NAMES])
    generation = c.slices()[0]["spec"]["pool"]["generation"]
    # GPU 2, in MIG mode without MIG devices: one is made
    assert cli.main(["sim", "mig", str(c.root), "--gpu", "2", "--create", "2g.20gb"]) == 0
    until(lambda: "gpu-2-mig-2g20gb-14-0" in c.devices())
    assert c.slices()[0]["spec"]["pool"]["generation"] == generation + 1
    until(lambda: c.kubelet.device_health(DRIVER).get("gpu-2-mig-2g20gb-14-0") == "Healthy")
    # GPU 0's 3g.40gb (GPU instance 2) destroyed: its device goes, and a claim for it fails
    old = c.devices()["gpu-0-mig-3g40gb-9-4"]["attributes"]["uuid"]["string"]
    assert cli.main(["sim", "mig", str(c.root), "--gpu", "0", "--destroy", "2"]) == 0
    until(lambda: "gpu-0-mig-3g40gb-9-4" not in c.devices())
    claim = put_claim(c.api, "gone", ["gpu-0-mig-3g40gb-9-4"], device_class=MIG_CLASS)
    (answer,) = c.kubelet.prepare(DRIVER, [claim]).values()
    assert "this node has no device 'gpu-0-mig-3g40gb-9-4'" in answer.error
    # made again in the same place: the same name (what it is), a new UUID (which one it is)
    assert cli.main(["sim", "mig", str(c.root), "--gpu", "0", "--create", "3g.40gb"]) == 0
    until(lambda: "gpu-0-mig-3g40gb-9-4" in c.devices())
    assert c.devices()["gpu-0-mig-3g40gb-9-4"]["attributes"]["uuid"]["string"] != old
    assert c.slices()[0]["spec"]["pool"]["generation"] == generation + 3


def tainted(c: Cluster) -> dict[str, str]:
    return {name: d["taints"][0]["value"] for name, d in c.devices().items() if "taints" in d}


def test_an_xid_taints_its_mig_device_and_one_on_the_parent_all_of_its_mig_devices(
    c: Cluster,
) -> None:
    c.start_plugin(recover_after=60.0)
    c.kubelet.wait_registered(DRIVER)
    until(lambda: list(c.devices()) == ["gpu-3", *MIG_NAMES])
    one = by_name(SimDiscovery(c.root).discover())["gpu-0-mig-1g10gb-19-1"].mig
    assert one is not None
    assert cli.main(["sim", "fault", str(c.root), "--gpu", one.uuid, "--xid", "74"]) == 0
    until(lambda: tainted(c) == {"gpu-0-mig-1g10gb-19-1": "74"})
    until(lambda: c.kubelet.device_health(DRIVER).get("gpu-0-mig-1g10gb-19-1") == "Unhealthy")
    assert c.kubelet.device_health(DRIVER)["gpu-0-mig-1g10gb-19-0"] == "Healthy"
    claim = put_claim(c.api, "sick", ["gpu-0-mig-1g10gb-19-1"], device_class=MIG_CLASS)
    (answer,) = c.kubelet.prepare(DRIVER, [claim]).values()
    assert f"gpu-0-mig-1g10gb-19-1 ({one.uuid}) is unhealthy" in answer.error
    assert cli.main(["sim", "fault", str(c.root), "--gpu", "1", "--xid", "79"]) == 0
    until(lambda: set(tainted(c)) == {"gpu-0-mig-1g10gb-19-1", *MIG_NAMES[4:]})
    assert {tainted(c)[n] for n in MIG_NAMES[4:]} == {"79"}
    effects = {d["taints"][0]["effect"] for n, d in c.devices().items() if n in MIG_NAMES[4:]}
    assert effects == {"NoExecute"}


class SplitDiscovery(SimDiscovery):
    """The simulated node with its first MIG device's compute instance on one slice of its
    three-slice GPU instance (`1c.3g.40gb`: the simulated node makes only whole ones)."""

    def discover(self) -> NodeGpus:
        node = super().discover()
        first, *rest = node.mig
        d = first.device
        named = d.identified(d.uuid, "1c.3g.40gb", d.memory_mib, d.slices)
        split = replace(first, ci_slices=1, device=named)
        return replace(node, mig=(split, *rest))


def test_the_plugin_says_which_mig_devices_it_leaves_out_and_why(
    c: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    from deviceplugin.dra.plugin import DraPlugin

    plugin = DraPlugin(c.config, SplitDiscovery(c.root), c.api.client())
    split = plugin.agent.discovery.discover().mig[0].device
    assert "gpu-0-mig-3g40gb-9-4" not in plugin.by_name
    assert len(plugin.by_name) == len(MIG_NAMES)  # gpu-3 and the five others
    warned = [r.getMessage() for r in caplog.records if "is not published" in r.getMessage()]
    assert warned == [
        f"MIG device {split.name} is not published: its compute instance is smaller than its "
        "GPU instance"
    ]
    plugin._rediscovered(plugin.agent.discovery.discover())  # the same again: said once
    assert sum("is not published" in r.getMessage() for r in caplog.records) == 1
