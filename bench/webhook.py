"""The webhook's admissions per second and latency over TLS against the framework's ceiling,
and the same webhook at 100, 1,000 and 10,000 GPU nodes.

Two servers run the same uvicorn configuration with the same TLS context
(`webhook.server.run`): `gpuwire webhook serve` with the example policy and cluster, and a
bare starlette endpoint that reads the body and returns the webhook's own AdmissionReview
answer, canned (bench/bare.py, the ceiling: everything but the webhook's work). A closed-loop
load generator keeps 16 keep-alive TLS connections busy with realistic pods
(bench/deployment-pod.yaml: a ReplicaSet's pod as the API server sends it, about 4.5 KB of
JSON) in a mix of GPU requests with limits and model selection, plugin-less pods, pods that
ask for nothing and a denial.

How it is measured on a small shared machine: both servers are pinned to CPU 0 and the load
generator to CPU 1 (where there are two), so the client does not steal the server's core; the
two servers are measured alternately, several rounds, and each side's fastest round is
reported (other load only ever slows a round down). Each round also reports the CPU time per
request of server and client (from /proc): the server figure is the one least disturbed by
other load, and says which side was the bottleneck. Figures are ratios against the ceiling
measured in the same run.

The node-count axis (`--sizes`) runs the webhook on a kube-apiserver stand-in holding that many
GPU nodes as a real cluster holds them (bench/cluster.py: ~21 KB of JSON a node), and each
node's ResourceSlice as gpuwire's DRA plugin publishes it (the webhook watching them and its
templates, as in the dra overlay), and prints, per size: the list floor (fetching every page of
what the webhook reads from the stand-in, and parsing it with orjson, in this process: what any
reader pays; the fetch alone is the stand-in's share), the time from spawning `gpuwire webhook
serve` to its first `/readyz` 200, against the bare server's start and that floor; VmHWM and
VmRSS from /proc/<pid>/status at that moment, against the bare server's; the slices' floor
likewise; admission p50/p99 (the same mix, 16 connections, the round of three with the lowest
p99; and the share the webhook's own latency histogram puts within 10 ms, free of what slows the
load generator, which shares this process with the stand-in) with the nodes quiet, and again
while they change as a cluster's do (each node's kubelet writes its status every 5 minutes,
`nodeStatusReportFrequency`; and one node's `gpuwire.io/holders` per second, a GPU pod starting
somewhere), with the webhook's CPU spent following those changes (no admissions, 5 s). The DRA
path: a mix of pods in a namespace the example policy sends the DRA way (DRA_MIX; each checked
to get its claim first), once their templates exist, quiet; and FIRSTS admissions one at a time
that each make a new template, against the same again (made: no API call). Then the same start
from a `--nodes` file (`kubectl get nodes -o json`).

    python -m bench.webhook [--requests 6000] [--concurrency 16] [--rounds 3]
                            [--sizes 100,1000,10000] [--scale-requests 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import http.client
import json
import os
import re
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench import cluster
from bench.common import Summary, report, summarise
from certs import pki
from gpuwire import annotations as a
from gpuwire import holders
from testbed.apiserver import ApiServer
from testbed.webhook import WebhookProcess, serving
from webhook.listwatch import LIST_METADATA, PAGE
from webhook.review import request_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
_CONTINUE = re.compile(rb'"continue":"([^"]*)"')


POD = yaml.safe_load((Path(__file__).with_name("deployment-pod.yaml")).read_text())
MIX: tuple[tuple[dict[str, str], int | None], ...] = (
    ({a.MODEL: "A100,H100", a.MEMORY_LIMIT: "40Gi"}, 1),
    ({a.MODEL: "H100", a.MEMORY_LIMIT: "25%", a.CORES_LIMIT: "25", a.LIMIT_PROFILE: "mps"}, 1),
    ({}, None),  # asks for nothing: void
    ({a.MODEL: "!T4", a.MIN_MEMORY: "40Gi"}, 2),
    ({}, None),
    ({a.COUNT: "all", a.CAPABILITIES: "compute,utility,video"}, None),
    ({a.UUID: "GPU-508d3ed8-9227-5b4a-b0e4-1a5370c5eb4e"}, None),
    ({a.COUNT: "two"}, None),  # denied
)


DRA_NAMESPACE = "ml-dra"  # examples/policy.yaml sends it the DRA way (allocation: dra)
DRA_MIX: tuple[tuple[dict[str, str], int | None], ...] = (
    ({a.MODEL: "A100,H100", a.MIN_MEMORY: "40Gi"}, 2),  # 2 GPUs, one NVLink island preferred
    ({a.MODEL: "H100", a.MEMORY_LIMIT: "30Gi"}, 1),  # a 30 GiB share of a shared GPU
    ({}, None),  # asks for nothing: void
    ({a.MODEL: "!T4", a.MIN_MEMORY: "40Gi"}, 1),
)


def workload(
    mix: tuple[tuple[dict[str, str], int | None], ...] = MIX, namespace: str = "ml-research"
) -> list[bytes]:
    """AdmissionReview bodies (about 4 KB each): the mix the load generator cycles through."""
    bodies = []
    for i, (asked, gpus) in enumerate(mix):
        pod = copy.deepcopy(POD)
        pod["metadata"]["annotations"].update(asked)
        if gpus is not None:
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
        bodies.append(json.dumps(request_for(pod, namespace, uid=f"bench-{i}")).encode())
    return bodies


def new_templates(count: int) -> list[bytes]:
    """`count` DRA asks each its own template (1 GPU of at least 41, 42, … GiB)."""
    mix = tuple(({a.MIN_MEMORY: f"{41 + i}Gi"}, 1) for i in range(count))
    return workload(mix, DRA_NAMESPACE)


def http_request(body: bytes) -> bytes:
    head = (
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    found = _LENGTH.search(head)
    body = await reader.readexactly(int(found.group(1)) if found else 0)
    return head, body


async def _connection(
    url: str, context: ssl.SSLContext, requests: list[bytes], count: int, out: list[float]
) -> None:
    host, port = url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=context, server_hostname="localhost"
    )
    try:
        for i in range(count):
            started = time.perf_counter()
            writer.write(requests[i % len(requests)])
            head, _ = await _read_response(reader)
            out.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:40]!r}")
    finally:
        writer.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Phase:
    summary: Summary
    server_us: float  # server CPU per request, microseconds
    client_us: float  # load generator CPU per request


def load(
    name: str,
    served: WebhookProcess,
    context: ssl.SSLContext,
    bodies: list[bytes],
    total: int,
    concurrency: int,
) -> Phase:
    """`total` requests over `concurrency` connections, cycling through `bodies`."""
    requests = [http_request(b) for b in bodies]
    latencies: list[float] = []
    per_connection = total // concurrency

    async def everyone() -> None:
        await asyncio.gather(
            *(
                _connection(
                    served.url, context, requests[i:] + requests[:i], per_connection, latencies
                )
                for i in range(concurrency)
            )
        )

    server_cpu, client_cpu = _cpu_seconds(served.pid), time.process_time()
    started = time.perf_counter()
    asyncio.run(everyone())
    elapsed = time.perf_counter() - started
    n = len(latencies)
    return Phase(
        summarise(name, latencies, elapsed),
        (_cpu_seconds(served.pid) - server_cpu) / n * 1e6,
        (time.process_time() - client_cpu) / n * 1e6,
    )


async def _answer(url: str, context: ssl.SSLContext, body: bytes) -> bytes:
    host, port = url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=context, server_hostname="localhost"
    )
    writer.write(http_request(body))
    _, answer = await _read_response(reader)
    writer.close()
    return answer


@dataclass(frozen=True)
class Setup:
    """What every server of a run is started with: one TLS pair, one grant key, the policy."""

    cert: list[str]  # --tls-cert, --tls-key
    hook: list[str]  # the webhook's arguments but where its nodes come from
    context: ssl.SSLContext  # the client's
    workdir: Path

    @classmethod
    def make(cls, workdir: Path) -> Setup:
        tls = pki.generate(workdir / "tls", ["localhost"])
        keys = workdir / "keys"
        keys.mkdir()
        (keys / "bench-1").write_text("bench-secret")
        cert = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
        hook = [*cert, "--grant-key-dir", str(keys), "--policy", str(EXAMPLES / "policy.yaml")]
        return cls(cert, hook, ssl.create_default_context(cafile=tls.ca), workdir)

    def bare(self, canned: bytes) -> tuple[list[str], tuple[str, ...]]:
        """The ceiling's arguments and command, answering `canned` to every review."""
        path = self.workdir / "answer.json"
        path.write_bytes(canned)
        command = (sys.executable, "-m", "bench.bare", "--host", "127.0.0.1")
        return [*self.cert, "--canned", str(path)], command


