"""The admission server: starlette routes around `review.answer` and the current sources.

`POST /mutate` answers AdmissionReviews; `/healthz` says the process serves, `/readyz` that
it can answer correctly (fleet, pools and templates synced, a grant key loaded), `/metrics`
is Prometheus. An admission whose patch names ResourceClaimTemplates has them made to exist
first (not on a dry run), in a worker thread and within `template_seconds`, so the event loop
keeps answering others; a template that cannot be made denies the pod, saying why. Templates
the watch shows as they are (a Deployment's every pod after the first) need no thread.
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

from gpuwire import logs
from webhook import review
from webhook.metrics import Metrics
from webhook.mutation import Denial, Outcome
from webhook.reload import Reloadable, Watched
from webhook.sources import Sources
from webhook.warned import kind_of

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
    template_seconds: float = 2.0,
) -> Starlette:
    watched: dict[str, Reloadable] = {"policy": sources.policy, "keys": sources.keys}
    if tls is not None:
        watched["tls"] = tls
    metrics = Metrics(sources, watched)

    async def templates_made(reviewed: review.Review, outcome: Outcome) -> Outcome:
        """The outcome once its templates exist, or the denial saying why they do not."""
        store = sources.templates
        if not outcome.templates or reviewed.dry_run or store is None:
            return outcome
        if store.made(outcome.templates):  # most admissions: a thread hop costs them ~ms
            return outcome
        try:
            made = asyncio.to_thread(store.ensure, outcome.templates, template_seconds)
            denial = await asyncio.wait_for(made, template_seconds + 0.5)
        except TimeoutError:
            names = ", ".join(t["metadata"]["name"] for t in outcome.templates)
            denial = Denial(503, f"ResourceClaimTemplate {names} not created within "
                                 f"{template_seconds:g}s; try again")  # fmt: skip
        return outcome if denial is None else Outcome(warnings=outcome.warnings, denial=denial)

    async def decide(body: bytes) -> tuple[int, dict[str, Any], str]:
        try:
            reviewed = review.parse(body)
        except review.BadReview as exc:
            log.info("invalid review (400): %s", exc)
            return 400, review.status(400, str(exc)), "invalid"
        outcome = await templates_made(reviewed, review.outcome_of(reviewed, sources.decide))
        said(reviewed, outcome)
        return 200, review.response(reviewed, outcome), review.label(outcome)

    def said(reviewed: review.Review, outcome: Outcome) -> None:
        """The decision in the log, once, and each warning, counted by its kind."""
        level, line, fields = review.decision(reviewed, outcome)
        log.log(level, "%s", line, extra={logs.FIELDS: fields})
        for warning in outcome.warnings:
            kind = kind_of(warning)
            metrics.warned(kind)
            log.warning("warning for %s/%s (uid %s): %s: %s", reviewed.namespace,
                        fields["pod"], reviewed.uid, kind, warning,
                        extra={logs.FIELDS: {**fields, "kind": kind}})  # fmt: skip

    async def mutate(request: Request) -> Response:
        started = time.perf_counter()
        body = await _body(request)
        if body is None:
            log.info("invalid review (413): body over %s bytes", MAX_BODY)
            reply = review.status(413, f"body over {MAX_BODY} bytes")
            status, outcome = 413, "invalid"
        else:
            status, reply, outcome = await decide(body)
        metrics.observe(outcome, time.perf_counter() - started)
        return _json(status, reply)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        problems = []
        if not sources.fleet.synced:
            problems.append("node inventory not synced yet")
        if not sources.pools.synced:
            problems.append("ResourceSlices not synced yet")
        if sources.templates is not None and not sources.templates.known.synced:
            problems.append("ResourceClaimTemplates not synced yet")
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
        for source in sources.watches:
            source.start()
        if sources.leader is not None:
            sources.leader.start()
        task = asyncio.create_task(refresh())
        try:
            yield
        finally:
            task.cancel()
            if sources.leader is not None:
                sources.leader.stop()
            for source in sources.watches:
                source.stop()

    routes = [
        Route("/mutate", mutate, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def run(app: Starlette, host: str, port: int, context: ssl.SSLContext, log_level: str) -> None:
    """Serve `app` over TLS with `context`, the live context certificates reload into.

    One event loop, no access log (per-request logging costs as much as the mutation; each
    admission's decision is logged instead). uvicorn is given no logging config of its own:
    its lines go through the one format `gpuwire.logs` set up.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    config.load()
    config.ssl = context
    uvicorn.Server(config).run()
