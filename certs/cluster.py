"""The few Kubernetes API calls `certs` makes, as plain JSON with optimistic concurrency.

Objects are read and written as JSON, not the client's models, so that fields this client
version does not know survive an update. A 404 on read is None; a 409 on write (AlreadyExists
for a create, Conflict for a replace at a stale resourceVersion) is `Conflict`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

Json = dict[str, Any]


class Conflict(Exception):
    """Someone else wrote first: read again and decide again."""


class Cluster:
    """Secrets in a namespace and MutatingWebhookConfigurations."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.admission = client.AdmissionregistrationV1Api(api)

    def read_secret(self, namespace: str, name: str) -> Json | None:
        return _optional(
            lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False)
        )

    def write_secret(self, namespace: str, body: Json) -> None:
        """Create, or replace at the body's resourceVersion."""
        name, raw = body["metadata"]["name"], _raw(body)
        if body["metadata"].get("resourceVersion"):
            _conditional(lambda: self.core.replace_namespaced_secret(name, namespace, raw))
        else:
            _conditional(lambda: self.core.create_namespaced_secret(namespace, raw))

    def read_webhook_config(self, name: str) -> Json | None:
        return _optional(
            lambda: self.admission.read_mutating_webhook_configuration(name, _preload_content=False)
        )

    def replace_webhook_config(self, body: Json) -> None:
        name, raw = body["metadata"]["name"], _raw(body)
        _conditional(lambda: self.admission.replace_mutating_webhook_configuration(name, raw))


def _raw(body: Json) -> Any:
    """The client's typed signatures want models; it sends a dict exactly as it is."""
    return body


def _optional(call: Callable[[], Any]) -> Json | None:
    try:
        response = call()
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    result: Json = json.loads(response.data)
    return result


def _conditional(call: Callable[[], object]) -> None:
    try:
        call()
    except client.ApiException as exc:
        if exc.status == 409:
            raise Conflict from exc
        raise
