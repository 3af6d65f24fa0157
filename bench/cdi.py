"""What gpuwire's hook adds to a CDI GPU start: the same claim's CDI edits with and without it.

    sudo .venv/bin/python -m bench.cdi [--runs N] [--python P] [--only ENGINE] [--tmpfs]

Every DRA GPU start takes this path: the engine applies the claim's spec (device nodes with
cgroup rules, the driver's files as read-only mounts, env), and gpuwire's one hook makes the
SONAME links and writes the container's ld cache. The specs are the DRA plugin's
(`deviceplugin.dra.cdi`) for one GPU of the simulated node; the image is bench.hook's
(busybox with the libraries and ld cache of a typical GPU image). Cases, in a new random
order each round:

- baseline: the spec without its hook (the edits alone: the floor of any CDI start);
- gpuwire's hook as a node the installer set up runs it: gpuwire-call, which makes the
  links and cache itself in C (`runtime_hook/setup/ldcache.c`; its resident gpuwire would
  serve only a call the C declines, and its Python fallback does not exist);
- the hook served by the resident gpuwire (through its shell launcher, whose gpuwire-call
  hands the call over; the `createRuntime` hook runs in the runtime's namespaces, where the
  resident serves it, and enters the container itself): what a start the C declines costs,
  and what every CDI start cost before the C;
- the hook as the Python launcher (what every CDI start paid before, ~25 ms on podman);
- `/bin/true` as the hook: what the runtime's running of any hook costs.

- through containerd only, the same two specs for a pod under gpuwire's runtime handler
  (RuntimeClass `gpuwire`, its launcher served by the resident), which checks the claim's
  token and keeps the container's record either way; given the spec with its hook, the shim
  makes the links and cache the hook would and runc runs no hook
  (`runtime_hook.start.shim`): the CDI path's cost on a gpuwire node.

Engines: podman (`podman start --attach` of a container `podman create` made, timed from
exec to exit; run in the host's mount namespace, so the specs go into /var/run/cdi under
names no one else uses, removed after), and containerd 1.7 and 2.x over CRI (StartContainer
of a container CreateContainer made), each with CDI on and the specs in its own spec dir.
Only the start is timed: the hook runs there (the runtime's `create`), and what comes before
it (podman's copy of the image into the container's storage, containerd's snapshot) is the
same with or without the hook and was most of the runs' scatter.
Goal: gpuwire adds at most 5 ms median over the edits alone.

`--tmpfs` runs it all on a tmpfs (`on_tmpfs`): the hook's own cost, without the disk's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import report, summarise
from bench.hook import add_image_libraries, write_image
from deviceplugin.dra.cdi import CdiWriter
from deviceplugin.dra.claims import ClaimRef, Result
from deviceplugin.dra.devices import Sharing, devices
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire.roots import Roots
from runtime_hook.injection import ldcache
from runtime_hook.setup import launcher
from testbed import containerds
from testbed.containerd import CRI_NAMESPACE, Containerd
from testbed.image import NAME
from testbed.kuberuntime import KubeRuntime, Sandbox
from testbed.lab import Lab
from testbed.podman import ULIMITS, Podman
from testbed.resident import Resident

CONSOLE_SCRIPTS = Path(sys.executable).parent
HOST_CDI = Path("/var/run/cdi")


def write_specs(
    lab: Lab, directory: Path, hooks: dict[str, str | None], pods: tuple[str, ...] = ()
) -> tuple[dict[str, str], list[Path]]:
    """One claim spec per case (its hook, or none), written where the engine reads them, its
    token (bound to the pods of UIDs `pods`) in the lab's allocation dir; case → the CDI id of
    its one GPU, and the specs."""
    gpu = devices(SimDiscovery(lab.node).discover(), Sharing())[1]
    ids, paths = {}, []
    for case, hook in hooks.items():
        ref = ClaimRef("bench", f"c-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()))
        writer = CdiWriter(str(directory), Roots(str(lab.node)), hook or "/", "/sbin/ldconfig",
                           str(lab.allocations), str(lab.root / "keys"))  # fmt: skip
        answered, (path, _token) = writer.write(ref, [Result("gpus", gpu)], pods)
        if hook is None:  # the same edits, without the hook
            spec = json.loads(Path(path).read_text())
            spec["containerEdits"].pop("hooks")
            Path(path).write_text(json.dumps(spec))
        ids[case] = answered[gpu.name][0]
        paths.append(Path(path))
    return ids, paths


def rounds(cases: list[str], runs: int, start: Callable[[str], float]) -> dict[str, list[float]]:
    """`runs` timed rounds after one warm-up, the cases in a new random order each."""
    samples: dict[str, list[float]] = {}
    order = random.Random(0)
    for n in range(runs + 1):
        for case in order.sample(cases, len(cases)) if n else cases:
            elapsed = start(case)
            if n:
                samples.setdefault(case, []).append(elapsed)
    return samples


def print_report(title: str, cases: list[str], samples: dict[str, list[float]]) -> None:
    base, *others = (summarise(case, samples[case]) for case in cases)
    print(report(title, base, others))
    for other in others:
        low, mid, high = paired(samples[other.name], samples[cases[0]])
        print(f"{other.name:36} adds {other.p50_ms - base.p50_ms:6.2f} ms (p50); per round "
              f"{mid:6.2f} ms, 95% {low:.2f} to {high:.2f}")  # fmt: skip
    print()


def paired(case: list[float], base: list[float]) -> tuple[float, float, float]:
    """The median of the rounds' differences (case − baseline, the same round's starts, ms)
    and the distribution-free 95% interval around it (the order statistics n/2 ± 0.98√n):
    the runs scatter by more than the goal, and a round's two starts share the node's state."""
    diffs = sorted((c - b) * 1000 for c, b in zip(case, base, strict=True))
    n = len(diffs)
    spread = round(0.98 * n**0.5)
    low, high = max(0, (n - 1) // 2 - spread), min(n - 1, n // 2 + spread)
    return diffs[low], (diffs[(n - 1) // 2] + diffs[n // 2]) / 2, diffs[high]


BASE = "CDI edits, no hook"
HOOK = "gpuwire hook (gpuwire-call, in C)"
RESIDENT = "gpuwire hook, served by the resident"
PYTHON = "gpuwire hook, Python launcher"
SHIM_BASE = "gpuwire runtime, CDI edits, no hook"
SHIM = "gpuwire runtime, its hook made by the shim"
ANY = "any hook at all (/bin/true)"
HANDLER = "gpuwire"  # deploy/base/runtimeclass.yaml


@contextlib.contextmanager
def hooks(tmp: Path, python: str) -> Iterator[dict[str, str | None]]:
    """case → the spec's hook: none, gpuwire-call, the served launcher (a resident
    running), Python's, /bin/true."""
    launcher.install(f"{tmp}/libexec", python, socket=None)
    # whose Python fallback does not exist: a start the resident declined would fail
    launcher.install(f"{tmp}/served", "/nonexistent/python3", socket=f"{tmp}/resident.sock")
    # the served launcher alone, without the gpuwire-call beside it that a spec would name
    os.mkdir(f"{tmp}/scripted")
    shutil.copy(f"{tmp}/served/{launcher.HOOK}", f"{tmp}/scripted/{launcher.HOOK}")
    with Resident(f"{tmp}/resident.sock", python):
        yield {
            BASE: None,
            HOOK: f"{tmp}/served/{launcher.HOOK}",
            RESIDENT: f"{tmp}/scripted/{launcher.HOOK}",
            PYTHON: f"{tmp}/libexec/{launcher.HOOK}",
            ANY: "/bin/true",
        }