def canned_answer(setup: Setup, body: bytes) -> bytes:
    """The webhook's answer to `body` on the example cluster: what the ceiling answers."""
    with serving([*setup.hook, "--nodes", str(EXAMPLES / "nodes.yaml")]) as hook:
        return asyncio.run(_answer(hook.url, setup.context, body))


@contextmanager
def servers(
    workdir: Path, bodies: list[bytes]
) -> Iterator[tuple[WebhookProcess, WebhookProcess, ssl.SSLContext]]:
    """The webhook, then the ceiling serving the webhook's answer to the first pod of the mix."""
    setup = Setup.make(workdir)
    args, command = setup.bare(canned_answer(setup, bodies[0]))
    with (
        serving([*setup.hook, "--nodes", str(EXAMPLES / "nodes.yaml")]) as hook,
        serving(args, command=command) as ceiling,
    ):
        yield hook, ceiling, setup.context


def pin(pid: int, cpu: int) -> bool:
    if len(os.sched_getaffinity(0)) < 2:
        return False
    os.sched_setaffinity(pid, {cpu})
    return True


def _fastest(phases: list[Phase]) -> Phase:
    return max(phases, key=lambda p: p.summary.per_second or 0)


def bench(total: int, concurrency: int, rounds: int) -> str:
    """Ceiling and webhook measured alternately, `rounds` times each; each side's fastest
    round is reported (other load on a shared machine only ever slows a round down)."""
    bodies = workload()
    with (
        tempfile.TemporaryDirectory(prefix="gpuwire-bench-") as tmp,
        servers(Path(tmp), bodies) as (hook, ceiling, context),
    ):
        pinned = all([pin(hook.pid, 0), pin(ceiling.pid, 0), pin(0, 1)])
        for served in (ceiling, hook):  # warm up: imports, first TLS sessions, caches
            load("warm-up", served, context, bodies, 400, concurrency)
        bases: list[Phase] = []
        ourses: list[Phase] = []
        for _ in range(rounds):
            bases.append(
                load("bare starlette (ceiling)", ceiling, context, bodies, total, concurrency)
            )
            ourses.append(load("gpuwire webhook", hook, context, bodies, total, concurrency))
    base, ours = _fastest(bases), _fastest(ourses)
    ratio = (ours.summary.per_second or 0) / (base.summary.per_second or 1)
    title = f"admission over TLS, {concurrency} connections, {total} requests, best of {rounds}"
    lines = [
        report(title, base.summary, [ours.summary]),
        "",
        f"throughput: {ours.summary.per_second or 0:.0f}/s, ceiling "
        f"{base.summary.per_second or 0:.0f}/s: {ratio:.2f} of the ceiling (goal ≥ 0.60)",
        f"webhook p99: {ours.summary.p99_ms:.2f} ms (goal < 10 ms)",
        f"CPU per request (server / load generator): ceiling {base.server_us:.0f} / "
        f"{base.client_us:.0f} µs, webhook {ours.server_us:.0f} / {ours.client_us:.0f} µs; "
        f"server CPU ratio {base.server_us / ours.server_us:.2f}",
        f"servers pinned to CPU 0, load generator to CPU 1: {'yes' if pinned else 'no (one CPU)'}",
    ]
    return "\n".join(lines)


