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


class TlsFileError(ValueError):
    """A certificate or key file that is missing, unreadable, or not a matching PEM pair."""


def _load(context: ssl.SSLContext, cert: str | Path, key: str | Path) -> None:
    """The pair into `context`; TlsFileError naming the file and what is wrong with it
    (ssl's own errors name neither: `[Errno 2] No such file or directory`, `PEM lib`)."""
    for what, path in (("certificate", cert), ("private key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TlsFileError(f"TLS {what} {path}: {exc.strerror}") from None
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TlsFileError(
            f"TLS certificate {cert} and key {key} are not a PEM certificate (chain) and its "
            f"private key: {exc.reason or exc}"
        ) from None


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, cert, key)
    return context


def reloading(context: ssl.SSLContext, cert: str | Path, key: str | Path) -> Watched[None]:
    """Keeps `context` serving the pair in `cert`/`key` as they are rotated."""

    def load() -> None:
        server_context(cert, key)
        _load(context, cert, key)

    return Watched("TLS certificate", [Path(cert), Path(key)], load)