def runc_half(runs: int, python: str) -> None:
    """The claim's edits put into config.json as an engine applies CDI edits
    (`runtime_hook.start.spec.apply`), the hook as `hooks.createRuntime`; `runc run` of
    `true`, timed from exec to exit. Before each start the rootfs is as the image left it
    (its cache put back, the links the hook made removed), as a fresh snapshot is."""
    from runtime_hook.start import spec as ocispec
    from testbed.rootfs import Bundle

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        lab = Lab(tmp / "lab")
        with hooks(tmp, python) as case_hooks:
            specs = {}
            ids, paths = write_specs(lab, tmp / "cdi", case_hooks)
            for (case, _), path in zip(ids.items(), paths, strict=True):
                specs[case] = json.loads(path.read_text())
            bundles: dict[str, Any] = {}
            for case, spec in specs.items():
                bundle = Bundle.create(tmp / f"b-{len(bundles)}", ["true"], {})
                add_image_libraries(bundle.path / "rootfs")
                bundle.spec = ocispec.apply(bundle.spec, _edits(spec))
                if spec["containerEdits"].get("hooks"):
                    (h,) = spec["containerEdits"]["hooks"]
                    bundle.spec["hooks"] = {"createRuntime": [
                        {k: h[k] for k in ("path", "args", "env", "timeout")}]}  # fmt: skip
                bundle.save()
                bundles[case] = bundle
            pristine = {c: _rootfs_state(b.path / "rootfs") for c, b in bundles.items()}
            samples = rounds(list(bundles), runs, lambda case: _runc(bundles[case], pristine[case]))
            for case in (HOOK, RESIDENT, PYTHON):  # the last start's work, as each left it
                if (
                    not (bundles[case].path / "rootfs/etc/ld.so.cache")
                    .read_bytes()
                    .endswith(ldcache.GENERATOR)
                ):
                    raise SystemExit(f"{case}: the container's ld cache is not gpuwire's")
    print_report(f"runc run true, the claim's CDI edits in config.json, {runs} runs", list(ids),
                 samples)  # fmt: skip


