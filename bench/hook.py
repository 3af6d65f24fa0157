"""What GPU injection adds to a container start, against the plain runtime in the same run.

containerd: a private containerd (gpuwire.lab.containerd) on the simulated node starts
busybox through containerd's runc shim, interleaved round by round so drift hits every
variant alike:

- `runc`: the baseline, the grant env present but nobody reading it;
- `gpuwire-runtime, no GPU`: the shim as `BinaryName`, nothing asked (its pass-through cost);
- `gpuwire-runtime, 1 GPU`: the shim injecting one granted GPU (devices, mounts, ld cache).

The shim is the production launcher (`python -m runtime_hook.launcher DIR`: `python -IS`),
with its `gpuwire-hook` beside it.

`start` times `ctr run --detach` (create and start, as a kubelet waits for them); `run`
times `ctr run --rm` of `true` (start, exit and delete: every runtime call containerd
makes for a container). As root: `python -m bench.hook [--rounds N]`. Goal: ≤ 25 ms added
median start through containerd.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import Summary, report, summarise
from gpuwire.lab.containerd import Container, Containerd
from gpuwire.lab.image import NAME, write_layout_tar
from runtime_hook import launcher
from tests.runtime_support import Lab, cri_annotations, grant_for


def _timed(containerd: Containerd, container: Container, cid: str, *, detach: bool) -> float:
    start = time.perf_counter()
    out = containerd.ctr(*containerd.run_argv(container, cid, detach=detach), check=False)
    elapsed = time.perf_counter() - start
    if detach:
        containerd.remove(cid)
    if out.returncode != 0:
        raise RuntimeError(f"{cid}: {out.stderr.strip()}")
    return elapsed


def containerd_half(rounds: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp) / "lab")
        shim = launcher.install(f"{tmp}/libexec")[0]
        granted = {"NVIDIA_VISIBLE_DEVICES": "1", "GPUWIRE_GRANT": grant_for(lab.keys, "1")}
        annotations = cri_annotations()
        variants = {
            "runc": Container(NAME, ("true",), annotations=annotations, env=granted),
            "gpuwire-runtime, no GPU": Container(
                NAME, ("true",), runc_binary=shim, annotations=annotations
            ),
            "gpuwire-runtime, 1 GPU": Container(
                NAME, ("true",), runc_binary=shim, annotations=annotations, env=granted
            ),
        }
        with Containerd.create() as containerd:
            containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
            containerd.import_image(write_layout_tar(lab.root / "busybox.tar"))
            samples: dict[tuple[str, bool], list[float]] = {}
            for n in range(rounds + 1):  # round 0 warms caches and is not counted
                for name, container in variants.items():
                    for detach in (True, False):
                        cid = f"bench-{uuid.uuid4().hex[:12]}"
                        elapsed = _timed(containerd, container, cid, detach=detach)
                        if n:
                            samples.setdefault((name, detach), []).append(elapsed)
    tables = []
    for detach, what in ((True, "start (ctr run --detach)"), (False, "run (ctr run --rm true)")):
        summaries = [summarise(name, samples[(name, detach)]) for name in variants]
        tables.append(report(f"containerd 1.6, {what}", summaries[0], summaries[1:]))
        tables.append(_added(summaries[0], summaries[1:]))
    return "\n\n".join(tables)


def _added(baseline: Summary, others: list[Summary]) -> str:
    return "\n".join(f"  {s.name}: +{s.p50_ms - baseline.p50_ms:.1f} ms median" for s in others)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hook", description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    missing = [tool for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        parser.exit(2, f"needs root and {', '.join(missing) or 'nothing else'}\n")
    print(containerd_half(args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