# The node-count axis.

STATUS_SECONDS = 300  # the kubelet's nodeStatusReportFrequency: a status write per node per 5 min


def memory_mib(pid: int) -> tuple[float, float]:
    """VmHWM and VmRSS of `pid` (/proc/<pid>/status), MiB."""
    found = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(found["VmHWM"].split()[0]) / 1024, int(found["VmRSS"].split()[0]) / 1024


async def _get(url: str, context: ssl.SSLContext, path: str) -> tuple[bytes, bytes]:
    host, port = url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(
        host, int(port), ssl=context, server_hostname="localhost"
    )
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    answer = await _read_response(reader)
    writer.close()
    return answer


_WITHIN = re.compile(rb'admission_duration_seconds_bucket\{le="0\.01"\} (\S+)')
_COUNT = re.compile(rb"admission_duration_seconds_count (\S+)")


def answered(hook: WebhookProcess, context: ssl.SSLContext) -> tuple[float, float]:
    """(admissions answered within 10 ms, all admissions) as the webhook's own histogram
    counts them: its handler's time, free of what slows the load generator down."""
    _, metrics = asyncio.run(_get(hook.url, context, "/metrics"))
    within, count = _WITHIN.search(metrics), _COUNT.search(metrics)
    return float(within.group(1)) if within else 0, float(count.group(1)) if count else 0


