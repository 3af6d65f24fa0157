"""The ceiling `bench.webhook` measures the webhook against: the webhook's own uvicorn and TLS
setup (`webhook.server.run`, `webhook.tls`) answering a canned AdmissionReview, no webhook
work, and `/readyz` at once. Its own module, so that it imports what the webhook's server
imports and no more (not the bench's cluster, not the `kubernetes` client): its start and
memory are the floor of the webhook's.

    python -m bench.bare --host H --port P --tls-cert C --tls-key K --canned ANSWER.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpuwire import logs
from webhook import tls
from webhook.server import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.bare")
    for flag in ("--host", "--tls-cert", "--tls-key", "--canned"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logs.setup("bench-bare")  # uvicorn's lines as the webhook's: its "running on" is read
    canned = Path(args.canned).read_bytes()

    async def mutate(request: Request) -> Response:
        await request.body()
        return Response(canned, media_type="application/json")

    async def readyz(request: Request) -> Response:
        return Response(b"ok", media_type="text/plain")

    app = Starlette(routes=[Route("/mutate", mutate, methods=["POST"]), Route("/readyz", readyz)])
    run(app, args.host, args.port, tls.server_context(args.tls_cert, args.tls_key), "info")


if __name__ == "__main__":
    main()
