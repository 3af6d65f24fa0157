"""kube-apiserver's admission chain, as far as a gpuwire install meets it ("Admission Control
in Kubernetes", kubernetes.io/docs/reference/access-authn-authz/admission-controllers/), in
the order the API server runs it: the mutating plugins ServiceAccount and RuntimeClass, the
MutatingAdmissionWebhook; after the object is complete (name generated), the
ValidatingAdmissionPolicy plugin.

- ServiceAccount (`plugin/pkg/admission/serviceaccount/admission.go`): a pod gets
  `serviceAccountName: default` when it names none; the account must exist; unless the pod
  or its account turns `automountServiceAccountToken` off, a projected volume
  `kube-api-access-<5>` (a bound token of 3607 s, the `kube-root-ca.crt` ConfigMap's
  `ca.crt`, the namespace) mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount
  in every container and init container that does not mount that path itself.
- RuntimeClass (`plugin/pkg/admission/runtimeclass/admission.go`): a pod naming a
  RuntimeClass that does not exist is refused; its `scheduling` nodeSelector (a conflicting
  key refused) and tolerations are merged into the pod.
- MutatingAdmissionWebhook ("Dynamic Admission Control", kubernetes.io/docs/reference/
  access-authn-authz/extensible-admission-controllers/): each webhook whose rules,
  namespaceSelector, objectSelector and matchConditions (CEL: `object`, `oldObject`,
  `request`) take the request is sent an AdmissionReview v1 over HTTPS, its certificate
  checked against `caBundle` for the name `<service>.<namespace>.svc`, within
  `timeoutSeconds`; a JSONPatch answer is applied; a denial or a failed call (under
  `failurePolicy: Fail`) refuses the request in the API server's words
  (k8s.io/apiserver `pkg/admission/plugin/webhook/errors/statuserror.go`).
  The Service is resolved to one of its ready endpoints (its EndpointSlices), as the API
  server does with `--enable-aggregator-routing`: there is no kube-proxy here.
- ValidatingAdmissionPolicy ("Validating Admission Policy", kubernetes.io/docs/reference/
  access-authn-authz/validating-admission-policy/): each policy a binding names, where its
  matchConstraints and matchConditions take the request, denies it when a validation is
  false (`validationActions: [Deny]`; 422 with the validation's message).

Left out: every other admission plugin (LimitRanger, quota, PodSecurity, priority, ...),
webhook reinvocation (gpuwire registers one webhook), validating webhooks, VAP params,
variables, audit annotations and message expressions, and `matchPolicy` version
conversion (the stand-in serves one version of each group).
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import random
import socket
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import celpy
import celpy.adapter
import jsonpatch
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from testbed.rbac import User

Obj = dict[str, Any]
Connect = Callable[[str, int, float], socket.socket]
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 (a path)
ROOT_CA = "kube-root-ca.crt"
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # an EndpointSlice's Service


class Rejection(Exception):
    """A request admission refuses: the Status code, reason and message to answer."""

    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason


class Objects(Protocol):
    """What admission reads of the cluster: the API server's stored objects."""

    def get(self, resource: str, name: str, namespace: str = "") -> Obj | None: ...

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]: ...


@dataclass(frozen=True)
class Request:
    """One write, as admission sees it (an AdmissionRequest's fields)."""

    operation: str  # CREATE, UPDATE, DELETE
    group: str
    version: str
    resource: str  # plural
    kind: str
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    user: User
    subresource: str = ""

    def review(self, uid: str) -> Obj:
        """The AdmissionReview v1 request for it."""
        kind = {"group": self.group, "version": self.version, "kind": self.kind}
        resource = {"group": self.group, "version": self.version, "resource": self.resource}
        options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(
            self.operation, "DeleteOptions"
        )
        request = {
            "uid": uid,
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": self.name,
            "namespace": self.namespace,
            "operation": self.operation,
            "userInfo": user_info(self.user),
            "object": self.obj,
            "oldObject": self.old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
        }
        if self.subresource:
            request["subResource"] = self.subresource
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def user_info(user: User) -> Obj:
    info: Obj = {"username": user.name, "groups": list(user.groups)}
    info |= {"uid": user.uid} if user.uid else {}
    info |= {"extra": {k: list(v) for k, v in user.extra.items()}} if user.extra else {}
    return info