ROUNDS = 3  # each load phase's best round is reported: other load only ever slows one down


def _steadiest(phases: list[Phase]) -> Phase:
    return min(phases, key=lambda p: p.summary.p99_ms)


def served(
    hook: WebhookProcess, context: ssl.SSLContext, run: Callable[[], Phase]
) -> tuple[Phase, float]:
    """The round of `run` with the lowest p99 of ROUNDS, and the share of all their admissions
    the webhook answered within 10 ms."""
    within, count = answered(hook, context)
    phase = _steadiest([run() for _ in range(ROUNDS)])
    after_within, after_count = answered(hook, context)
    return phase, (after_within - within) / max(1.0, after_count - count)


@dataclass(frozen=True)
class Start:
    seconds: float  # from spawning the process to its first /readyz 200
    hwm_mib: float
    rss_mib: float


@contextmanager
def started(
    args: list[str], context: ssl.SSLContext, **kwargs: Any
) -> Iterator[tuple[WebhookProcess, Start]]:
    """A server spawned with `args`, once its /readyz answers 200, and what that took."""
    began = time.perf_counter()
    with serving(args, timeout=600, **kwargs) as served:
        while not asyncio.run(_get(served.url, context, "/readyz"))[0].startswith(b"HTTP/1.1 200"):
            time.sleep(0.01)
        seconds = time.perf_counter() - began
        yield served, Start(seconds, *memory_mib(served.pid))


@dataclass(frozen=True)
class Floor:
    fetch: float  # seconds to fetch every page: the stand-in's share, and the transport's
    parse: float  # seconds to parse them (orjson)
    size: int  # bytes


NODES = "/api/v1/nodes"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def list_floor(api: ApiServer, accept: str, limit: int, path: str = NODES) -> Floor:
    """What reading a list costs any reader: every page fetched, then parsed, here."""
    host, port = api.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port))
    token, bodies = "", []
    began = time.perf_counter()
    while True:
        query = f"limit={limit}&continue={token}" if limit else ""
        connection.request("GET", f"{path}?{query}", headers={"Accept": accept})
        bodies.append(connection.getresponse().read())
        found = _CONTINUE.search(bodies[-1], 0, 1024)  # the list's metadata comes first
        token = found.group(1).decode() if found else ""
        if not token:
            break
    fetched = time.perf_counter()
    for body in bodies:
        orjson.loads(body)
    connection.close()
    return Floor(fetched - began, time.perf_counter() - fetched, sum(map(len, bodies)))


