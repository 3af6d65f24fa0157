"""The cluster's grant key (see `gpuwire.grant`): made once at install unless the admin brings one.

A key is never replaced here: nodes verify grants with the keys they hold, so rotating means
adding a newer-named key and letting every node receive it (docs/install.md says how).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import secrets

from certs.cluster import Cluster, Conflict, Json
from certs.reconcile import MAX_ROUNDS, ReconcileError

log = logging.getLogger("gpuwire.certs")

LABELS = {"app.kubernetes.io/name": "gpuwire", "app.kubernetes.io/component": "grant-keys"}


def key_id(now: dt.datetime) -> str:
    """Names sort by time, so the newest key is the one that signs."""
    return f"key-{now:%Y%m%d-%H%M%S}"


def ensure_grant_key(cluster: Cluster, namespace: str, name: str, now: dt.datetime) -> str | None:
    """Add a random key to Secret `namespace/name` if it holds none; returns the new key's id."""
    for _ in range(MAX_ROUNDS):
        secret = cluster.read_secret(namespace, name)
        if secret is not None and _has_key(secret):
            return None
        body = secret or {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
        }
        new_id = key_id(now)
        body["data"] = {
            **(body.get("data") or {}),
            new_id: base64.b64encode(secrets.token_hex(32).encode()).decode(),
        }
        try:
            cluster.write_secret(namespace, body)
        except Conflict:
            continue
        log.info("secret %s/%s: new grant key %s", namespace, name, new_id)
        return new_id
    raise ReconcileError(f"Secret {namespace}/{name} did not settle after {MAX_ROUNDS} rounds")


def _has_key(secret: Json) -> bool:
    return any(base64.b64decode(v).strip() for v in (secret.get("data") or {}).values())