# --- selectors and rules


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions ANDed; empty: everything)."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, op, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if (
            (op == "In" and (not present or labels[key] not in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def rule_matches(rule: Mapping[str, Any], request: Request) -> bool:
    """A RuleWithOperations (admissionregistration/v1): operations, groups, versions,
    resources (`pods`, `pods/status`, `*`, `*/*`, `pods/*`) and scope."""
    if not ({"*", request.operation} & set(rule.get("operations") or ())):
        return False
    if not ({"*", request.group} & set(rule.get("apiGroups") or ())):
        return False
    if not ({"*", request.version} & set(rule.get("apiVersions") or ())):
        return False
    wanted = (
        f"{request.resource}/{request.subresource}" if request.subresource else request.resource
    )
    resources = set(rule.get("resources") or ())
    sub = request.subresource
    if not (
        wanted in resources
        or "*/*" in resources
        or (not sub and "*" in resources)
        or (sub and (f"*/{sub}" in resources or f"{request.resource}/*" in resources))
    ):
        return False
    scope = rule.get("scope", "*")
    return bool(scope == "*" or (scope == "Namespaced") == bool(request.namespace))


def _selected(spec: Mapping[str, Any], request: Request, objects: Objects) -> bool:
    """namespaceSelector (not for cluster-scoped objects, nor a Namespace's own) and
    objectSelector (the new object's labels, or the old one's)."""
    if request.namespace and request.resource != "namespaces":
        namespace = objects.get("namespaces", request.namespace) or {"metadata": {}}
        labels = namespace["metadata"].get("labels") or {}
        if not label_selector_matches(spec.get("namespaceSelector"), labels):
            return False
    selector = spec.get("objectSelector")
    if not selector:
        return True
    return any(
        label_selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})
        for o in (request.obj, request.old)
        if o is not None
    )