def _edits(spec: dict[str, Any]) -> Any:
    """The spec's edits (common and its one device's) as gpuwire.edits.Edits."""
    from gpuwire.edits import Edits

    common = spec["containerEdits"]
    nodes = [*common["deviceNodes"], *spec["devices"][0]["containerEdits"]["deviceNodes"]]
    env = dict(e.split("=", 1) for e in common["env"])
    return Edits(env, nodes, common["mounts"], [], [], None)


def _rootfs_state(rootfs: Path) -> tuple[bytes, set[Path]]:
    return (rootfs / "etc/ld.so.cache").read_bytes(), set(rootfs.rglob("*"))


def _runc(bundle: Any, pristine: tuple[bytes, set[Path]]) -> float:
    cache, files = pristine
    rootfs = bundle.path / "rootfs"
    for path in set(rootfs.rglob("*")) - files:  # the hook's links, runc's mount points
        if path.is_symlink():
            path.unlink()
    (rootfs / "etc/ld.so.cache").write_bytes(cache)
    cid = f"gpuwire-bench-{uuid.uuid4().hex[:12]}"
    start = time.perf_counter()
    out = subprocess.run(["runc", "run", "--bundle", str(bundle.path), cid],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
    elapsed = time.perf_counter() - start
    subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"runc: {out.stderr.strip()}")
    return elapsed


