"""What every part of the demo's cluster uses: where things are, its images, the record of
the commands it ran, the runtime handlers a containerd has, and waiting for other processes.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.containerd import CRI_NAMESPACE, RUNTIME_PLUGIN, Containerd
from testbed.host import LabError
from testbed.image import write_layout_tar
from testbed.kubelet import Kubelet
from testbed.kuberuntime import KubeRuntime
from testbed.podresources import PodResourcesKubelet
from testbed.view import AMD_VIEW_SCRIPT, VIEW_SCRIPT

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GPUWIRE = str(BIN / "gpuwire")

# The demo's images: busybox whose command prints what the container sees of the GPUs
# (testbed.view), then `VIEWED`, then keeps running (holding its GPUs) until the demo
# ends. `cuda` also bakes in the env NVIDIA's CUDA images carry; `rocm` prints what an AMD
# container sees (testbed.view's AMD_VIEW_SCRIPT) and bakes in no env, as ROCm's images.
IMAGE = "docker.io/gpuwire/demo:latest"
CUDA_IMAGE = "docker.io/gpuwire/demo:cuda"
ROCM_IMAGE = "docker.io/gpuwire/demo:rocm"
CUDA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
VIEWED = "viewed: yes"
JOB = "/usr/bin/gpu-job"
AMD_JOB = "/usr/bin/amd-gpu-job"
SCRIPTS = {
    "/usr/bin/gpu-view": "#!/bin/sh" + VIEW_SCRIPT,
    "/usr/bin/amd-gpu-view": "#!/bin/sh" + AMD_VIEW_SCRIPT,
    JOB: f"#!/bin/sh\ngpu-view\necho '{VIEWED}'\nexec sleep 86400\n",
    AMD_JOB: f"#!/bin/sh\namd-gpu-view\necho '{VIEWED}'\nexec sleep 86400\n",
}
IMAGES = {IMAGE: (None, JOB), CUDA_IMAGE: (CUDA_ENV, JOB), ROCM_IMAGE: (None, AMD_JOB)}
NVIDIA_IMAGES = (IMAGE, CUDA_IMAGE)


@dataclass(frozen=True)
class Step:
    """A command the demo ran (or started), for the list of commands to run by hand."""

    what: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Handler:
    """A containerd runtime handler, as the CRI plugin reads it from its config."""

    name: str
    runtime_type: str
    binary: str | None  # options.BinaryName: what the runc shim runs instead of runc


@dataclass(frozen=True)
class Host:
    """A node's kubelet side, as the demo's kubelet step runs pods there: the kubelet stand-in
    its device plugin registered with, its pod-resources API, the runtime manager on its
    containerd's CRI socket (None: containers do not run here) and that containerd's runtime
    handlers."""

    kubelet: Kubelet
    pod_resources: PodResourcesKubelet
    runtime: KubeRuntime | None
    handlers: Mapping[str, Handler]
    default_handler: str


def run(
    steps: list[Step], what: str, argv: Sequence[str], env: dict[str, str] | None = None
) -> None:
    """Run a command to completion (LabError if it fails) and add it to `steps`."""
    out = subprocess.run(
        list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env
    )
    if out.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {out.stderr.strip()}")
    steps.append(Step(what, tuple(argv)))


def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Wait for something another process does; LabError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def handlers_of(dump: str, config_version: int) -> tuple[dict[str, Handler], str]:
    """The CRI plugin's runtime handlers and its default, from `containerd config dump`."""
    section = tomllib.loads(dump)["plugins"][RUNTIME_PLUGIN[config_version]]["containerd"]
    handlers = {
        name: Handler(name, entry["runtime_type"], entry.get("options", {}).get("BinaryName"))
        for name, entry in section["runtimes"].items()
    }
    return handlers, section["default_runtime_name"]


def import_images(
    containerd: Containerd, workdir: Path, prefix: str = "", names: Sequence[str] = NVIDIA_IMAGES
) -> None:
    """The demo's images `names`, as OCI layout tars under `workdir`, into a containerd's CRI
    namespace."""
    for name in names:
        env, job = IMAGES[name]
        tar = write_layout_tar(workdir / f"{prefix}{name.rsplit(':', 1)[1]}.tar", name,
                               env=env, cmd=(job,), scripts=SCRIPTS)  # fmt: skip
        containerd.import_image(tar, CRI_NAMESPACE)
