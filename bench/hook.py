"""Container start with and without GPU injection, side by side, on real runc and containerd.

    sudo .venv/bin/python -m bench.hook [--runs N] [--only runc|containerd] [--python P]

The image is busybox with the libraries of a typical GPU image (IMAGE_LIBRARIES of them in
/usr/lib/x86_64-linux-gnu) and the ld.so.cache its build made: what gpuwire reads and
extends on each GPU start (and what ldconfig scanned, before gpuwire wrote the cache).

runc: every case is `runc run` of that container running `true` on the simulated node,
timed from exec to exit (deletion untimed). Before each start the image's cache is put back
(untimed), so every GPU start writes it anew; the links and mount points the first start
made stay, as they did before gpuwire wrote the cache (on a fresh root each is one more
file made, ~0.1 ms each on this machine's disk; the containerd half makes them on every
start, in a fresh snapshot). Cases take turns, in a new random order each round, so that
drift on the machine hits them alike and what one start leaves for the kernel to finish
(namespaces torn down in the background) does not always land on the same next case. The
baseline is plain runc; the others add gpuwire:

- the prestart hook (`gpuwire-hook prestart` in the spec, as `base_runtime_spec` does),
  for a container that asks for no GPU and for one granted a GPU;
- the shim (`gpuwire-runtime run`, the shell launcher), likewise: a container that asks for
  no GPU never starts Python, a granted one starts it once (links and ld cache included);
- the same GPU start through pip's console script instead of the `-IS` launcher;
- the hook and the shim again, from launchers that hand their Python part to a resident
  gpuwire (runtime_hook.start.resident, on a private socket, started with the same Python)
  through gpuwire-call: what a node the installer set up runs;
- the floors of a Python design: a prestart hook that is `python -IS -c pass`, and a
  runtime that is `python -IS` exec'ing runc: what any Python hook or shim pays before
  doing anything (starting Python in front of runc also slows runc's own start here).

Goal: at most 15 ms added median for a GPU container on runc. What one call costs is
printed as well: `/bin/true`, the interpreter's own start (`python -IS -c pass`), and a
call the resident serves that does nothing. `--python` picks the interpreter the
launchers and the resident run (default: this one). It matters: a node's resident runs the
image's Python, Debian 12's /usr/bin/python3, which starts faster than a shared-library
build such as pyenv's.

containerd: a private containerd (testbed.containerd) starts the image through
containerd's runc shim, `ctr run` with runc as the baseline (the grant env present, nobody
reading it) and with the launcher of gpuwire-runtime as `--runc-binary` (containerd's
`BinaryName`), asking for no GPU and for one granted GPU (Python, and served by the
resident), and with the shim's floor (Python exec'ing runc) as `--runc-binary`. `start`
times `ctr run --detach` (create and start); `run` times `ctr run --rm` of `true` (also the
exit and the two deletes: every runtime call containerd makes for a container). Then the
same variants over CRI, as the kubelet starts a pod's container (testbed/kuberuntime.py):
each variant a runtime handler written by `gpuwire containerd configure` (runc: the
default), its pod's sandbox run once, and `start` timing CreateContainer + StartContainer in
it (what a kubelet waits for; the container's exit and its removal untimed).
Goal: at most 25 ms added median start through containerd.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import Summary, report, summarise, timed
from gpuwire.elfstub import shared_object
from gpuwire.grant import POD_ANNOTATION
from runtime_hook.setup import launcher
from runtime_hook.start import resident
from testbed.containerd import CRI_NAMESPACE, Container, Containerd
from testbed.image import NAME, layout_files, write_tar
from testbed.kuberuntime import KubeRuntime, Sandbox
from testbed.lab import ADMISSION, CONTAINER, NAMESPACE, Lab, cri_annotations, grant_for
from testbed.resident import Resident
from testbed.rootfs import Bundle, busybox_rootfs

CONSOLE_SCRIPTS = Path(sys.executable).parent
IMAGE_LIBRARIES = 150  # about what the ld.so.cache of a CUDA runtime image lists
FLOOR_SCRIPT = """\
#!{python} -IS
import os, sys
os.execv({runc!r}, ["runc", *sys.argv[1:]])
"""


def add_image_libraries(rootfs: Path) -> None:
    """IMAGE_LIBRARIES libraries with their SONAME links, and the cache `ldconfig -r` made."""
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    for i in range(IMAGE_LIBRARIES):
        soname = f"libimage{i}.so.{i % 7}"
        (libdir / f"{soname}.0.{i}").write_bytes(shared_object(soname))
        (libdir / soname).symlink_to(f"{soname}.0.{i}")
    subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)


def write_floor(path: Path, python: str) -> str:
    """A runtime that is Python exec'ing runc: the shim's floor."""
    path.write_text(FLOOR_SCRIPT.format(python=python, runc=shutil.which("runc")))
    path.chmod(0o755)
    return str(path)


class Case:
    """One way of starting the container: its bundle, runtime, and the pristine config.json
    and ld.so.cache that a start rewrites."""

    def __init__(self, name: str, bundle: Bundle, runtime: str) -> None:
        self.name = name
        self.bundle = bundle
        self.runtime = runtime
        self.config = (bundle.path / "config.json").read_text()
        self.cache = bundle.path / "rootfs/etc/ld.so.cache"
        self.image_cache = self.cache.read_bytes()
        self.seconds: list[float] = []

    def run_once(self) -> None:
        (self.bundle.path / "config.json").write_text(self.config)  # the shim edits it
        self.cache.write_bytes(self.image_cache)
        cid = f"gpuwire-bench-{uuid.uuid4().hex[:12]}"
        start = time.perf_counter()
        out = subprocess.run(
            [self.runtime, "run", "--bundle", str(self.bundle.path), cid],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        self.seconds.append(time.perf_counter() - start)
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
        if out.returncode != 0:
            raise SystemExit(f"{self.name}: {out.stderr.strip()}")


def make_cases(lab: Lab, libexec: str, served: str, python: str) -> list[Case]:
    hook = f"{libexec}/gpuwire-hook"
    shim = f"{libexec}/gpuwire-runtime"
    served_hook = f"{served}/gpuwire-hook"
    served_shim = f"{served}/gpuwire-runtime"
    floor = write_floor(Path(libexec) / "python-execs-runc", python)
    gpu = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}

    def bundle(
        name: str, env: dict[str, str], prestart: str | None = None, args: list[str] | None = None
    ) -> Bundle:
        made = Bundle.create(lab.root / name, ["true"], env, cri_annotations())
        add_image_libraries(made.path / "rootfs")
        if prestart:
            made.spec["hooks"] = {
                "prestart": [
                    {
                        "path": prestart,
                        "args": args or ["gpuwire-hook", "prestart"],
                        "env": [f"GPUWIRE_CONFIG={lab.config}"],
                    }
                ]
            }
            made.save()
        return made

    return [
        Case("runc (baseline)", bundle("plain", {}), "runc"),
        Case("prestart hook, no GPU", bundle("hook-void", {}, hook), "runc"),
        Case("prestart hook, 1 GPU", bundle("hook-gpu", gpu, hook), "runc"),
        Case("shim, no GPU", bundle("shim-void", {}), shim),
        Case("shim, 1 GPU", bundle("shim-gpu", gpu), shim),
        Case("resident: hook, no GPU", bundle("r-hook-void", {}, served_hook), "runc"),
        Case("resident: hook, 1 GPU", bundle("r-hook-gpu", gpu, served_hook), "runc"),
        Case("resident: shim, 1 GPU", bundle("r-shim-gpu", gpu), served_shim),
        Case(
            "hook via console script, 1 GPU",
            bundle("script-gpu", gpu, str(CONSOLE_SCRIPTS / "gpuwire-hook")),
            "runc",
        ),
        Case(
            "floor: hook python -IS pass",
            bundle("floor-hook", {}, python, [python, "-IS", "-c", "pass"]),
            "runc",
        ),
        Case("floor: python execs runc", bundle("floor-shim", {}), floor),
    ]


def timed_command(name: str, argv: list[str], runs: int) -> Summary:
    seconds = timed(
        lambda: subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True), runs
    )
    return summarise(name, seconds)


def runc_half(runs: int, python: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuwire-bench-") as tmp:
        lab = Lab(Path(tmp) / "lab")
        os.environ["GPUWIRE_CONFIG"] = str(lab.config)  # the shim reads it
        socket = f"{tmp}/resident.sock"
        launcher.install(f"{tmp}/libexec", python, socket=None)
        launcher.install(f"{tmp}/served", python, socket=socket)
        cases = make_cases(lab, f"{tmp}/libexec", f"{tmp}/served", python)
        with Resident(socket, python):
            for case in cases:  # warm caches (page cache, the config cache) untimed
                case.run_once()
                case.seconds.clear()
            order = random.Random(0)  # the same orders on every run of the bench
            for _ in range(runs):
                for case in order.sample(cases, len(cases)):
                    case.run_once()
            # a call the resident serves that does nothing (gpuwire-hook's usage error)
            call = [f"{tmp}/served/{launcher.CALL}", socket, resident.token(), "hook", "2"]
            served = [*call, "/bin/false", "gpuwire-hook", "no-such-subcommand"]
            calls = [
                timed_command("/bin/true", ["/bin/true"], runs),
                timed_command("python -IS -c pass", [python, "-IS", "-c", "pass"], runs),
                timed_command("a served call doing nothing", served, runs),
            ]
    base, *others = (summarise(c.name, c.seconds) for c in cases)
    print(report(f"container start on runc, {runs} runs each", base, others))
    print()
    print(added(base, others))
    print()
    print(f"what a call costs ({python}, from this Python, {runs} runs each)")
    print("\n".join(f"{c.name:32} {c.p50_ms:7.1f} ms" for c in calls))


def added(base: Summary, others: list[Summary]) -> str:
    return "\n".join(
        f"{s.name:32} +{s.p50_ms - base.p50_ms:6.1f} ms median over {base.name}" for s in others
    )


def _timed(containerd: Containerd, container: Container, cid: str, *, detach: bool) -> float:
    start = time.perf_counter()
    out = containerd.ctr(*containerd.run_argv(container, cid, detach=detach), check=False)
    elapsed = time.perf_counter() - start
    if detach:
        containerd.remove(cid)
    if out.returncode != 0:
        raise RuntimeError(f"{cid}: {out.stderr.strip()}")
    return elapsed


def write_image(dest: Path) -> Path:
    """The image (busybox, IMAGE_LIBRARIES libraries, their cache) as an OCI layout tar."""
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = busybox_rootfs(Path(tmp) / "rootfs")
        add_image_libraries(rootfs)
        files = layout_files(rootfs)
    return write_tar(dest, files)


def containerd_half(runs: int, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp) / "lab")
        launcher.install(f"{tmp}/libexec", python, socket=None)
        launcher.install(f"{tmp}/served", python, socket=f"{tmp}/resident.sock")
        shim = f"{tmp}/libexec/gpuwire-runtime"
        served = f"{tmp}/served/gpuwire-runtime"
        floor = write_floor(Path(tmp) / "libexec/python-execs-runc", python)
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
            "resident: gpuwire-runtime, 1 GPU": Container(
                NAME, ("true",), runc_binary=served, annotations=annotations, env=granted
            ),
            "floor: python execs runc": Container(
                NAME, ("true",), runc_binary=floor, annotations=annotations
            ),
        }
        with Containerd.create() as containerd, Resident(f"{tmp}/resident.sock", python):
            containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
            containerd.import_image(write_image(lab.root / "image.tar"))
            samples: dict[tuple[str, bool], list[float]] = {}
            kinds = [(name, detach) for name in variants for detach in (True, False)]
            order = random.Random(0)
            for n in range(runs + 1):  # round 0 warms caches and is not counted
                for name, detach in order.sample(kinds, len(kinds)) if n else kinds:
                    cid = f"bench-{uuid.uuid4().hex[:12]}"
                    elapsed = _timed(containerd, variants[name], cid, detach=detach)
                    if n:
                        samples.setdefault((name, detach), []).append(elapsed)
    for detach, what in ((True, "start (ctr run --detach)"), (False, "run (ctr run --rm true)")):
        base, *others = (summarise(name, samples[(name, detach)]) for name in variants)
        print(report(f"containerd, {what}, {runs} runs each", base, others))
        print()
        print(added(base, others))
        print()


def cri_half(runs: int, python: str) -> None:
    """The containerd variants over CRI: a handler each, configured as an admin does."""
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp) / "lab")
        launcher.install(f"{tmp}/libexec", python, socket=None)
        launcher.install(f"{tmp}/served", python, socket=f"{tmp}/resident.sock")
        floor = write_floor(Path(tmp) / "libexec/python-execs-runc", python)
        granted = {"NVIDIA_VISIBLE_DEVICES": "1", "GPUWIRE_GRANT": grant_for(lab.keys, "1")}
        handlers = {"gpuwire": f"{tmp}/libexec/gpuwire-runtime",
                    "gpuwire-served": f"{tmp}/served/gpuwire-runtime", "floor": floor}  # fmt: skip
        variants = {  # name → (handler, env)
            "runc": ("", granted),
            "gpuwire-runtime, no GPU": ("gpuwire", {}),
            "gpuwire-runtime, 1 GPU": ("gpuwire", granted),
            "resident: gpuwire-runtime, 1 GPU": ("gpuwire-served", granted),
            "floor: python execs runc": ("floor", {}),
        }
        with Containerd.create(cri=True) as containerd, Resident(f"{tmp}/resident.sock", python):
            for name, path in handlers.items():
                configure = ["containerd", "configure", "--config", str(containerd.config)]
                subprocess.run([str(CONSOLE_SCRIPTS / "gpuwire"), *configure,
                                "--runtime-name", name, "--runtime-path", path],
                               check=True, capture_output=True)  # fmt: skip
            containerd.start(env={"GPUWIRE_CONFIG": str(lab.config)})
            containerd.import_image(write_image(lab.root / "image.tar"), CRI_NAMESPACE)
            with containerd.kuberuntime() as kubelet:
                pods = {name: bench_pod(env) for name, (_, env) in variants.items()}
                sandboxes = {n: kubelet.run_sandbox(pods[n], h) for n, (h, _) in variants.items()}
                samples: dict[str, list[float]] = {}
                order = random.Random(0)
                for n in range(runs + 1):  # round 0 warms caches and is not counted
                    for name in order.sample(list(variants), len(variants)) if n else variants:
                        elapsed = _cri_start(kubelet, sandboxes[name], pods[name])
                        if n:
                            samples.setdefault(name, []).append(elapsed)
        given = sum(": GPUs 1 (" in line for line in lab.log_lines())
        if given != 2 * (runs + 1):  # each start of the two granted variants
            raise SystemExit(f"over CRI, {given} GPU starts for {2 * (runs + 1)} granted ones")
    base, *others = (summarise(name, samples[name]) for name in variants)
    what = "start (CreateContainer + StartContainer)"
    print(report(f"containerd over CRI, {what}, {runs} runs each", base, others))
    print()
    print(added(base, others))
    print()


def bench_pod(env: dict[str, str]) -> dict[str, Any]:
    """A pod whose one container (in the lab's namespace, under the lab's container name,
    of the admission the grant names) runs `true`."""
    container = {"name": CONTAINER, "image": NAME, "command": ["true"],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}  # fmt: skip
    meta = {"name": f"bench-{uuid.uuid4().hex[:8]}", "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()), "annotations": {POD_ANNOTATION: ADMISSION}}  # fmt: skip
    return {"metadata": meta, "spec": {"containers": [container]}}


def _cri_start(kubelet: KubeRuntime, sandbox: Sandbox, pod: dict[str, Any]) -> float:
    start = time.perf_counter()
    cid = kubelet.create(sandbox, pod, pod["spec"]["containers"][0])
    kubelet.start(cid)
    elapsed = time.perf_counter() - start
    kubelet.exited(cid)  # `true`: stopping it would race its own exit
    kubelet.remove(cid)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--only", choices=("runc", "containerd"))
    parser.add_argument("--python", default=sys.executable, help="interpreter of the launchers")
    args = parser.parse_args()
    tools = {"runc": ("runc", "ldconfig"), "containerd": ("runc", "containerd", "ctr", "ldconfig")}[
        args.only or "containerd"
    ]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        raise SystemExit(f"needs root and {', '.join(tools)} (missing: {', '.join(missing)})")
    if args.only != "containerd":
        runc_half(args.runs, args.python)
        print()
    if args.only != "runc":
        containerd_half(args.runs, args.python)
        cri_half(args.runs, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