def podman_half(runs: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as name, Podman.create() as podman:
        tmp = Path(name)
        lab = Lab(tmp / "lab")
        podman.load(write_image(tmp / "image.tar"))
        with hooks(tmp, python) as case_hooks:
            ids, paths = write_specs(lab, HOST_CDI, case_hooks)
            try:
                samples = rounds(list(ids), runs, lambda case: _podman(podman, ids[case]))
            finally:
                for path in paths:
                    path.unlink(missing_ok=True)
    print_report(f"podman start --attach, true, 1 GPU by CDI, {runs} runs each", list(ids), samples)


def _podman(podman: Podman, device: str) -> float:
    create = podman.command(
        "create", "--network", "none", *ULIMITS, "--cgroup-parent", f"/{podman.cgroup_parent}",
        "--device", device, NAME, "true",
    )  # fmt: skip
    made = subprocess.run(create, capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise SystemExit(f"podman create with {device}: {made.stderr}")
    cid = made.stdout.strip()
    start = time.perf_counter()
    out = subprocess.run(podman.command("start", "--attach", cid), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    subprocess.run(podman.command("rm", "--force", cid), capture_output=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"podman start with {device}: {out.stderr}")
    return elapsed


def cri_half(generation: containerds.Generation, runs: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as name, Containerd.create(
        cri=True, generation=generation
    ) as containerd:  # fmt: skip
        tmp = Path(name)
        lab = Lab(tmp / "lab")
        with hooks(tmp, python) as case_hooks:
            served = f"{tmp}/served/{launcher.RUNTIME}"
            configure = ["containerd", "configure", "--config", str(containerd.config), "--cdi",
                         "--runtime-path", served]  # fmt: skip
            subprocess.run([str(CONSOLE_SCRIPTS / "gpuwire"), *configure], check=True,
                           capture_output=True)  # fmt: skip
            pods = [_pod(), _pod()]
            uids = tuple(p["metadata"]["uid"] for p in pods)
            ids, _ = write_specs(lab, containerd.home / "cdi", case_hooks, uids)
            handled = {SHIM_BASE: ids[BASE], SHIM: ids[HOOK]}  # the same specs
            containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
            containerd.import_image(write_image(tmp / "image.tar"), CRI_NAMESPACE)
            with containerd.kuberuntime() as kubelet:
                runc, shim = kubelet.run_sandbox(pods[0], ""), kubelet.run_sandbox(pods[1], HANDLER)

                def start(case: str) -> float:
                    if case in handled:  # RuntimeClass gpuwire
                        return _cri_start(kubelet, shim, pods[1], handled[case])
                    return _cri_start(kubelet, runc, pods[0], ids[case])

                samples = rounds([*ids, *handled], runs, start)
    title = f"containerd {generation.version} over CRI, 1 GPU by CDI, {runs} runs each"
    print_report(f"{title} (StartContainer)", list(ids), samples)
    print_report(f"{title}, RuntimeClass gpuwire", list(handled), samples)


def _pod() -> dict[str, Any]:
    container = {"name": "bench", "image": NAME, "command": ["true"]}
    meta = {"name": f"bench-{uuid.uuid4().hex[:8]}", "namespace": "bench",
            "uid": str(uuid.uuid4())}  # fmt: skip
    return {"metadata": meta, "spec": {"containers": [container]}}


def _cri_start(kubelet: KubeRuntime, sandbox: Sandbox, pod: dict[str, Any], device: str) -> float:
    cid = kubelet.create(sandbox, pod, pod["spec"]["containers"][0], claims=[device])
    start = time.perf_counter()
    kubelet.start(cid)
    elapsed = time.perf_counter() - start
    status = kubelet.exited(cid)
    if status.exit_code != 0:
        raise SystemExit(f"containerd with {device}: {kubelet.logs(cid)}")
    kubelet.remove(cid)
    return elapsed


ON_TMPFS = "GPUWIRE_BENCH_ON_TMPFS"


def on_tmpfs() -> None:
    """Run again in a mount namespace of our own whose /tmp is a tmpfs, where the engines,
    the bundles and the resident keep everything (the host's /tmp is left alone).

    On ext4 without a journal (the bench machine's disk) the kernel skips every inode
    freed in the last minute when it allocates one (fs/ext4/ialloc.c, `recently_deleted`):
    after the engines have deleted the containers before, each link and file the hook
    makes can take ~0.2 ms instead of ~10 µs. A tmpfs shows the hook's own cost; the
    default, the disk's as well."""
    code = 'mount -t tmpfs -o size=8g,mode=1777 gpuwire-bench /tmp && exec "$@"'
    argv = [sys.executable, "-m", "bench.cdi", *sys.argv[1:]]
    os.environ[ON_TMPFS] = "1"
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "sh", "-c", code,
                          "sh", *argv])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--only", choices=("runc", "podman", "containerd"))
    parser.add_argument("--python", default=sys.executable, help="interpreter of the launchers")
    parser.add_argument("--tmpfs", action="store_true", help="containers' storage on a tmpfs")
    args = parser.parse_args()
    missing = [t for t in ("runc", "podman", "containerd") if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        raise SystemExit(f"needs root, runc, podman and containerd (missing: {missing})")
    if args.tmpfs and os.environ.get(ON_TMPFS) != "1":
        on_tmpfs()
    if args.only in (None, "runc"):
        runc_half(args.runs, args.python)
    if args.only in (None, "podman"):
        podman_half(args.runs, args.python)
    if args.only in (None, "containerd"):
        found = containerds.generations()
        for generation in (g for g in found.values() if g.cdi):
            cri_half(generation, args.runs, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
