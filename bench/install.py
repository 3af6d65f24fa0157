"""What installing, upgrading and uninstalling gpuwire disturbs on a node that runs pods, and
how long each takes (issue 23: no running pod disturbed).

    sudo .venv/bin/python -m bench.install

The story of docs/install.md on a testbed cluster (testbed/lifecycle.py) with containerd 2.x
(sid): a pod without GPUs started, deploy/base installed with the image of pyproject's
version; a GPU pod (one `nvidia.com/gpu`) started; the upgrade to the next version's image
(built if it is not, ~2.5 min); a second GPU pod started and the first deleted; the
uninstall, with the second GPU pod running until the uninstaller waits for it. For each
step: containerd restarts, GPU pods disturbed (goal 0), other pods disturbed (goal 0), and
the wall time, until `rollout status` would return (the uninstall: until the uninstaller is
gone), also as a ratio to a pod start (create to Ready, of a pod without GPUs) measured on
the same cluster first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from scripts import image
from testbed import containerds, lifecycle
from testbed.containerds import Generation
from testbed.install import Install
from testbed.lifecycle import UPGRADE_TO, Step, Watch


def story(generation: Generation, old: image.Image, new: image.Image) -> tuple[float, list[Step]]:
    """The seconds of a pod start, and the three steps."""
    with lifecycle.gpu_cluster(generation, [old.archive, new.archive]) as cluster:
        began = time.monotonic()
        lifecycle.start(cluster, lifecycle.sleeper("plain"))
        pod_start = time.monotonic() - began
        setup = Install(cluster, "base", old.name)
        steps = []
        watch = Watch(cluster, other=["plain"])
        lifecycle.install(setup)
        steps.append(watch.done("install"))
        lifecycle.start(cluster, lifecycle.sleeper("gpu-old", gpus=1))
        watch = Watch(cluster, gpu=["gpu-old"], other=["plain"])
        lifecycle.upgrade(setup, new.name)
        steps.append(watch.done("upgrade"))
        lifecycle.start(cluster, lifecycle.sleeper("gpu-new", gpus=1))
        lifecycle.stop(cluster, "gpu-old")
        watch = Watch(cluster, gpu=["gpu-new"], other=["plain"])
        lifecycle.uninstall(setup, watch, ["gpu-new"])
        steps.append(watch.done("uninstall"))
        return pod_start, steps


def table(generation: Generation, pod_start: float, steps: Sequence[Step]) -> str:
    def count(disturbed: tuple[str, ...], of: int) -> str:
        return f"{len(disturbed)} of {of}" + (f" ({', '.join(disturbed)})" if disturbed else "")

    lines = [
        f"{generation.describe()}; a pod start (baseline): {pod_start:.1f} s",
        f"{'step':10} {'containerd restarts':>19} {'GPU pods disturbed':>19} "
        f"{'other pods disturbed':>21} {'wall s':>7} {'×pod start':>10}",
    ]
    for s in steps:
        lines.append(
            f"{s.name:10} {s.containerd_restarts:19} {count(s.gpu_disturbed, s.gpu_pods):>19} "
            f"{count(s.other_disturbed, s.other_pods):>21} {s.seconds:7.1f} "
            f"{s.seconds / pod_start:10.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    generation = containerds.generations().get("sid")
    if os.geteuid() != 0 or generation is None:
        raise SystemExit("needs root and containerd of sid (make system-deps)")
    old, new = image.build(), image.build(version=UPGRADE_TO)
    pod_start, steps = story(generation, old, new)
    print(table(generation, pod_start, steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