class Churn:
    """Nodes changing as a cluster's do, from a thread: every node's status written once per
    STATUS_SECONDS (the Ready condition's heartbeat), and one node's `gpuwire.io/holders` per
    second. `rate` is the changes per second."""

    def __init__(self, api: ApiServer, objects: list[cluster.Obj]) -> None:
        self.api = api
        self.objects = objects
        self.rate = len(objects) / STATUS_SECONDS + 1
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Churn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _changed(self, i: int) -> cluster.Obj:
        node = self.objects[i % len(self.objects)]
        if i % round(self.rate) == 0:  # a GPU pod started there
            meta = node["metadata"]
            held = cluster.holding(node, [f"trainer-{i}-{k}" for k in range(cluster.GPUS // 2)])
            annotations = meta["annotations"] | {holders.ANNOTATION: held}
            return node | {"metadata": meta | {"annotations": annotations}}
        beat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [c | {"lastHeartbeatTime": beat} for c in node["status"]["conditions"]]
        return node | {"status": node["status"] | {"conditions": conditions}}

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self.api.put(self._changed(self.count))
            self.count += 1
            due += 1 / self.rate


def claimed(answer: bytes) -> bool:
    """Whether an admission gave the pod a ResourceClaim (the DRA path's patch)."""
    response = orjson.loads(answer)["response"]
    return response["allowed"] and b"/spec/resourceClaims" in base64.b64decode(
        response.get("patch", "")
    )


@dataclass(frozen=True)
class Row:
    nodes: int
    floor: Floor  # the metadata pages the webhook reads
    full: Floor  # the whole list of full objects, one answer
    slices: Floor  # gpuwire's ResourceSlices, in the pages the webhook reads
    start: Start
    quiet: Phase
    busy: Phase  # while the nodes change
    dra: Phase  # the DRA mix, its templates made
    first: Phase  # one at a time, each admission making its template
    again: Phase  # the same, made
    within: tuple[float, float, float]  # shares answered within 10 ms: quiet, busy, DRA
    changes: float  # per second
    following: float  # the webhook's CPU following them, in cores
    file: Start  # from a --nodes file instead


def _best(floors: list[Floor]) -> Floor:
    return min(floors, key=lambda f: f.fetch + f.parse)


FIRSTS = 20  # admissions that each make a template


def at_size(count: int, setup: Setup, bodies: list[bytes], total: int, concurrency: int) -> Row:
    """One size: the floors, the webhook's start against the stand-in (its Nodes and their
    ResourceSlices), admissions quiet (device plugin, then DRA), the first admissions of
    new templates, admissions while nodes change, the CPU of following them, then a start
    from a nodes file."""
    objects = cluster.nodes(count)
    dra_bodies = workload(DRA_MIX, DRA_NAMESPACE)
    with ApiServer() as api:
        namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                      for n in (DRA_NAMESPACE, "gpuwire-system")]  # fmt: skip
        for obj in [*namespaces, *objects, *cluster.slices(objects)]:
            api.put(obj)
        floor = _best([list_floor(api, LIST_METADATA, PAGE) for _ in range(3)])
        full = _best([list_floor(api, "application/json", 0) for _ in range(2)])
        slices = _best([list_floor(api, "application/json", PAGE, SLICES) for _ in range(2)])
        kubeconfig = api.write_kubeconfig(setup.workdir / f"kubeconfig-{count}")
        with started([*setup.hook, "--kubeconfig", str(kubeconfig)], setup.context) as (
            hook,
            start,
        ):
            pin(hook.pid, 0)
            for body, (_, gpus) in zip(dra_bodies, DRA_MIX, strict=True):
                answer = asyncio.run(_answer(hook.url, setup.context, body))
                if claimed(answer) != bool(gpus):
                    raise RuntimeError(f"DRA mix: not admitted as expected: {answer[:600]!r}")
            load("warm-up", hook, setup.context, bodies + dra_bodies, 400, concurrency)
            quiet, quiet_within = served(
                hook,
                setup.context,
                lambda: load(f"{count} nodes", hook, setup.context, bodies, total, concurrency),
            )
            dra, dra_within = served(
                hook,
                setup.context,
                lambda: load(f"{count}, DRA", hook, setup.context, dra_bodies, total, concurrency),
            )
            news = new_templates(FIRSTS)
            first = load("new template", hook, setup.context, news, FIRSTS, 1)
            again = load("template made", hook, setup.context, news, FIRSTS, 1)
            with Churn(api, objects) as churn:
                busy, busy_within = served(
                    hook,
                    setup.context,
                    lambda: load(
                        f"{count} nodes, changing", hook, setup.context, bodies, total, concurrency
                    ),
                )
                cpu, began = _cpu_seconds(hook.pid), time.perf_counter()
                time.sleep(5)
                following = (_cpu_seconds(hook.pid) - cpu) / (time.perf_counter() - began)
    listing = setup.workdir / f"nodes-{count}.json"  # kubectl get nodes -o json
    listing.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    with started([*setup.hook, "--nodes", str(listing)], setup.context) as (_, file):
        pass
    within = (quiet_within, busy_within, dra_within)
    return Row(count, floor, full, slices, start, quiet, busy, dra, first, again, within,
               churn.rate, following, file)  # fmt: skip


def scale(sizes: list[int], total: int, concurrency: int) -> str:
    """The curve: one column per size, each figure with its baseline from this run."""
    bodies = workload()
    with tempfile.TemporaryDirectory(prefix="gpuwire-bench-") as tmp:
        setup = Setup.make(Path(tmp))
        args, command = setup.bare(canned_answer(setup, bodies[0]))
        pin(0, 1)
        with started(args, setup.context, command=command) as (ceiling, bare):
            pin(ceiling.pid, 0)
            load("warm-up", ceiling, setup.context, bodies, 400, concurrency)
            rounds = range(ROUNDS)
            base = _steadiest(
                [
                    load("ceiling", ceiling, setup.context, bodies, total, concurrency)
                    for _ in rounds
                ]
            )
        rows = [at_size(n, setup, bodies, total, concurrency) for n in sizes]

    def line(label: str, cell: Any) -> str:
        return f"{label:44}" + "".join(f"{cell(r):>22}" for r in rows)

    def floor_ratio(r: Row) -> float:
        return r.start.seconds / (bare.seconds + r.floor.fetch + r.floor.parse)

    mb, last = 1e6, rows[-1]
    lines = [
        f"webhook at scale: GPU nodes of 8 GPUs, {last.full.size / last.nodes / 1e3:.0f} KB "
        f"of JSON a node ({last.floor.size / last.nodes / 1e3:.0f} KB metadata); "
        f"{total} admissions, {concurrency} connections",
        f"baseline, bare starlette: ready in {bare.seconds:.2f} s, VmHWM {bare.hwm_mib:.0f} MiB, "
        f"VmRSS {bare.rss_mib:.0f} MiB; p50 {base.summary.p50_ms:.2f} ms, "
        f"p99 {base.summary.p99_ms:.2f} ms",
        line("nodes", lambda r: f"{r.nodes:,}"),
        line(f"metadata pages of {PAGE}: MB, fetch s, parse s",
             lambda r: f"{r.floor.size / mb:.1f} {r.floor.fetch:.2f} {r.floor.parse:.2f}"),
        line("full list, one answer: MB, fetch s, parse s",
             lambda r: f"{r.full.size / mb:.1f} {r.full.fetch:.2f} {r.full.parse:.2f}"),
        line(f"ResourceSlices, pages of {PAGE}: MB, fetch s, parse s",
             lambda r: f"{r.slices.size / mb:.1f} {r.slices.fetch:.2f} {r.slices.parse:.2f}"),
        line("ready s (× bare start + metadata floor)",
             lambda r: f"{r.start.seconds:.2f} ({floor_ratio(r):.1f}×)"),
        line("VmHWM MiB at ready (× bare)",
             lambda r: f"{r.start.hwm_mib:.0f} ({r.start.hwm_mib / bare.hwm_mib:.1f}×)"),
        line("VmRSS MiB at ready (× bare)",
             lambda r: f"{r.start.rss_mib:.0f} ({r.start.rss_mib / bare.rss_mib:.1f}×)"),
        line("admission p50 / p99 ms, nodes quiet",
             lambda r: f"{r.quiet.summary.p50_ms:.2f} / {r.quiet.summary.p99_ms:.2f}"),
        line("p99 × the ceiling's",
             lambda r: f"{r.quiet.summary.p99_ms / base.summary.p99_ms:.2f}"),
        line("p50 / p99 ms, nodes changing",
             lambda r: f"{r.busy.summary.p50_ms:.2f} / {r.busy.summary.p99_ms:.2f}"),
        line("webhook's own: within 10 ms, quiet / changing",
             lambda r: f"{100 * r.within[0]:.1f} / {100 * r.within[1]:.1f} %"),
        line("DRA mix (templates made): p50 / p99 ms",
             lambda r: f"{r.dra.summary.p50_ms:.2f} / {r.dra.summary.p99_ms:.2f}"),
        line("DRA: webhook's own within 10 ms; CPU µs",
             lambda r: f"{100 * r.within[2]:.1f} %; {r.dra.server_us:.0f}"),
        line(f"DRA, {FIRSTS} one by one: new template / made, p50 ms",
             lambda r: f"{r.first.summary.p50_ms:.1f} / {r.again.summary.p50_ms:.1f}"),
        line("  the same, slowest ms",  # p99 of 20 is the slowest
             lambda r: f"{r.first.summary.p99_ms:.1f} / {r.again.summary.p99_ms:.1f}"),
        line("server CPU per admission µs, quiet / changing",
             lambda r: f"{r.quiet.server_us:.0f} / {r.busy.server_us:.0f}"),
        line("changes/s; CPU following them, % of a core",
             lambda r: f"{r.changes:.1f}; {100 * r.following:.1f} %"),
        line("from a --nodes file: ready s, VmHWM MiB",
             lambda r: f"{r.file.seconds:.2f}, {r.file.hwm_mib:.0f}"),
        "goals at 10,000 nodes: ready ≤ 5 s, ≤ 150 MiB, admission p99 ≤ 10 ms",
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="0: no throughput bench")
    parser.add_argument("--sizes", default="100,1000,10000", help="node counts; '': none")
    parser.add_argument("--scale-requests", type=int, default=4000)
    args = parser.parse_args()
    if args.rounds:
        print(bench(args.requests, args.concurrency, args.rounds), end="\n\n", flush=True)
    if args.sizes:
        sizes = [int(n) for n in args.sizes.split(",")]
        print(scale(sizes, args.scale_requests, args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
