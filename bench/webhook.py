"""Admissions per second and latency of the webhook over TLS, against the framework's ceiling.

Two servers run the same uvicorn configuration with the same TLS context
(`webhook.server.run`): `gpuwire webhook serve` with the example policy and cluster, and a
bare starlette endpoint that reads the body and returns the webhook's own AdmissionReview
answer, canned (the ceiling: everything but the webhook's work). A closed-loop load generator
keeps 16 keep-alive TLS connections busy with realistic pods (bench/deployment-pod.yaml: a
ReplicaSet's pod as the API server sends it, about 4.5 KB of JSON) in a mix of GPU requests
with limits and model selection, plugin-less pods, pods that ask for nothing and a denial.

How it is measured on a small shared machine: both servers are pinned to CPU 0 and the load
generator to CPU 1 (where there are two), so the client does not steal the server's core; the
two servers are measured alternately, several rounds, and each side's fastest round is
reported (other load only ever slows a round down). Each round also reports the CPU time per
request of server and client (from /proc): the server figure is the one least disturbed by
other load, and says which side was the bottleneck. Figures are ratios against the ceiling
measured in the same run.

    python -m bench.webhook [--requests 6000] [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.common import Summary, report, summarise
from certs import pki
from gpuwire import annotations as a
from testbed.webhook import WebhookProcess, serving
from webhook.review import request_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


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


def workload() -> list[bytes]:
    """AdmissionReview bodies (about 4 KB each): the mix the load generator cycles through."""
    bodies = []
    for i, (asked, gpus) in enumerate(MIX):
        pod = copy.deepcopy(POD)
        pod["metadata"]["annotations"].update(asked)
        if gpus is not None:
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
        bodies.append(json.dumps(request_for(pod, "ml-research", uid=f"bench-{i}")).encode())
    return bodies


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


@contextmanager
def servers(
    workdir: Path, bodies: list[bytes]
) -> Iterator[tuple[WebhookProcess, WebhookProcess, ssl.SSLContext]]:
    """The webhook, then the ceiling serving the webhook's answer to the first pod of the mix."""
    tls = pki.generate(workdir / "tls", ["localhost"])
    context = ssl.create_default_context(cafile=tls.ca)
    keys = workdir / "keys"
    keys.mkdir()
    (keys / "bench-1").write_text("bench-secret")
    cert = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    hook_args = [
        *cert, "--grant-key-dir", str(keys),
        "--policy", str(EXAMPLES / "policy.yaml"), "--nodes", str(EXAMPLES / "nodes.yaml"),
    ]  # fmt: skip
    with serving(hook_args) as hook:
        canned = workdir / "answer.json"
        canned.write_bytes(asyncio.run(_answer(hook.url, context, bodies[0])))
        bare = (sys.executable, "-m", "bench.webhook", "bare", "--host", "127.0.0.1")
        with serving([*cert, "--canned", str(canned)], command=bare) as ceiling:
            yield hook, ceiling, context


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


def bare(argv: list[str]) -> None:
    """The ceiling: same uvicorn and TLS setup, a canned answer, no webhook work."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from webhook import tls
    from webhook.server import run

    parser = argparse.ArgumentParser(prog="bench.webhook bare")
    for flag in ("--host", "--tls-cert", "--tls-key", "--canned"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    canned = Path(args.canned).read_bytes()

    async def mutate(request: Request) -> Response:
        await request.body()
        return Response(canned, media_type="application/json")

    app = Starlette(routes=[Route("/mutate", mutate, methods=["POST"])])
    run(app, args.host, args.port, tls.server_context(args.tls_cert, args.tls_key), "info")


def main() -> int:
    if sys.argv[1:2] == ["bare"]:
        bare(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(bench(args.requests, args.concurrency, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
