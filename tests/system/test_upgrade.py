"""An upgrade through the manifests as a user runs it (issue 23), with pods running on the
node throughout: a pod without GPUs started, deploy/base installed with the image of
pyproject's version, a GPU pod started, then `kubectl apply -k` with the image of the next
version (testbed/lifecycle.py: UPGRADE_TO, a build of its own), then the uninstall. What
docs/install.md promises:

- the install restarts containerd once and disturbs no running pod; a GPU pod asked for
  while it runs, as a controller asks (again while the webhook refuses it, not serving yet),
  is never bound to the node before the node is ready for GPU pods (the RuntimeClass's
  nodeSelector), none of its starts fails on the way, and it runs with its GPU;
- the upgrade disturbs neither pod and does not restart containerd (its configuration names
  the launchers through `current`, the same for every version); `current` names the new
  version; the old version's files go once nothing uses them, and nothing of a running
  container names a version (BinaryName goes through `current`), so the upgrade's own
  installer pass removes them;
- a GPU pod started after it gets its GPU through the new version: its runtime is
  `current`'s launcher, of the new build, served by the new version's resident;
- the GPU pod started before stops cleanly without its version's files (its shim calls the
  runtime through `current`): containerd holds nothing of it after;
- the uninstall restarts containerd once, disturbs neither the GPU pod it waits for nor the
  other pod, and the other pod runs on.

On containerd 1.7 (trixie) and 2.x (sid), one cluster each."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from scripts import image
from testbed import containerds, lifecycle
from testbed.cluster import Cluster
from testbed.install import NAMESPACE, Install, running_as
from testbed.lifecycle import UPGRADE_TO, Watch
from tests.conftest import requires_binary, requires_root

pytestmark = [requires_root(), requires_binary("unshare", "runc", "ip")]


@pytest.fixture(scope="module")
def upgrade_image(gpuwire_image: image.Image) -> image.Image:
    """The image of the next version (~2.5 min the first time, nothing to do after), built
    where the first is (its fixture skips elsewhere)."""
    return image.build(version=UPGRADE_TO)


@pytest.fixture(scope="module", params=["trixie", "sid"])  # containerd 1.7, 2.x
def cluster(
    request: pytest.FixtureRequest, gpuwire_image: image.Image, upgrade_image: image.Image
) -> Iterator[Cluster]:
    generation = containerds.generations().get(request.param)
    if generation is None:
        pytest.skip(f"containerd of {request.param} not fetched (make system-deps)")
    with lifecycle.gpu_cluster(generation, [gpuwire_image.archive, upgrade_image.archive]) as made:
        yield made


GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: GPU-[0-9a-f-]+\)$", re.M)


@pytest.mark.timeout(600)  # three steps of minutes each on a busy machine
def test_install_upgrade_and_uninstall_disturb_no_running_pod(
    cluster: Cluster, gpuwire_image: image.Image, upgrade_image: image.Image
) -> None:
    old = gpuwire_image.name.rsplit(":", 1)[1]
    setup = Install(cluster, "base", gpuwire_image.name)
    lifecycle.start(cluster, lifecycle.sleeper("plain"))
    watch = Watch(cluster, other=["plain"])
    early = lifecycle.EarlyPod(cluster, lifecycle.sleeper("gpu-early", gpus=1))
    lifecycle.install(setup)
    installed = watch.done("install")
    assert (installed.containerd_restarts, installed.other_disturbed) == (1, ())
    assert lifecycle.versions(cluster) == [old]
    assert lifecycle.current(cluster) == old
    went = early.result()
    print(f"\na GPU pod created during the install: {went}")
    assert went.refused or went.admitted_before_ready  # it was asked for during the install
    assert (went.bound_before_ready, went.failures) == ((), ())
    assert len(GPU_LINE.findall(lifecycle.logs(cluster, "gpu-early", "app"))) == 1
    lifecycle.stop(cluster, "gpu-early")
    old_gpu, _ = lifecycle.start(cluster, lifecycle.sleeper("gpu-old", gpus=1))

    watch = Watch(cluster, gpu=["gpu-old"], other=["plain"])
    lifecycle.upgrade(setup, upgrade_image.name)
    upgraded = watch.done("upgrade")
    assert upgraded.gpu_disturbed == upgraded.other_disturbed == ()
    assert upgraded.containerd_restarts == 0
    assert lifecycle.current(cluster) == UPGRADE_TO
    assert lifecycle.versions(cluster) == [UPGRADE_TO]  # nothing used the old one
    options = lifecycle.task_options(cluster, old_gpu)  # what its shim calls until deleted
    assert "/opt/gpuwire/current/libexec/gpuwire-runtime" in options
    assert f"/opt/gpuwire/{old}/" not in options

    new_gpu, _ = lifecycle.start(cluster, lifecycle.sleeper("gpu-new", gpus=1))
    assert len(GPU_LINE.findall(lifecycle.logs(cluster, "gpu-new", "app"))) == 1
    assert "/opt/gpuwire/current/libexec/gpuwire-runtime" in lifecycle.task_options(
        cluster, new_gpu
    )
    built = cluster.node.path("/opt/gpuwire/current/BUILD_ID").read_text().strip()
    assert built == upgrade_image.build_id
    (agent,) = cluster.pods(NAMESPACE, {"app.kubernetes.io/component": "node"})
    resident = lifecycle.logs(cluster, agent["metadata"]["name"], "resident", NAMESPACE)
    assert f"/opt/gpuwire/{UPGRADE_TO}/" in resident, resident

    lifecycle.stop(cluster, "gpu-old")
    assert lifecycle.left_in_containerd(cluster, old_gpu) == []

    plain = running_as(lifecycle.pod(cluster, "plain"))
    watch = Watch(cluster, gpu=["gpu-new"], other=["plain"])
    lifecycle.uninstall(setup, watch, ["gpu-new"])
    uninstalled = watch.done("uninstall")
    assert uninstalled.gpu_disturbed == uninstalled.other_disturbed == ()
    assert uninstalled.containerd_restarts == 1
    assert lifecycle.left_in_containerd(cluster, new_gpu) == []
    assert running_as(lifecycle.pod(cluster, "plain")) == plain
    assert not cluster.node.path("/opt/gpuwire").exists()
