"""The API server stand-in's admission chain: service account and RuntimeClass admission, a
mutating webhook called over TLS through its Service, a ValidatingAdmissionPolicy."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from certs import pki
from testbed.admission import TOKEN_DIR
from testbed.apiserver import ApiServer

Obj = dict[str, Any]
NS = "team"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(secure=True) as server:
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield server


def pod(name: str = "p", **spec: Any) -> Obj:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i"}], **spec}}  # fmt: skip


def create(api: ApiServer, body: Obj) -> Obj:
    with api.client() as admin:
        v1: Any = client.CoreV1Api(admin)
        created: Obj = admin.sanitize_for_serialization(v1.create_namespaced_pod(NS, body))
        return created


def refusal(api: ApiServer, body: Obj) -> Obj:
    with pytest.raises(ApiException) as caught:
        create(api, body)
    status: Obj = json.loads(caught.value.body or "")
    return status


def test_a_pod_gets_its_service_accounts_token_volume(api: ApiServer) -> None:
    created = create(api, pod(initContainers=[{"name": "i", "image": "i"}]))
    assert created["spec"]["serviceAccountName"] == "default"
    (volume,) = created["spec"]["volumes"]
    assert volume["name"].startswith("kube-api-access-")
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
    for container in [*created["spec"]["initContainers"], *created["spec"]["containers"]]:
        assert container["volumeMounts"] == [
            {"name": volume["name"], "readOnly": True, "mountPath": TOKEN_DIR}
        ]


def test_no_token_where_the_pod_or_its_account_says_so(api: ApiServer) -> None:
    assert "volumes" not in create(api, pod("a", automountServiceAccountToken=False))["spec"]
    api.put({"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
             "metadata": {"name": "quiet", "namespace": NS}})  # fmt: skip
    assert "volumes" not in create(api, pod("b", serviceAccountName="quiet"))["spec"]


def test_a_missing_service_account_or_runtime_class_refuses_the_pod(api: ApiServer) -> None:
    status = refusal(api, pod(serviceAccountName="nobody"))
    assert status["message"] == (
        f'error looking up service account {NS}/nobody: serviceaccount "nobody" not found'
    )
    assert refusal(api, pod(runtimeClassName="gpuwire"))["message"] == (
        'pod rejected: RuntimeClass "gpuwire" not found'
    )
    api.put({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "g"},
             "handler": "g", "scheduling": {"nodeSelector": {"ready": "true"}}})  # fmt: skip
    assert create(api, pod(runtimeClassName="g"))["spec"]["nodeSelector"] == {"ready": "true"}


# --- a mutating webhook, served over TLS at an endpoint of its Service


class Webhook:
    """An HTTPS server answering AdmissionReviews with `answer(review)`."""

    def __init__(self, tmp: Path) -> None:
        now = dt.datetime.now(dt.UTC)
        self.ca = pki.new_ca(now, pki.CA_LIFETIME)
        serving = pki.issue(self.ca, ["hook.team.svc"], now, pki.SERVING_LIFETIME)
        (tmp / "tls.crt").write_bytes(serving.cert_pem())
        (tmp / "tls.key").write_bytes(serving.key_pem())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.reviews: list[Obj] = []
        self.answer: Obj = {"allowed": True}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None: ...

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append(review)
                body = {**review, "response": {"uid": review["request"]["uid"], **outer.answer}}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def register(self, api: ApiServer, ready: bool = True, **webhook: Any) -> None:
        ports = [{"name": "https", "port": 443, "targetPort": "https"}]
        api.put({"apiVersion": "v1", "kind": "Service", "spec": {"ports": ports},
                 "metadata": {"name": "hook", "namespace": NS}})  # fmt: skip
        api.put({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "hook-1", "namespace": NS,
                              "labels": {"kubernetes.io/service-name": "hook"}},
                 "addressType": "IPv4", "ports": [{"name": "https", "port": self.port}],
                 "endpoints": [{"addresses": ["127.0.0.1"],
                                "conditions": {"ready": ready}}]})  # fmt: skip
        bundle = base64.b64encode(self.ca.cert_pem()).decode()
        api.put({"apiVersion": "admissionregistration.k8s.io/v1",
                 "kind": "MutatingWebhookConfiguration", "metadata": {"name": "hook"},
                 "webhooks": [{"name": "pods.example.com", "sideEffects": "None",
                               "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
                               "clientConfig": {"caBundle": bundle, "service": {
                                   "namespace": NS, "name": "hook", "path": "/mutate"}},
                               "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                                          "apiVersions": ["v1"], "resources": ["pods"]}],
                               **webhook}]})  # fmt: skip


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[Webhook]:
    hook = Webhook(tmp_path)
    yield hook
    hook.server.shutdown()


def test_a_webhook_is_called_through_its_service_and_its_patch_applied(
    api: ApiServer, webhook: Webhook
) -> None:
    webhook.register(api)
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}}]
    webhook.answer = {"allowed": True, "patchType": "JSONPatch",
                      "patch": base64.b64encode(json.dumps(patch).encode()).decode()}  # fmt: skip
    created = create(api, pod())
    assert created["metadata"]["labels"] == {"seen": "yes"}
    (review,) = webhook.reviews
    request = review["request"]
    assert (request["operation"], request["namespace"]) == ("CREATE", NS)
    assert request["userInfo"]["username"] == "system:admin"
    # the webhook saw the pod after service account admission
    assert request["object"]["spec"]["serviceAccountName"] == "default"


def test_a_webhooks_denial_is_the_api_servers_answer(api: ApiServer, webhook: Webhook) -> None:
    webhook.register(api)
    webhook.answer = {"allowed": False, "status": {"code": 403, "message": "no GPUs here"}}
    status = refusal(api, pod())
    assert (status["code"], status["message"]) == (
        403, 'admission webhook "pods.example.com" denied the request: no GPUs here'
    )  # fmt: skip


def test_no_ready_endpoint_fails_closed_and_selectors_spare_pods(
    api: ApiServer, webhook: Webhook
) -> None:
    webhook.register(api, ready=False)
    status = refusal(api, pod())
    assert status["code"] == 500
    assert status["message"].startswith('Internal error occurred: failed calling webhook '
                                        '"pods.example.com": failed to call webhook: Post '
                                        '"https://hook.team.svc:443/mutate?timeout=10s": '
                                        'no endpoints available for service "hook"')  # fmt: skip
    webhook.register(api, ready=False, namespaceSelector={"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS]}]})  # fmt: skip
    assert create(api, pod("spared"))
    webhook.register(api, ready=False, matchConditions=[
        {"name": "gpu", "expression": "has(object.metadata.annotations)"}])  # fmt: skip
    assert create(api, pod("not-matched"))


# --- ValidatingAdmissionPolicy, as the dra overlay's own-node policy uses it


def test_a_policy_denies_what_its_validation_rejects(api: ApiServer) -> None:
    group = "admissionregistration.k8s.io/v1"
    api.put({"apiVersion": group, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "own"},
             "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [
                 {"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE", "DELETE"],
                  "resources": ["configmaps"]}]},
                 "validations": [{"expression": "request.operation == 'DELETE' ? "
                                  "!('keep' in oldObject.data) : object.data.ok == 'yes'",
                                  "message": "not ok"}]}})  # fmt: skip
    api.put({"apiVersion": group, "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": "own-b"},
             "spec": {"policyName": "own", "validationActions": ["Deny"]}})  # fmt: skip
    with api.client() as admin:
        v1: Any = client.CoreV1Api(admin)
        v1.create_namespaced_config_map(NS, {"metadata": {"name": "a"}, "data": {"ok": "yes"}})
        with pytest.raises(ApiException) as caught:
            v1.create_namespaced_config_map(NS, {"metadata": {"name": "b"}, "data": {"ok": "no"}})
        assert caught.value.status == 422
        assert json.loads(caught.value.body or "")["message"] == (
            "ValidatingAdmissionPolicy 'own' with binding 'own-b' denied request: not ok"
        )
        v1.create_namespaced_config_map(NS, {"metadata": {"name": "k"},
                                             "data": {"ok": "yes", "keep": "yes"}})  # fmt: skip
        with pytest.raises(ApiException):
            v1.delete_namespaced_config_map("k", NS)
        v1.delete_namespaced_config_map("a", NS)
