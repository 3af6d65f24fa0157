"""A prepared claim's CDI ids through real podman: the DRA plugin's preparer writes the claim's
spec (gpuwire's edits for exactly its GPUs, the ld-cache hook) into podman's CDI spec dir;
`podman run --device <id>` gives the container exactly those GPUs, and only with the claim's
ids; after unprepare the spec is gone and the ids name nothing."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.dra import cdi
from deviceplugin.dra.cdi import CdiWriter
from deviceplugin.dra.claims import ClaimError, ClaimRef
from deviceplugin.dra.devices import Sharing, devices
from deviceplugin.dra.prepared import Preparer
from deviceplugin.dra.shares import NOTHING, Holders
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import hamicore, sim
from gpuwire.dra import DRIVER
from gpuwire.roots import Roots
from testbed.image import NAME, write_layout_tar
from testbed.lab import Lab
from testbed.podman import Podman
from testbed.view import VIEW_SCRIPT, granted_view, shown, view
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("podman", "runc", "unshare", "busybox")]

HOOK = str(Path(sys.executable).parent / "gpuwire-hook")
NODE = "gpu-node-1"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return Lab(tmp_path_factory.mktemp("dra-podman") / "lab")


@pytest.fixture(scope="module")
def podman(lab: Lab) -> Iterator[Podman]:
    with Podman.create() as instance:
        instance.load(write_layout_tar(lab.root / "busybox.tar"))
        yield instance


class Claims:
    """ResourceClaims as the API server would answer them (the preparer reads one per claim)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}

    def allocate(self, devices: list[str], **share: Any) -> ClaimRef:
        """A claim of `devices`; `share`: a shared GPU's result fields (shareID, …)."""
        ref = ClaimRef("team-a", f"claim-{uuid.uuid4().hex[:6]}", str(uuid.uuid4()))
        results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d} | share
                   for d in devices]  # fmt: skip
        self.stored[(ref.namespace, ref.name)] = {
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        return ref

    def read(self, namespace: str, name: str) -> Mapping[str, Any]:
        if (namespace, name) not in self.stored:
            raise ClaimError(f"claim {namespace}/{name} does not exist")
        return self.stored[(namespace, name)]


def writer(lab: Lab, podman: Podman, holders: Holders = NOTHING) -> CdiWriter:
    """The DRA plugin's writer: specs in podman's CDI dir, tokens in the lab's allocation dir."""
    return CdiWriter(str(podman.cdi_dir), Roots(str(lab.node)), HOOK, "/sbin/ldconfig",
                     str(lab.allocations), str(lab.root / "keys"), "/", holders)  # fmt: skip


def gpu_view(podman: Podman, ids: list[str]) -> dict[str, list[str]]:
    out = podman.run(NAME, ["sh", "-c", VIEW_SCRIPT], devices=ids)
    assert out.returncode == 0, out.stderr
    return view(out.stdout)


def test_a_prepared_claim_gives_exactly_its_gpus_in_podman(
    lab: Lab, podman: Podman, tmp_path: Path
) -> None:
    published = {d.name: d for d in devices(SimDiscovery(lab.node).discover(), Sharing())}
    claims = Claims()
    preparer = Preparer(
        DRIVER, NODE, claims.read, lambda: published, dict, writer(lab, podman), str(tmp_path)
    )
    ref = claims.allocate(["gpu-0", "gpu-2"])
    prepared = preparer.prepare([ref])[ref.uid]
    assert not isinstance(prepared, str), prepared
    ids = [i for d in prepared.devices for i in d.cdi_ids]
    expected = granted_view(lab.machine.devices, (0, 2))
    seen = gpu_view(podman, ids)
    assert shown(seen, expected) == expected
    assert "preload" not in seen  # no share, no limits: nothing of HAMi-core
    assert shown(gpu_view(podman, ids[1:]), granted_view(lab.machine.devices, (2,))) == (
        granted_view(lab.machine.devices, (2,))
    )  # one device of the claim: that GPU and the claim's common edits
    assert gpu_view(podman, [])["devices"] == ["nvidia*"]  # no claim, no GPU

    assert preparer.unprepare([ref]) == {ref.uid: None}
    assert not (podman.cdi_dir / cdi.spec_file(ref.uid)).exists()
    out = podman.run(NAME, ["true"], devices=ids)
    assert out.returncode != 0
    assert ids[0] in out.stderr  # unresolvable: nothing of the claim is left


def test_a_claims_hami_share_preloads_the_library_with_its_limits(
    lab: Lab, podman: Podman, tmp_path: Path
) -> None:
    """A share of a shared GPU (20 GiB of 80) through HAMi-core where the node has the library:
    the container preloads it and the simulated nvidia-smi shows the limited view; where the
    node has none, the prepare fails and no spec is written."""
    library = str(lab.node / sim.HAMI_LIBRARY)
    holders = Holders(library, str(tmp_path / "plugin"))
    hamicore.write_preload(holders.state)
    found = SimDiscovery(lab.node).discover()
    published = {d.name: d for d in devices(found, Sharing(("*",), holders.enforced))}
    claims = Claims()
    share = {"shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": "20Gi"}}
    held = writer(lab, podman, holders)
    preparer = Preparer(DRIVER, NODE, claims.read, lambda: published, dict, held, str(tmp_path))
    ref = claims.allocate(["gpu-1"], **share)
    prepared = preparer.prepare([ref])[ref.uid]
    assert not isinstance(prepared, str), prepared
    seen = gpu_view(podman, [i for d in prepared.devices for i in d.cdi_ids])
    assert seen["preload"] == ["/usr/local/vgpu/libvgpu.so"]
    assert seen["memory"] == ["20480 MiB"]
    assert preparer.unprepare([ref]) == {ref.uid: None}

    bare = writer(lab, podman)
    unheld = Preparer(DRIVER, NODE, claims.read, lambda: published, dict, bare, str(tmp_path))
    ref = claims.allocate(["gpu-1"], **share)
    failed = unheld.prepare([ref])[ref.uid]
    assert isinstance(failed, str)
    assert "limitProfile hami: nothing on this node holds a claim to its share" in failed
    assert not (podman.cdi_dir / cdi.spec_file(ref.uid)).exists()
