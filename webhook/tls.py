"""The serving certificate, reloaded into the live TLS context when its files change.

`certs ensure` (or cert-manager) renews the Secret; the kubelet updates the mounted files.
Loading the new pair into the same `ssl.SSLContext` makes every new handshake use it with no
restart and no dropped connection. A half-written pair (new certificate, old key) is tried in
a scratch context first, so the live one never holds a mismatched pair.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from webhook.reload import Watched


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def reloading(context: ssl.SSLContext, cert: str | Path, key: str | Path) -> Watched[None]:
    """Keeps `context` serving the pair in `cert`/`key` as they are rotated."""

    def load() -> None:
        server_context(cert, key)
        context.load_cert_chain(cert, key)

    return Watched("TLS certificate", [Path(cert), Path(key)], load)
