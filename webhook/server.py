"""The admission server: starlette routes around `review.answer` and the current sources.

`POST /mutate` answers AdmissionReviews; `/healthz` says the process serves, `/readyz` that
it can answer correctly (fleet synced, a grant key loaded), `/metrics` is Prometheus.
Bodies are capped at MAX_BODY: the API server caps a request at 3 MiB, and a CREATE review
holds one object, so anything larger is not a review and gets 413 without being read whole.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from webhook import review
from webhook.metrics import Metrics
from webhook.reload import Reloadable, Watched
from webhook.sources import Sources

log = logging.getLogger(__name__)

MAX_BODY = 4 << 20


async def _body(request: Request) -> bytes | None:
    """The request body, or None as soon as it is known to exceed MAX_BODY."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _json(status: int, body: object) -> Response:
    return Response(review.encode(body), status, media_type="application/json")


def create_app(
    sources: Sources,
    tls: Watched[None] | None = None,
    reload_seconds: float = 1.0,
) -> Starlette:
    watched: dict[str, Reloadable] = {"policy": sources.policy, "keys": sources.keys}
    if tls is not None:
        watched["tls"] = tls
    metrics = Metrics(sources, watched)

    async def mutate(request: Request) -> Response:
        started = time.perf_counter()
        body = await _body(request)
        if body is None:
            reply = review.status(413, f"body over {MAX_BODY} bytes")
            status, outcome = 413, "invalid"
        else:
            status, reply, outcome = review.answer(body, sources.decide)
        if outcome in ("denied", "invalid"):
            why: dict[str, Any] = reply["response"]["status"] if "response" in reply else reply
            log.info("%s (%s): %s", outcome, why.get("code"), why.get("message"))
        metrics.observe(outcome, time.perf_counter() - started)
        return _json(status, reply)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        problems = []
        if not sources.fleet.synced:
            problems.append("node inventory not synced yet")
        if not sources.keys.value.keys:
            problems.append("no grant key loaded")
        return PlainTextResponse("\n".join(problems) or "ok", 503 if problems else 200)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def refresh() -> None:
        while True:
            await asyncio.sleep(reload_seconds)
            sources.refresh()
            if tls is not None:
                tls.refresh()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sources.fleet.start()
        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            sources.fleet.stop()

    routes = [
        Route("/mutate", mutate, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def run(app: Starlette, host: str, port: int, context: ssl.SSLContext, log_level: str) -> None:
    """Serve `app` over TLS with `context`, the live context certificates reload into.

    One event loop, no access log (per-request logging costs as much as the mutation).
    """
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on"
    )
    config.load()
    config.ssl = context
    uvicorn.Server(config).run()
