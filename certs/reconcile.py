"""Keep the webhook's TLS Secret and the caBundle of its configuration right, from any replica.

Every write is conditional on the resourceVersion that was read (create fails with
AlreadyExists, update with Conflict), and a lost race re-reads and decides again, so replicas
running at once converge on one certificate instead of renewing twice.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509

from certs import pki, rotation
from certs.cluster import Cluster, Conflict, Json

log = logging.getLogger("gpuwire.certs")

SECRET_TYPE = "kubernetes.io/tls"  # noqa: S105 (a type name, not a password)
LABELS = {"app.kubernetes.io/name": "gpuwire", "app.kubernetes.io/managed-by": "gpuwire-certs"}
# Each round makes at most one write; a rollover takes three. More means another writer
# keeps changing the objects under us, which is worth an error rather than a loop.
MAX_ROUNDS = 12


class ReconcileError(RuntimeError):
    """The cluster is not in a state `ensure` can fix by itself (says what and where)."""


@dataclass(frozen=True)
class Target:
    namespace: str
    service: str
    secret: str
    webhook_config: str


def reconcile(
    cluster: Cluster, target: Target, settings: rotation.Settings, now: dt.datetime
) -> dict[str, bytes]:
    """Make the Secret and the caBundle right; returns the Secret's data as it ends up."""
    for _ in range(MAX_ROUNDS):
        config = cluster.read_webhook_config(target.webhook_config)
        if config is None:
            raise ReconcileError(
                f"MutatingWebhookConfiguration {target.webhook_config!r} not found "
                "(apply the manifests first; this command only sets its caBundle)"
            )
        webhooks = _served_by(config, target)
        secret = cluster.read_secret(target.namespace, target.secret)
        data = _secret_data(secret, target)
        material = rotation.Material.parse(data)
        change = rotation.next_change(material, _published(webhooks), settings, now)
        try:
            if change is not None:
                cluster.write_secret(target.namespace, _secret_body(secret, target, data, change))
                log.info(
                    "secret %s/%s: %s", target.namespace, target.secret, "; ".join(change.reasons)
                )
                continue
            bundle = base64.b64encode(material.bundle()).decode()
            stale = [w for w in webhooks if w.get("clientConfig", {}).get("caBundle") != bundle]
            if not stale:
                return data
            for webhook in stale:
                webhook.setdefault("clientConfig", {})["caBundle"] = bundle
            cluster.replace_webhook_config(config)
            log.info(
                "webhook configuration %s: caBundle of %s set to %d CA(s)",
                target.webhook_config,
                ", ".join(w["name"] for w in stale),
                len(material.trust),
            )
        except Conflict:
            log.info("lost a race with another writer; reading again")
    raise ReconcileError(
        f"Secret {target.namespace}/{target.secret} and MutatingWebhookConfiguration "
        f"{target.webhook_config!r} did not settle after {MAX_ROUNDS} rounds: "
        "another writer keeps changing them"
    )


def _served_by(config: Json, target: Target) -> list[Json]:
    """The configuration's webhooks that call our Service (others are not ours to touch)."""
    ours = [
        w
        for w in config.get("webhooks") or []
        if (w.get("clientConfig", {}).get("service") or {}).get("name") == target.service
        and w["clientConfig"]["service"].get("namespace") == target.namespace
    ]
    if not ours:
        raise ReconcileError(
            f"MutatingWebhookConfiguration {target.webhook_config!r} has no webhook calling "
            f"service {target.namespace}/{target.service} (check --service and --namespace)"
        )
    return ours


def _published(webhooks: list[Json]) -> list[x509.Certificate]:
    """The CAs every one of our webhooks trusts now (an unreadable caBundle trusts none)."""
    bundles = []
    for webhook in webhooks:
        try:
            pem = base64.b64decode(webhook.get("clientConfig", {}).get("caBundle") or "")
            bundles.append(pki.load_certs(pem, "caBundle") if pem else [])
        except (ValueError, pki.PKIError):
            bundles.append([])
    return [c for c in bundles[0] if all(c in b for b in bundles[1:])]


def _secret_data(secret: Json | None, target: Target) -> dict[str, bytes]:
    if secret is None:
        return {}
    if secret.get("type") != SECRET_TYPE:
        raise ReconcileError(
            f"Secret {target.namespace}/{target.secret} has type {secret.get('type')!r}, "
            f"not {SECRET_TYPE!r}; the type cannot change: delete it or choose another --secret"
        )
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _secret_body(
    secret: Json | None, target: Target, data: Mapping[str, bytes], change: rotation.Change
) -> Json:
    body: Json = secret or {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": {"name": target.secret, "namespace": target.namespace, "labels": LABELS},
    }
    # A kubernetes.io/tls Secret must have both entries, even while the serving pair waits
    # for its CA to be published.
    merged = {pki.CERT_FILE: b"", pki.KEY_FILE: b"", **data, **change.updates}
    body["data"] = {k: base64.b64encode(v).decode() for k, v in merged.items()}
    return body