def _cel(expression: str, activation: Mapping[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({k: celpy.adapter.json_to_cel(v) for k, v in activation.items()})


def _activation(request: Request, review: Obj) -> dict[str, Any]:
    return {"object": request.obj, "oldObject": request.old, "request": review["request"]}


def conditions_match(spec: Mapping[str, Any], request: Request, review: Obj) -> bool:
    """Every matchCondition true (an error raises CELEvalError / CELParseError)."""
    activation = _activation(request, review)
    return all(bool(_cel(c["expression"], activation)) for c in spec.get("matchConditions") or ())


# --- the plugins


class Chain:
    """The admission chain over the API server's objects; `connect` dials a webhook's
    endpoint (the network the pods are on)."""

    def __init__(self, objects: Objects, connect: Connect) -> None:
        self.objects = objects
        self.connect = connect

    def mutate(self, request: Request) -> Obj | None:
        """The object as the mutating plugins leave it (Rejection to refuse)."""
        obj = request.obj
        if request.operation == "CREATE" and request.resource == "pods" and obj is not None:
            obj = service_account(obj, request.namespace, self.objects)
            obj = runtime_class(obj, self.objects)
            request = dataclasses.replace(request, obj=obj)
        for configuration in self.objects.objects("mutatingwebhookconfigurations"):
            for webhook in configuration.get("webhooks") or ():
                obj = self._call(webhook, request)
                request = dataclasses.replace(request, obj=obj)
        return obj

    def validate(self, request: Request) -> None:
        """The ValidatingAdmissionPolicy plugin (Rejection to refuse)."""
        policies = {
            p["metadata"]["name"]: p for p in self.objects.objects("validatingadmissionpolicies")
        }
        for binding in self.objects.objects("validatingadmissionpolicybindings"):
            policy = policies.get(binding["spec"].get("policyName", ""))
            if policy is not None:
                enforce(policy, binding, request, self.objects)

    def _call(self, webhook: Obj, request: Request) -> Obj | None:
        rules = webhook.get("rules") or ()
        if not any(rule_matches(r, request) for r in rules):
            return request.obj
        if not _selected(webhook, request, self.objects):
            return request.obj
        name = webhook["name"]
        review = request.review(str(uuid.uuid4()))
        fail = webhook.get("failurePolicy", "Fail") == "Fail"
        try:
            if not conditions_match(webhook, request, review):
                return request.obj
            answer = call_webhook(webhook, review, self.objects, self.connect)
        except (CELEvalError, CELParseError, WebhookError) as exc:
            if not fail:
                return request.obj
            message = f'failed calling webhook "{name}": {exc}'
            raise Rejection(500, f"Internal error occurred: {message}", "InternalError") from exc
        response = answer.get("response") or {}
        if not response.get("allowed"):
            raise denial(name, response.get("status") or {})
        if not response.get("patch"):
            return request.obj
        operations = json.loads(base64.b64decode(response["patch"]))
        patched: Obj = jsonpatch.apply_patch(request.obj, operations)
        return patched


def denial(webhook: str, status: Mapping[str, Any]) -> Rejection:
    """statuserror.go's ToStatusErr: the webhook's Status, its message prefixed."""
    denied = f'admission webhook "{webhook}" denied the request'
    message = status.get("message") or status.get("reason") or ""
    text = f"{denied}: {message}" if message else f"{denied} without explanation"
    return Rejection(max(int(status.get("code") or 0), 400), text, status.get("reason", ""))


def service_account(pod: Obj, namespace: str, objects: Objects) -> Obj:
    pod = json.loads(json.dumps(pod))
    spec = pod.setdefault("spec", {})
    name = spec.setdefault("serviceAccountName", "default")
    account = objects.get("serviceaccounts", name, namespace)
    if account is None:
        message = f'error looking up service account {namespace}/{name}: serviceaccount "{name}" '
        raise Rejection(403, message + "not found", "Forbidden")
    mount = spec.get("automountServiceAccountToken")
    if mount is None:
        mount = account.get("automountServiceAccountToken")
    if mount is False:
        return pod
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    volume = f"kube-api-access-{''.join(random.choices(ALPHABET, k=5))}"
    wanted = False
    for container in containers:
        mounts = container.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == TOKEN_DIR for m in mounts):
            mounts.append({"name": volume, "readOnly": True, "mountPath": TOKEN_DIR})
            wanted = True
    if wanted:
        field = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
        sources = [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": field}]}},
        ]
        projected = {"projected": {"defaultMode": 0o644, "sources": sources}}
        spec.setdefault("volumes", []).append({"name": volume, **projected})
    return pod


def runtime_class(pod: Obj, objects: Objects) -> Obj:
    name = pod["spec"].get("runtimeClassName")
    if not name:
        return pod
    found = objects.get("runtimeclasses", name)
    if found is None:
        raise Rejection(403, f'pod rejected: RuntimeClass "{name}" not found', "Forbidden")
    scheduling = found.get("scheduling") or {}
    selector = pod["spec"].setdefault("nodeSelector", {})
    for key, value in (scheduling.get("nodeSelector") or {}).items():
        if selector.get(key, value) != value:
            message = f"pod rejected: conflict: runtimeClass.scheduling.nodeSelector[{key}] = "
            raise Rejection(403, f"{message}{value}; pod.nodeSelector[{key}] = {selector[key]}")
        selector[key] = value
    tolerations = pod["spec"].setdefault("tolerations", [])
    for toleration in scheduling.get("tolerations") or ():
        if toleration not in tolerations:
            tolerations.append(toleration)
    if not selector:
        del pod["spec"]["nodeSelector"]
    if not tolerations:
        del pod["spec"]["tolerations"]
    return pod


# --- calling a webhook


class WebhookError(Exception):
    """A webhook that could not be called (its text is the API server's)."""


def endpoint(namespace: str, service: str, port: int, objects: Objects) -> tuple[str, int]:
    """A ready endpoint of the Service's `port`: its address and target port number."""
    found = objects.get("services", service, namespace)
    if found is None:
        raise WebhookError(f'service "{service}" not found')
    ports = [p for p in found["spec"].get("ports") or () if p.get("port") == port]
    if not ports:
        raise WebhookError(f'service "{service}" has no port {port}')
    wanted = ports[0].get("name", "")
    ready: list[tuple[str, int]] = []
    for piece in objects.objects("endpointslices", namespace):
        if (piece["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) != service:
            continue
        numbers = [p["port"] for p in piece.get("ports") or () if p.get("name", "") == wanted]
        for point in piece.get("endpoints") or ():
            if (point.get("conditions") or {}).get("ready") and numbers:
                ready.extend((address, numbers[0]) for address in point.get("addresses") or ())
    if not ready:
        raise WebhookError(f'no endpoints available for service "{service}"')
    return random.choice(ready)


class _Https(http.client.HTTPSConnection):
    """HTTPS over a socket `connect` made, the certificate checked for `server_name`."""

    def __init__(
        self, sock: socket.socket, context: ssl.SSLContext, server_name: str, timeout: float
    ) -> None:
        super().__init__(server_name, timeout=timeout, context=context)
        self._raw, self._tls = sock, context

    def connect(self) -> None:
        self._raw.settimeout(self.timeout)
        self.sock = self._tls.wrap_socket(self._raw, server_hostname=self.host)


def call_webhook(webhook: Obj, review: Obj, objects: Objects, connect: Connect) -> Obj:
    """POST the review to the webhook's Service (or URL), as the API server does."""
    config = webhook.get("clientConfig") or {}
    timeout = float(webhook.get("timeoutSeconds", 10))
    service = config.get("service")
    if service is None:
        raise WebhookError("clientConfig.url is left out by the test apiserver")
    port = int(service.get("port", 443))
    server_name = f"{service['name']}.{service['namespace']}.svc"
    url = f"https://{server_name}:{port}{service.get('path', '/')}?timeout={int(timeout)}s"
    context = ssl.create_default_context()
    bundle = config.get("caBundle")
    try:
        if bundle:
            context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
        address, target = endpoint(service["namespace"], service["name"], port, objects)
        connection = _Https(connect(address, target, timeout), context, server_name, timeout)
        body = json.dumps(review).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        connection.request("POST", url.split(f":{port}", 1)[1], body, headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
    except WebhookError as exc:
        raise WebhookError(f'failed to call webhook: Post "{url}": {exc}') from None
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError) as exc:
        raise WebhookError(f'failed to call webhook: Post "{url}": {exc}') from None
    if answer.status != 200:
        raise WebhookError(f"received invalid webhook response: status {answer.status}")
    try:
        result: Obj = json.loads(data)
    except ValueError as exc:
        raise WebhookError(f"received invalid webhook response: {exc}") from None
    return result


# --- ValidatingAdmissionPolicy


def enforce(policy: Obj, binding: Obj, request: Request, objects: Objects) -> None:
    spec = policy.get("spec") or {}
    constraints = spec.get("matchConstraints") or {}
    if not any(rule_matches(r, request) for r in constraints.get("resourceRules") or ()):
        return
    if not _selected(constraints, request, objects):
        return
    review = request.review(str(uuid.uuid4()))
    name, bound = policy["metadata"]["name"], binding["metadata"]["name"]
    fail = spec.get("failurePolicy", "Fail") == "Fail"
    try:
        if not conditions_match(spec, request, review):
            return
        activation = _activation(request, review)
        failed = [v for v in spec.get("validations") or () if not _cel(v["expression"], activation)]
    except (CELEvalError, CELParseError) as exc:
        if not fail:
            return
        message = f"ValidatingAdmissionPolicy '{name}' with binding '{bound}' denied request: "
        raise Rejection(422, f"{message}expression error: {exc}", "Invalid") from exc
    if failed and "Deny" in (binding["spec"].get("validationActions") or ()):
        why = failed[0].get("message") or f"failed expression: {failed[0]['expression']}"
        message = f"ValidatingAdmissionPolicy '{name}' with binding '{bound}' denied request: {why}"
        raise Rejection(422, message, failed[0].get("reason", "Invalid"))
