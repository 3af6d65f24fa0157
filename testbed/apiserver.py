"""A kube-apiserver stand-in for tests: its REST and watch wire protocol on 127.0.0.1.

The real `kubernetes` client talks to it; tests seed and inspect objects without HTTP (`put`,
`get`, `objects`, `delete`), read the request log and inject faults (`fail`, `close_watches`,
`compact`). Faithful to: paths and discovery; errors as metav1.Status in the apiserver's wording;
one etcd-like resourceVersion sequence; optimistic concurrency; no-op writes that change nothing;
status subresources; label and field selectors; watch (resume, bookmarks, selector transitions,
410 Expired once the bounded history has moved past the requested version); lists in chunks
(`limit`, `continue`: every page from the snapshot of the first, in key order, the token
encoded as the apiserver's storage layer encodes it, 410 Expired once the history no longer
reaches back to that snapshot: "Retrieving large results sets in chunks", kubernetes.io/docs/
reference/using-api/api-concepts/); metadata-only answers for the Accept types client-go's
metadata client sends (`application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` for
a list, `...;as=PartialObjectMetadata;...` for a get or watch: k8s.io/apiserver's
endpoints/handlers/response.go), 406 where no Accept type can be served.
Lists are assembled from each object's encoding, kept until it changes, so a 10,000-Node list
costs the stand-in little of what a client spends reading it.
Secure (`ApiServer(secure=True)`): service account tokens (testbed/tokens.py, TokenRequest on
`serviceaccounts/<name>/token`), RBAC (testbed/rbac.py) and the admission chain
(testbed/admission.py) as a cluster's API server applies them, and HTTPS for pods
(`serve_tls`); graceful pod deletion (`graceful_delete=True`) as the kubelet finishes it.
Deliberate limits: without `secure`, no authn/authz or admission; no other authenticator than
service account tokens (the plain listener's callers are the admin, as the test harness is);
server-side apply answers 415 and `dryRun` 400;
strategic merge is merge patch plus merge-by-key of the lists in MERGE_KEYS, no `$` directives;
list ignores `resourceVersion` (always the latest, then its snapshot), an expired `continue`
gets no inconsistent-continuation token, no protobuf and no Table; finalizers and grace
periods are ignored (delete is immediate but for `graceful_delete` pods, a namespace goes with
its contents: with `graceful_delete` once its pods are, Terminating meanwhile and refusing new
content; no garbage collector: dependents stay); no
deletecollection, no `sendInitialEvents` (watch-list); validation covers names and labels,
not the schema (a wrongly typed field is stored as sent), except for `resource.k8s.io/v1`
(ResourceSlices, DeviceClasses, ResourceClaims and their templates), whose writes validate
against a Kubernetes version's schema with `schema=`; device taints get the server's
`timeAdded`, or are dropped as by a server without DRADeviceTaints (`device_taints=False`).
Quantities are stored as sent (the real server canonicalises them).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import dataclasses
import datetime as dt
import fnmatch
import json
import math
import random
import re
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import jsonpatch
import orjson
from kubernetes import client as k8s

from certs import pki
from testbed import admission, rbac, tokens

Obj = dict[str, Any]
Match = Callable[[Obj], bool]
Events = Generator[Obj, None, None]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool = False  # has a /status subresource
    fields: tuple[str, ...] = ()  # fieldSelector labels besides metadata.name and .namespace

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The name messages use: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


ADMISSION = "admissionregistration.k8s.io"
DRA = "resource.k8s.io"  # Dynamic Resource Allocation, v1 (GA in 1.34)
VAP = "ValidatingAdmissionPolicy"
SLICE_FIELDS = ("spec.driver", "spec.nodeName", "spec.pool.name")
KIND_SLICE = "ResourceSlice"
POD_FIELDS = ("spec.nodeName", "spec.schedulerName", "spec.serviceAccountName", "status.phase")
RESOURCES = (
    Resource("", "v1", "namespaces", "Namespace", False, True, ("status.phase",)),
    Resource("", "v1", "nodes", "Node", False, True, ("spec.unschedulable",)),
    Resource("", "v1", "pods", "Pod", True, True, POD_FIELDS),
    Resource("", "v1", "secrets", "Secret", True, fields=("type",)),
    Resource("", "v1", "configmaps", "ConfigMap", True),
    Resource("", "v1", "events", "Event", True, fields=("involvedObject.name", "reason")),
    Resource("", "v1", "services", "Service", True, True),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", True),
    Resource(
        ADMISSION, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False
    ),
    Resource(
        ADMISSION, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False
    ),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    Resource(DRA, "v1", "resourceslices", KIND_SLICE, False, fields=SLICE_FIELDS),
    Resource(DRA, "v1", "deviceclasses", "DeviceClass", False),
    Resource(DRA, "v1", "resourceclaims", "ResourceClaim", True, True),
    Resource(DRA, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True, True),
    Resource("apps", "v1", "deployments", "Deployment", True, True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True),
    Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    Resource(rbac.API_GROUP, "v1", "roles", "Role", True),
    Resource(rbac.API_GROUP, "v1", "rolebindings", "RoleBinding", True),
    Resource(rbac.API_GROUP, "v1", "clusterroles", "ClusterRole", False),
    Resource(rbac.API_GROUP, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Resource(ADMISSION, "v1", "validatingadmissionpolicies", VAP, False, True),
    Resource(ADMISSION, "v1", "validatingadmissionpolicybindings", f"{VAP}Binding", False),
)
# Subresources besides status: a ServiceAccount's TokenRequest. Others (pods/eviction, ...)
# are authorized like any request, then answered 404: nothing here serves them.
SUBRESOURCES = {"serviceaccounts": ("token",)}
NAMESPACES = RESOURCES[0]
META = "meta.k8s.io/v1"
TYPE_FIELDS = ("apiVersion", "kind")  # a typed list's items go without them
# k8s.io/apiserver/pkg/storage/etcd3/errors.go
CONTINUE_EXPIRED = "The provided continue parameter is too old to display a consistent list "
CONTINUE_EXPIRED += "result. You can start a new list without the continue parameter."
RETURNS_DELETED = (  # their registries answer a delete with the object
    "pods",
    "services",
    *(r.plural for r in RESOURCES if r.group == DRA),
)
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # generateName's suffixes (apimachinery rand.String)
MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's MaxRequestBodyBytes
# Lists that strategic merge patch merges by a key (patchMergeKey in the API types).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "conditions": "type", "addresses": "type",
              "ownerReferences": "uid", "webhooks": "name"}  # fmt: skip
REASONS = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 406: "NotAcceptable",
           409: "Conflict", 410: "Gone", 413: "RequestEntityTooLarge",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
           503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip
JSON_PATCH, MERGE_PATCH, STRATEGIC = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)
NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?{LABEL_NAME}")
LABEL_VALUE = re.compile(rf"({LABEL_NAME})?")
LABEL_RULE = "keys are [DNS-subdomain/]name, values empty or a name (≤ 63 of A-Za-z0-9-_.)"
NAME_RULE = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
NAME_RULE += "'-' or '.', and must start and end with an alphanumeric character"
NAMESPACE_MISMATCH = "the namespace of the provided object does not match the namespace sent on "
NAMESPACE_MISMATCH += "the request"
MODIFIED = "the object has been modified; please apply your changes to the latest version and "
MODIFIED += "try again"


class StatusError(Exception):
    """A failed request; `status` is the metav1.Status the apiserver would send."""

    def __init__(self, code: int, message: str, reason: str = "", details: Obj | None = None):
        super().__init__(message)
        self.code = code
        self.status: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
        self.status |= {"status": "Failure", "message": message, "code": code}
        self.status |= {"reason": reason or REASONS.get(code, "InternalError")}
        self.status |= {"details": details} if details else {}


def _details(res: Resource, name: str, kind: str = "") -> Obj:
    return {"name": name, "kind": kind or res.plural} | ({"group": res.group} if res.group else {})


def not_found(res: Resource, name: str) -> StatusError:
    return StatusError(404, f'{res.qualified} "{name}" not found', details=_details(res, name))


def conflict(res: Resource, name: str, why: str) -> StatusError:
    message = f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}'
    return StatusError(409, message, details=_details(res, name))


def terminating(res: Resource, name: str, namespace: str) -> StatusError:
    """What the NamespaceLifecycle admission plugin answers a create in a Terminating one."""
    why = f"unable to create new content in namespace {namespace} because it is being terminated"
    message = f'{res.qualified} "{name}" is forbidden: {why}'
    return StatusError(403, message, "Forbidden", _details(res, name))


def invalid(res: Resource, name: str, field: str, value: str, why: str) -> StatusError:
    cause = {"reason": "FieldValueInvalid", "field": field}
    cause["message"] = f"Invalid value: {json.dumps(value)}: {why}"
    details = _details(res, name, res.kind) | {"causes": [cause]}
    message = f'{res.kind} "{name}" is invalid: {field}: {cause["message"]}'
    return StatusError(422, message, details=details)


VERSION = dict(major="1", minor="31", gitVersion="v1.31.0", gitCommit="", gitTreeState="clean",
               buildDate="", goVersion="", compiler="gc", platform="linux/amd64")  # fmt: skip
PATH_NOT_FOUND = StatusError(404, "the server could not find the requested resource")


# Selectors, in the grammar of apimachinery's labels.Parse (less gt/lt) and fields.ParseSelector.


def label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    terms = [term.strip() for term in re.split(r",(?![^()]*\))", text) if term.strip()]
    checks = [_label_term(term) for term in terms]
    return lambda labels: all(check(labels) for check in checks)


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    if m := re.fullmatch(r"(\S+)\s+(in|notin)\s*\(([^()]*)\)", term):
        key, values, want = m[1], {v.strip() for v in m[3].split(",")}, m[2] == "in"
    elif m := re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(\S*)", term):
        key, values, want = m[1], {m[3]}, m[2] != "!="
    elif m := re.fullmatch(r"(!?)\s*([^\s!=()]+)", term):
        key, values, want = m[2], set(), not m[1]
    else:
        accepted = "key, !key, key=v, key==v, key!=v, key in (v1,v2), key notin (v1,v2)"
        raise StatusError(400, f"unable to parse requirement: {term!r}; accepted: {accepted}")
    if not LABEL_KEY.fullmatch(key) or not all(LABEL_VALUE.fullmatch(v) for v in values):
        raise StatusError(400, f"unable to parse requirement: invalid label key or value: {term!r}")
    if not values:
        return lambda labels: (key in labels) == want
    return lambda labels: (labels.get(key) in values) == want


def field_selector(text: str, res: Resource) -> Match:
    accepted = ("metadata.name", "metadata.namespace")[: 1 + res.namespaced] + res.fields
    checks = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", term)
        if m is None:
            raise StatusError(400, f"invalid field selector {term!r}: accepted: f=v, f==v, f!=v")
        if m[1] not in accepted:
            supported = ", ".join(accepted)
            raise StatusError(400, f"field label not supported: {m[1]} ({res.plural}: {supported})")
        checks.append((m[1], m[3], m[2] != "!="))
    return lambda obj: all((_field(obj, path) == value) == want for path, value, want in checks)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _field(obj: Obj, path: str) -> str:
    value = _get(obj, path)
    return "" if value is None else json.dumps(value) if isinstance(value, bool) else str(value)


# Patches.


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; `strategic` also merges the lists in MERGE_KEYS by their key."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            raise StatusError(400, f"strategic merge patch directive {key}: not supported here")
        if value is None:
            merged.pop(key, None)
        elif strategic and key in MERGE_KEYS and isinstance(value, list):
            merged[key] = _merge_list(merged.get(key) or [], value, MERGE_KEYS[key])
        else:
            merged[key] = merge_patch(merged.get(key), value, strategic)
    return merged


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    merged = list(current)
    for item in patch:
        keyed = isinstance(item, dict) and key in item
        at = [i for i, old in enumerate(merged) if keyed and _get(old, key) == item[key]]
        if at:
            merged[at[0]] = merge_patch(merged[at[0]], item, strategic=True)
        else:
            merged.append(merge_patch(None, item, strategic=True))
    return merged


def apply_patch(obj: Obj, content_type: str, patch: Any) -> Any:
    kind = content_type.split(";")[0].strip()
    if kind in (MERGE_PATCH, STRATEGIC) and isinstance(patch, dict):
        return merge_patch(obj, patch, strategic=kind == STRATEGIC)
    if kind == JSON_PATCH and isinstance(patch, list):
        try:
            return jsonpatch.apply_patch(obj, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as e:
            raise StatusError(422, f"the JSON patch could not be applied: {e}", "Invalid") from e
    if kind in (MERGE_PATCH, STRATEGIC, JSON_PATCH):
        shape = "a list of operations" if kind == JSON_PATCH else "an object"
        raise StatusError(400, f"a {kind} body must be {shape}, got {json.dumps(patch)}")
    accepted = f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC}"
    message = "the body of the request was in an unknown format - accepted media types include: "
    why = f"{kind!r}: server-side apply is not implemented by the test apiserver"
    raise StatusError(415, f"{message}{accepted} (got {why})")


# The store: objects by resource, one resourceVersion sequence, a bounded history for watches.


@dataclass(frozen=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj  # stored objects are never changed in place, so events and lists share them
    old: Obj | None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    accept: str = ""


@dataclass
class Fault:
    method: str
    path: str
    status: int
    times: int


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _copy(obj: Obj) -> Obj:
    return cast(Obj, json.loads(json.dumps(obj)))


def _path(key: tuple[str, str]) -> str:
    """An object's key as etcd orders it under its resource's prefix: `ns/name`, or `name`."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def encode_continue(version: int, start: str) -> str:
    """A `continue` token as k8s.io/apiserver's storage/continue.go encodes it: unpadded
    base64url of {"v": "meta.k8s.io/v1", "rv": <snapshot>, "start": <next key>}."""
    token = json.dumps({"v": META, "rv": version, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        version, start, valid = int(data["rv"]), str(data["start"]), data.get("v") == META
    except (ValueError, TypeError, KeyError, binascii.Error):
        valid = False
    if not valid or version <= 0 or not start:
        raise StatusError(400, f"continue key is not valid: {token!r}")
    return version, start


def partial(obj: Obj) -> Obj:
    """An object as PartialObjectMetadata: its metadata only."""
    return {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": obj["metadata"]}


def metadata_only(accept: str, listing: bool) -> bool:
    """Whether the first type of `accept` this server produces is the metadata-only one (a
    list asks for PartialObjectMetadataList, a get or watch for PartialObjectMetadata);
    406 where it produces none."""
    wanted = "PartialObjectMetadataList" if listing else "PartialObjectMetadata"
    for media in (accept or "application/json").split(","):
        kind, *parameters = (p.strip() for p in media.split(";"))
        given = dict(p.partition("=")[::2] for p in parameters)
        if kind not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in given:
            return False
        if (given["as"], given.get("g"), given.get("v")) == (wanted, "meta.k8s.io", "v1"):
            return True
    accepted = f"application/json, application/json;as={wanted};g=meta.k8s.io;v=v1"
    raise StatusError(406, f"only the following media types are accepted: {accepted}")


def _valid_name(res: Resource, name: str) -> bool:
    """An RFC 1123 subdomain (a label for a Namespace); RBAC objects need only be a path
    segment (`system:discovery`: ValidateRBACName is path.IsValidPathSegmentName)."""
    if res.group == rbac.API_GROUP:
        return bool(name) and name not in (".", "..") and not set(name) & {"/", "%"}
    return bool(NAME.fullmatch(name)) and len(name) <= (63 if res is NAMESPACES else 253)


def _spec(obj: Obj) -> Obj:
    """What a change to bumps metadata.generation: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


ADMIN = rbac.User("system:admin", groups=("system:masters", rbac.AUTHENTICATED))
ROOT_CA_CONFIG_MAP = admission.ROOT_CA


def _dial(host: str, port: int, timeout: float) -> socket.socket:
    return socket.create_connection((host, port), timeout)


class ApiServer:
    """A kube-apiserver stand-in on 127.0.0.1 with namespaces default, kube-system, kube-public
    and kube-node-lease; a context manager. `history` bounds the changes a watch can resume
    from; `bookmark_interval` is how often watches that allow bookmarks get one.

    `secure`: as a cluster's API server, every request is authenticated (a service account
    token, testbed/tokens.py; without one the admin on the plain listener, anonymous on the
    HTTPS one `serve_tls` opens), authorized by RBAC over the stored Roles and bindings
    (testbed/rbac.py, each decision kept in `authorizations`) and, for writes, admitted
    (testbed/admission.py; `connect` dials a webhook's endpoint); every namespace gets its
    `default` ServiceAccount and, once `serve_tls` ran, its `kube-root-ca.crt` ConfigMap (the
    service account and root CA publisher controllers' work). `graceful_delete`: a pod bound
    to a node is only marked for deletion (`deletionTimestamp`); it goes when its kubelet
    deletes it again with grace period 0, as the kubelet does once its containers stopped."""

    def __init__(
        self,
        history: int = 1000,
        bookmark_interval: float = 60.0,
        schema: str | None = None,
        device_taints: bool = True,
        secure: bool = False,
        connect: admission.Connect | None = None,
        graceful_delete: bool = False,
    ) -> None:
        self.secure, self.graceful_delete = secure, graceful_delete
        self.issuer = tokens.Issuer()
        self.authorizations: list[tuple[rbac.Attributes, rbac.Decision]] = []
        self.authentication_failures: list[str] = []
        self.chain = admission.Chain(self, connect or _dial)
        self.root_ca = ""  # the HTTPS listener's CA (PEM), once `serve_tls` ran
        self._tls_servers: list[tuple[_HttpServer, threading.Thread]] = []
        self.requests: list[Request] = []
        self.bookmark_interval = bookmark_interval
        self.schema = schema  # a Kubernetes version: resource.k8s.io writes validate against it
        self.device_taints = device_taints  # False: as with DRADeviceTaints off (1.34, 1.35)
        self._lock = threading.Condition(threading.RLock())
        self._store: dict[str, dict[tuple[str, str], Obj]] = {r.plural: {} for r in RESOURCES}
        self._history: deque[Event] = deque(maxlen=history)
        self._rv = self._epoch = 0
        self._in_flight = 0  # requests logged and not yet answered in full
        self._closing = False
        self._faults: list[Fault] = []
        self._encodings: dict[tuple[str, tuple[str, str], bool], tuple[Obj, bytes]] = {}
        self._snapshots: dict[str, tuple[int, dict[str, Obj], list[str]]] = {}
        self._sockets: set[socket.socket] = set()
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        for obj in rbac.BOOTSTRAP if secure else ():
            self.put(obj)
        self._http = _HttpServer(self)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        fast_exit = {"poll_interval": 0.05}
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs=fast_exit, daemon=True
        )

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server, thread in self._tls_servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        self._http.shutdown()
        self._http.server_close()  # a client that reconnects is refused, at once
        with self._lock:  # watches end cleanly, and so does any request being answered
            self._closing = True
            self._lock.notify_all()
            self._lock.wait_for(lambda: self._in_flight == 0, timeout=5)
            for sock in self._sockets:  # idle keep-alive connections too
                with contextlib.suppress(OSError):  # already closed by the client
                    sock.shutdown(socket.SHUT_RDWR)

    def client(self) -> k8s.ApiClient:
        return k8s.ApiClient(k8s.Configuration(host=self.url))

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig (JSON is YAML) whose current context is this server."""
        cluster = {"name": "test", "cluster": {"server": self.url}}
        context = {"name": "test", "context": {"cluster": "test", "user": "test"}}
        config: Obj = {"apiVersion": "v1", "kind": "Config", "current-context": "test"}
        config |= {"clusters": [cluster], "contexts": [context]}
        path.write_text(json.dumps(config | {"users": [{"name": "test", "user": {}}]}))
        return path

    # Test hooks: no HTTP, no request log, no faults.

    def _resource_of(self, obj: Obj) -> Resource:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        res = next((r for r in RESOURCES if (r.api_version, r.kind) == (api_version, kind)), None)
        if res is None:
            accepted = ", ".join(f"{r.api_version} {r.kind}" for r in RESOURCES)
            raise ValueError(f"no resource serves {api_version} {kind}; accepted: {accepted}")
        return res

    def put(self, obj: Obj) -> Obj:
        """Create or overwrite `obj`, status included, as a controller would."""
        res = self._resource_of(obj)
        kind = res.kind
        new = _copy(obj)
        new.setdefault("metadata", {}).pop("resourceVersion", None)
        namespace, name = _key(new)
        if res.namespaced and not namespace:
            raise ValueError(f"put: a {kind} needs metadata.namespace")
        with self._lock:
            if (namespace, name) in self._store[res.plural]:
                return _copy(self._update(res, namespace, name, new, "*"))
            return _copy(self._create(res, namespace, new, check_namespace=False))

    def get(self, resource: str, name: str, namespace: str = "") -> Obj | None:
        obj = self._store[self._resource(resource).plural].get((namespace, name))
        return None if obj is None else _copy(obj)

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        with self._lock:
            items = sorted(self._store[self._resource(resource).plural].items())
        return [_copy(obj) for (ns, _), obj in items if namespace in (None, ns)]

    def delete(
        self, resource: str, name: str, namespace: str = "", grace_period: int | None = None
    ) -> None:
        """Delete, as a DELETE with `gracePeriodSeconds` when given (0: a pod goes at once,
        as its kubelet's last delete makes it go)."""
        options = None if grace_period is None else {"gracePeriodSeconds": grace_period}
        self._delete(self._resource(resource), namespace, name, options)

    def create(self, obj: Obj) -> Obj:
        """Create `obj` as the admin's POST would: admitted (a secure server), then stored;
        a controller's create."""
        res = self._resource_of(obj)
        namespace = obj["metadata"].get("namespace", "")
        body = self._admitted("CREATE", res, namespace, "", _copy(obj), None, ADMIN)
        with self._lock:
            return _copy(self._create(res, namespace, body, check_namespace=True))

    def patch(
        self, resource: str, name: str, namespace: str, patch: Any, content_type: str = STRATEGIC
    ) -> Obj:
        """PATCH as the admin sends it: admitted (a secure server), then written."""
        res = self._resource(resource)
        return _copy(self._patch_admitted(res, namespace, name, content_type, patch, "", ADMIN))

    def update_status(self, resource: str, name: str, namespace: str, status: Obj) -> Obj:
        """Replace the object's status, as a PUT on its status subresource (the kubelet's
        and the controllers' writes; no conflict: they own the status)."""
        res = self._resource(resource)
        with self._lock:
            old = self._store[res.plural].get((namespace, name))
            if old is None:
                raise not_found(res, name)
            return _copy(self._update(res, namespace, name, old | {"status": status}, "status"))

    def request_token(self, namespace: str, account: str, body: Obj) -> Obj:
        """TokenRequest for `account` (the kubelet's call for a pod's projected token)."""
        return self._token_request(namespace, account, body)

    def fail(self, method: str, path: str, status: int, times: int = 1) -> None:
        """Answer the next `times` requests for `method` on `path` (a glob, no query) with a
        Status of code `status`. `method` "*" is any, "WATCH" a GET with watch=true."""
        with self._lock:
            self._faults.append(Fault(method, path, status, times))

    def close_watches(self) -> None:
        """End every open watch cleanly, as an apiserver restart or request timeout does."""
        with self._lock:
            self._epoch += 1
            self._lock.notify_all()

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: watches from before now get 410."""
        with self._lock:
            self._history.clear()

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def changed(self, since: int, timeout: float) -> int:
        """Wait until something changed after resourceVersion `since` (or `timeout` passed);
        the resourceVersion now. A controller's loop sleeps on it, not on a timer."""
        with self._lock:
            self._lock.wait_for(lambda: self._rv > since or self._closing, timeout)
            return self._rv

    def _resource(self, plural: str) -> Resource:
        found = [r for r in RESOURCES if r.plural == plural]
        if not found:
            accepted = ", ".join(r.plural for r in RESOURCES)
            raise ValueError(f"unknown resource {plural!r}; accepted: {accepted}")
        return found[0]

    # Verbs: each checks its input, then changes the store under the lock (an RLock: patch calls
    # update), recording every change in the history.

    def _fault(self, method: str, path: str, query: dict[str, str]) -> None:
        verb = "WATCH" if method == "GET" and query.get("watch") in ("true", "1") else method
        with self._lock:
            for fault in self._faults:
                if fault.method in ("*", method, verb) and fnmatch.fnmatchcase(path, fault.path):
                    fault.times -= 1
                    self._faults = [f for f in self._faults if f.times > 0]
                    raise StatusError(fault.status, f"injected fault ({fault.status})")

    def _admit(self, res: Resource, body: Any, namespace: str) -> Obj:
        """Check what every write must satisfy; return a copy whose top level and metadata are
        the caller's to change."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise StatusError(400, f"the body must be a {res.kind} object, got {json.dumps(body)}")
        given = (body.get("apiVersion", res.api_version), body.get("kind", res.kind))
        if given != (res.api_version, res.kind):
            wanted = f"{res.kind} (apiVersion {res.api_version})"
            raise StatusError(
                400, f"{given[1]} in version {given[0]!r} cannot be handled as a {wanted}"
            )
        obj = body | {"apiVersion": res.api_version, "kind": res.kind}
        meta = obj["metadata"] = dict(body.get("metadata") or {})
        if res.namespaced and meta.setdefault("namespace", namespace) != namespace:
            raise StatusError(400, NAMESPACE_MISMATCH)
        if not res.namespaced:
            meta.pop("namespace", None)
        labels = meta.get("labels") or {}
        for key, value in labels.items() if isinstance(labels, dict) else [(labels, "")]:
            if not (LABEL_KEY.fullmatch(str(key)) and LABEL_VALUE.fullmatch(str(value))):
                label = f"{key}={value}"
                raise invalid(res, meta.get("name", ""), "metadata.labels", label, LABEL_RULE)
        return obj

    def _resource_api(self, res: Resource, obj: Obj) -> None:
        """What the API server does to a `resource.k8s.io` write: validate it against the
        schema of `self.schema`; on a ResourceSlice, stamp taints without `timeAdded`, or drop
        them all where the DRADeviceTaints feature is off (its fields are cleared on write)."""
        if res.group != DRA:
            return
        if self.schema is not None:
            import kubernetes_validate

            try:
                kubernetes_validate.validate(obj, self.schema, strict=True)
            except kubernetes_validate.ValidationError as exc:
                name = obj["metadata"].get("name", "")
                path = ".".join(str(p) for p in exc.path)
                raise invalid(res, name, path, str(exc.instance)[:80], exc.message) from None
        for device in obj.get("spec", {}).get("devices") or () if res.kind == KIND_SLICE else ():
            if not self.device_taints:
                device.pop("taints", None)
            for taint in device.get("taints") or ():
                taint.setdefault("timeAdded", _now())

    def _create(self, res: Resource, namespace: str, body: Any, check_namespace: bool) -> Obj:
        obj = self._admit(res, body, namespace)
        if check_namespace:  # a request, not a test's `put`
            self._resource_api(res, obj)
        meta = obj["metadata"]
        with self._lock:
            store = self._store[res.plural]
            space = self._store["namespaces"].get(("", namespace))
            if res.namespaced and check_namespace and space is None:
                raise not_found(NAMESPACES, namespace)
            if res.namespaced and space is not None and space["metadata"].get("deletionTimestamp"):
                raise terminating(res, meta.get("name") or "", namespace)
            if meta.get("resourceVersion"):
                raise StatusError(500, "resourceVersion should not be set on objects to be created")
            while not meta.get("name") and meta.get("generateName"):
                name = meta["generateName"] + "".join(random.choices(ALPHABET, k=5))
                meta["name"] = None if (namespace, name) in store else name
            name = meta.get("name") or ""
            if not _valid_name(res, name):
                raise invalid(res, name, "metadata.name", name, NAME_RULE)
            if (namespace, name) in store:
                message = f'{res.qualified} "{name}" already exists'
                raise StatusError(409, message, "AlreadyExists", _details(res, name))
            meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": _now(), "generation": 1}
            if res is NAMESPACES:  # what the namespace strategy and controller add
                meta["labels"] = {**meta.get("labels", {}), "kubernetes.io/metadata.name": name}
                obj["status"] = {"phase": "Active"} | obj.get("status", {})
            if res.plural == "pods":
                obj["status"] = {"phase": "Pending"} | obj.get("status", {})
            created = self._commit(res, obj, None)
            if res is NAMESPACES and self.secure:
                self._namespace_defaults(name)
            return created

    def _update(self, res: Resource, namespace: str, name: str, body: Any, sub: str) -> Obj:
        """PUT on the resource (sub "") or its status ("status"); "*" (`put`) writes both."""
        new = self._admit(res, body, namespace)
        if sub != "*":
            self._resource_api(res, new)
        if new["metadata"].get("name") != name:
            given = f"the name of the object ({new['metadata'].get('name')})"
            raise StatusError(400, f"{given} does not match the name on the URL ({name})")
        with self._lock:
            old = self._store[res.plural].get((namespace, name))
            if old is None:
                raise not_found(res, name)
            given = new["metadata"].get("resourceVersion")
            if given and given != old["metadata"]["resourceVersion"]:
                raise conflict(res, name, MODIFIED)
            for field in ("uid", "creationTimestamp", "generation", "resourceVersion"):
                new["metadata"][field] = old["metadata"][field]
            # The resource endpoint ignores status changes, the status endpoint spec changes.
            kept = {"": "status" if res.status else None, "status": "spec"}.get(sub)
            if kept:
                new.pop(kept, None)
                new |= {kept: old[kept]} if kept in old else {}
            if _spec(new) != _spec(old):
                new["metadata"]["generation"] += 1
            return old if new == old else self._commit(res, new, old)  # a no-op is no change

    def _patch(self, res: Resource, ns: str, name: str, ctype: str, patch: Any, sub: str) -> Obj:
        with self._lock:
            old = self._store[res.plural].get((ns, name))
            if old is None:
                raise not_found(res, name)
            return self._update(res, ns, name, apply_patch(old, ctype, patch), sub)

    def _delete(self, res: Resource, namespace: str, name: str, options: Any) -> Obj:
        with self._lock:
            old = self._store[res.plural].get((namespace, name))
            if old is None:
                raise not_found(res, name)
            if res.plural == "pods" and self._graceful(old, options):
                return self._mark_deleted(res, old, options)
            meta = old["metadata"]
            wanted = options.get("preconditions") if isinstance(options, dict) else None
            for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                if isinstance(wanted, dict) and wanted.get(field) not in (None, meta[field]):
                    why = f"{label} in precondition: {wanted[field]}, {label} in object meta: "
                    raise conflict(res, name, f"Precondition failed: {why}{meta[field]}")
            if res is NAMESPACES and not self._emptied(name):
                return self._mark_deleted(res, old, {"gracePeriodSeconds": 0})
            gone = self._commit(res, None, old)
            if res.plural == "pods":
                self._finish_namespace(namespace)
        if res.plural in RETURNS_DELETED:
            return gone
        details = _details(res, name) | {"uid": meta["uid"]}
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": details}

    def _commit(self, res: Resource, new: Obj | None, old: Obj | None) -> Obj:
        """Store `new` (or delete `old`) at the next resourceVersion, and wake the watches."""
        self._rv += 1
        obj = cast(Obj, new or old)
        obj = obj | {"metadata": obj["metadata"] | {"resourceVersion": str(self._rv)}}
        if new is None:
            del self._store[res.plural][_key(obj)]
            for meta in (False, True):
                self._encodings.pop((res.plural, _key(obj), meta), None)
        else:
            self._store[res.plural][_key(obj)] = obj
        kind = "DELETED" if new is None else "MODIFIED" if old else "ADDED"
        self._history.append(Event(self._rv, res.plural, kind, obj, old))
        self._lock.notify_all()
        return obj

    def _emptied(self, namespace: str) -> bool:
        """A namespace's contents deleted, as its controller deletes them: pods that go
        gracefully are marked, the rest go at once. False while pods remain."""
        kept = False
        for other in RESOURCES:
            for key, obj in list(self._store[other.plural].items()):
                if not other.namespaced or key[0] != namespace:
                    continue
                if other.plural == "pods" and self._graceful(obj, None):
                    self._mark_deleted(other, obj, None)
                    kept = True
                else:
                    self._commit(other, None, obj)
        return not kept

    def _finish_namespace(self, namespace: str) -> None:
        """A Terminating namespace goes once its last pod has."""
        space = self._store["namespaces"].get(("", namespace))
        if space is None or not space["metadata"].get("deletionTimestamp"):
            return
        if not any(key[0] == namespace for key in self._store["pods"]):
            self._commit(NAMESPACES, None, space)

    def _graceful(self, pod: Obj, options: Any) -> bool:
        """Whether deleting `pod` only marks it: bound to a node, still running, and the
        delete not one with grace period 0 (the kubelet's final one, or a force delete)."""
        grace = options.get("gracePeriodSeconds") if isinstance(options, dict) else None
        done = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        return self.graceful_delete and bound and not done and grace != 0

    def _mark_deleted(self, res: Resource, obj: Obj, options: Any) -> Obj:
        """A pod (or a namespace, Terminating) marked for deletion, to go later."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj
        grace = options.get("gracePeriodSeconds") if isinstance(options, dict) else None
        if grace is None:
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
        marked = obj | {"metadata": meta | {"deletionTimestamp": _now(),
                                            "deletionGracePeriodSeconds": grace}}  # fmt: skip
        if res is NAMESPACES:
            marked["status"] = {**obj.get("status", {}), "phase": "Terminating"}
        return self._commit(res, marked, obj)

    def _namespace_defaults(self, namespace: str) -> None:
        """What the service account and root CA publisher controllers put in a namespace."""
        account = {"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": namespace}}  # fmt: skip
        self._create(self._resource("serviceaccounts"), namespace, account, False)
        if self.root_ca:
            self._publish_root_ca(namespace)

    def _publish_root_ca(self, namespace: str) -> None:
        config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": namespace},
                      "data": {"ca.crt": self.root_ca}}  # fmt: skip
        res = self._resource("configmaps")
        if (namespace, ROOT_CA_CONFIG_MAP) in self._store[res.plural]:
            self._update(res, namespace, ROOT_CA_CONFIG_MAP, config_map, "*")
        else:
            self._create(res, namespace, config_map, False)

    def serve_tls(self, sock: socket.socket) -> str:
        """Serve HTTPS on `sock` (bound and listening, in whatever network the pods reach
        it from) with a certificate for its address from a CA of this server, which every
        namespace's `kube-root-ca.crt` ConfigMap then holds; returns the CA (PEM)."""
        host = sock.getsockname()[0]
        now = dt.datetime.now(dt.UTC)
        ca = pki.new_ca(now, pki.CA_LIFETIME)
        serving = pki.issue(ca, [host, "kubernetes.default.svc"], now, pki.SERVING_LIFETIME)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            cert.write_bytes(serving.cert_pem())
            key.write_bytes(serving.key_pem())
            context.load_cert_chain(cert, key)
        server = _HttpServer(self, sock, context)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)  # fmt: skip
        thread.start()
        self._tls_servers.append((server, thread))
        with self._lock:
            self.root_ca = ca.cert_pem().decode()
            for _, namespace in list(self._store["namespaces"]):
                self._publish_root_ca(namespace)
        return self.root_ca

    # Authentication, authorization, admission: what a secure server does with a request.

    def authenticate(self, token: str) -> rbac.User:
        """The user a bearer token names, its service account (and pod, node) still there
        with the UIDs it was issued for; 401 otherwise."""
        try:
            claims = self.issuer.claims(token)
            private = claims["kubernetes.io"]
            namespace = private["namespace"]
            found = {
                "serviceaccount": self.get(
                    "serviceaccounts", private["serviceaccount"]["name"], namespace
                ),
                "pod": self.get("pods", private.get("pod", {}).get("name", ""), namespace),
                "node": self.get("nodes", private.get("node", {}).get("name", "")),
            }
            uids = {k: (o or {}).get("metadata", {}).get("uid") for k, o in found.items()}
            return tokens.user_of(claims, uids)
        except (tokens.TokenError, KeyError, TypeError) as exc:
            with self._lock:
                self.authentication_failures.append(str(exc))
            raise StatusError(401, "Unauthorized", "Unauthorized") from None

    def policy(self) -> rbac.Policy:
        """The RBAC objects as stored now."""
        return rbac.Policy(
            self.objects("roles"),
            self.objects("clusterroles"),
            self.objects("rolebindings"),
            self.objects("clusterrolebindings"),
        )

    def _authorize(self, attrs: rbac.Attributes) -> None:
        """403 unless RBAC allows the request (a secure server; the admin always may)."""
        if not self.secure or "system:masters" in attrs.user.groups:
            return
        decision = rbac.authorize(self.policy(), attrs)
        with self._lock:
            self.authorizations.append((attrs, decision))
        if not decision.allowed:
            details = {"name": attrs.name, "kind": attrs.resource} if attrs.name else {}
            details |= {"group": attrs.api_group} if attrs.api_group else {}
            raise StatusError(403, rbac.forbidden_message(attrs), "Forbidden", details or None)

    def _admitted(
        self,
        operation: str,
        res: Resource,
        namespace: str,
        name: str,
        obj: Any,
        old: Obj | None,
        user: rbac.User,
        sub: str = "",
    ) -> Any:
        """`obj` as the admission chain leaves it (a secure server), or refused."""
        if not self.secure or (obj is not None and not isinstance(obj, dict)):
            return obj
        if obj is not None:
            name = name or (obj.get("metadata") or {}).get("name", "")
        request = admission.Request(operation, res.group, res.version, res.plural, res.kind,
                                    namespace if res.namespaced else "", name, obj, old, user,
                                    sub)  # fmt: skip
        mutated = self.chain.mutate(request)
        self.chain.validate(dataclasses.replace(request, obj=mutated))
        return mutated

    def _patch_admitted(
        self, res: Resource, ns: str, name: str, ctype: str, patch: Any, sub: str, user: rbac.User
    ) -> Obj:
        """A patch as the API server applies it: to the stored object, then admitted, then
        written if the object is still the one patched (else again, as GuaranteedUpdate)."""
        while True:
            old = self._store[res.plural].get((ns, name))
            if old is None:
                raise not_found(res, name)
            new = self._admitted("UPDATE", res, ns, name, apply_patch(old, ctype, patch), old,
                                 user, sub)  # fmt: skip
            with self._lock:
                if self._store[res.plural].get((ns, name)) is not old:
                    continue
                new = dict(new)
                new["metadata"] = dict(new.get("metadata") or {})
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                return self._update(res, ns, name, new, sub)

    def _token_request(self, namespace: str, name: str, body: Any) -> Obj:
        """TokenRequest (`serviceaccounts/<name>/token`): a token for the account, bound to
        the pod `spec.boundObjectRef` names (and that pod's node) if it names one."""
        account = self.get("serviceaccounts", name, namespace)
        if account is None:
            raise not_found(self._resource("serviceaccounts"), name)
        spec = (body or {}).get("spec") or {}
        ref = spec.get("boundObjectRef") or {}
        pod = node = None
        if ref:
            if ref.get("kind") != "Pod":
                raise StatusError(400, f"boundObjectRef.kind {ref.get('kind')!r}: only Pod here")
            found = self.get("pods", ref.get("name", ""), namespace)
            if found is None or found["metadata"]["uid"] != ref.get(
                "uid", found["metadata"]["uid"]
            ):
                raise not_found(self._resource("pods"), ref.get("name", ""))
            pod = tokens.Bound(found["metadata"]["name"], found["metadata"]["uid"])
            node_name = found["spec"].get("nodeName")
            node_obj = self.get("nodes", node_name) if node_name else None
            if node_obj is not None:
                node = tokens.Bound(node_name, node_obj["metadata"]["uid"])
        audiences = tuple(spec.get("audiences") or (tokens.AUDIENCE,))
        token, expires = self.issuer.issue(
            namespace,
            tokens.Bound(name, account["metadata"]["uid"]),
            pod=pod,
            node=node,
            audiences=audiences,
            seconds=int(spec.get("expirationSeconds") or 3607),
        )
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec | {"audiences": list(audiences)},
                "status": {"token": token, "expirationTimestamp": stamp}}  # fmt: skip

    def _list(self, res: Resource, namespace: str, query: dict[str, str], meta: bool) -> bytes:
        """A list, or one page of it: `limit` objects in key order, from the snapshot a
        `continue` token names; `meta`: as a PartialObjectMetadataList."""
        match = self._matcher(res, query, "")
        limit = _number(query, "limit")
        page: list[Obj] = []
        with self._lock:
            if query.get("continue"):
                version, start = decode_continue(query["continue"])
            else:
                version, start = self._rv, ""
            objects, paths = self._snapshot(res, version)
            listed: Obj = {"resourceVersion": str(version)}
            for at in range(bisect.bisect_left(paths, start), len(paths)):
                obj = objects[paths[at]]
                if namespace not in ("", _key(obj)[0]) or not match(obj):
                    continue
                if limit and len(page) == limit:
                    listed["continue"] = encode_continue(version, _path(_key(page[-1])) + "\x00")
                    if not query.get("labelSelector") and not query.get("fieldSelector"):
                        listed["remainingItemCount"] = len(paths) - at
                    break
                page.append(obj)
        kind, api_version = (
            ("PartialObjectMetadataList", META) if meta else (f"{res.kind}List", res.api_version)
        )
        head = orjson.dumps({"kind": kind, "apiVersion": api_version, "metadata": listed})
        items = b",".join(self._encoded(res, obj, meta) for obj in page)
        return head[:-1] + b',"items":[' + items + b"]}"

    def _snapshot(self, res: Resource, version: int) -> tuple[dict[str, Obj], list[str]]:
        """The resource's objects as they were at `version`, by key, and the keys in order
        (under the lock): now's, with the changes since undone from the history; 410 Expired
        where it no longer reaches back. Kept while nothing changes: the pages of one list
        cost what they hold, as etcd's ranges do."""
        if version < self._rv and (not self._history or self._history[0].rv > version + 1):
            raise StatusError(410, CONTINUE_EXPIRED, "Expired")
        kept = self._snapshots.get(res.plural)
        if kept is not None and kept[0] == version:
            return kept[1], kept[2]
        objects = {_path(k): o for k, o in self._store[res.plural].items()}
        for event in reversed(self._history if version < self._rv else ()):
            if event.rv <= version:
                break
            if event.resource == res.plural and event.old is None:
                objects.pop(_path(_key(event.obj)), None)
            elif event.resource == res.plural and event.old is not None:
                objects[_path(_key(event.obj))] = event.old
        paths = sorted(objects)
        self._snapshots[res.plural] = (version, objects, paths)
        return objects, paths

    def _encoded(self, res: Resource, obj: Obj, meta: bool) -> bytes:
        """An object as a list item (untyped, as lists hold them; or PartialObjectMetadata),
        encoded once while it is the stored one: the bulk of a large list's cost."""
        key = (res.plural, _key(obj), meta)
        kept = self._encodings.get(key)
        if kept is not None and kept[0] is obj:
            return kept[1]
        item = partial(obj) if meta else {k: v for k, v in obj.items() if k not in TYPE_FIELDS}
        data = orjson.dumps(item)
        if self._store[res.plural].get(_key(obj)) is obj:
            self._encodings[key] = (obj, data)
        return data

    def _matcher(self, res: Resource, query: dict[str, str], name: str) -> Match:
        labels = label_selector(query.get("labelSelector", ""))
        fields = field_selector(query.get("fieldSelector", ""), res)
        return lambda o: (
            labels(o["metadata"].get("labels") or {})
            and fields(o)
            and (name in ("", o["metadata"]["name"]))
        )

    def _watch(self, res: Resource, ns: str, name: str, query: dict[str, str]) -> Events:
        """Check the request, then stream: the checks fail before the response starts."""
        match = self._matcher(res, query, name)
        timeout = _number(query, "timeoutSeconds")
        start = _number(query, "resourceVersion") or None  # unset and "0": state first
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + timeout if timeout else math.inf
        return self._stream(res, ns, match, start, bookmarks, deadline)

    def _stream(
        self,
        res: Resource,
        ns: str,
        match: Match,
        start: int | None,
        bookmarks: bool,
        deadline: float,
    ) -> Events:
        with self._lock:
            epoch, cursor = self._epoch, self._rv if start is None else start
            state = sorted(self._store[res.plural].items()) if start is None else []
        for (namespace, _), obj in state:
            if ns in ("", namespace) and match(obj):
                yield {"type": "ADDED", "object": obj}
        bookmark_at = time.monotonic() + self.bookmark_interval if bookmarks else math.inf
        while True:
            with self._lock:
                while self._rv <= cursor and self._epoch == epoch and not self._closing:
                    wake = min(deadline, bookmark_at)
                    if time.monotonic() >= wake:
                        break
                    self._lock.wait(min(wake - time.monotonic(), 60))
                if self._epoch != epoch or self._closing or time.monotonic() >= deadline:
                    return
                oldest = self._history[0].rv if self._history else self._rv + 1
                events = [e for e in self._history if e.rv > cursor]
                cursor, resumed_from = max(cursor, self._rv), cursor
            if resumed_from < oldest - 1:  # changes it must see are gone from the history
                message = f"too old resource version: {resumed_from} ({oldest - 1})"
                yield {"type": "ERROR", "object": StatusError(410, message, "Expired").status}
                return
            for event in events:
                if event.resource == res.plural and ns in ("", _key(event.obj)[0]):
                    yield from _seen_as(event, match)
            if time.monotonic() >= bookmark_at:
                meta = {"resourceVersion": str(cursor)}
                object_ = {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}
                yield {"type": "BOOKMARK", "object": object_}
                bookmark_at = time.monotonic() + self.bookmark_interval


def _seen_as(event: Event, match: Match) -> Events:
    """What a watch with a selector sees: objects entering it are ADDED, leaving it DELETED."""
    now = event.type != "DELETED" and match(event.obj)
    before = event.old is not None and match(event.old)
    if now:
        yield {"type": "MODIFIED" if before else "ADDED", "object": event.obj}
    elif before and event.old is not None:
        version = {"resourceVersion": event.obj["metadata"]["resourceVersion"]}
        yield {
            "type": "DELETED",
            "object": event.old | {"metadata": event.old["metadata"] | version},
        }


def _number(query: dict[str, str], name: str) -> int:
    value = query.get(name, "")
    if value and not value.isdigit():
        raise StatusError(400, f"{name}: Invalid value: {value!r}: must be a non-negative integer")
    return int(value or 0)


# HTTP: the handler parses a request, calls one verb and writes what it returns.


class _HttpServer(ThreadingHTTPServer):
    """The plain listener on 127.0.0.1 (the admin's, as the test harness is), or, given a
    listening socket and a TLS context, the HTTPS one pods reach."""

    daemon_threads = True

    def __init__(
        self, api: ApiServer, sock: socket.socket | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler, bind_and_activate=sock is None)
        if sock is not None:
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()
        self.api, self.tls = api, tls

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept; the TLS handshake happens in the request's thread, on its first read."""
        conn, address = self.socket.accept()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, address


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `ApiServer.requests`."""

    def setup(self) -> None:
        super().setup()
        self.api = cast(_HttpServer, self.server).api
        with self.api._lock:
            self.api._sockets.add(self.connection)

    def finish(self) -> None:
        with self.api._lock:
            self.api._sockets.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        content_type = self.headers.get("Content-Type", "")
        with self.api._lock:
            self.api._in_flight += 1
            accept = self.headers.get("Accept", "")
            self.api.requests.append(Request(self.command, url.path, query, content_type, accept))
        try:
            self._answer(url.path, url.query, query, content_type)
        finally:
            with self.api._lock:
                self.api._in_flight -= 1
                self.close_connection |= self.api._closing  # no next request on this one
                self.api._lock.notify_all()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _answer(self, path: str, raw_query: str, query: dict[str, str], content_type: str) -> None:
        try:
            raw = self._body()
            user = self._user()
            self.api._authorize(rbac.attributes(user, self.command, path, raw_query))
            self.api._fault(self.command, path, query)
            try:
                body = json.loads(raw) if raw else None
            except ValueError as e:
                raise StatusError(400, f"the request body is not valid JSON: {e}") from e
            parts = [p for p in path.split("/") if p]
            self._route(self.command, parts, query, content_type, body, user)
        except admission.Rejection as e:
            self._send(e.code, StatusError(e.code, e.message, e.reason).status)
        except StatusError as e:
            self._send(e.code, e.status)
        except Exception as e:  # a bug here, not in the request: say so, keep serving
            self._send(500, StatusError(500, f"test apiserver bug: {e!r}").status)

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length") or "0"
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "")
        if not length.isdigit() or int(length) > MAX_BODY or chunked:
            self.close_connection = True
            raise StatusError(413, f"a request body needs a Content-Length of at most {MAX_BODY}")
        return self.rfile.read(int(length))

    def _user(self) -> rbac.User:
        """Who sent the request: a bearer token's user (401 if the token does not hold);
        without one, the admin on the plain listener, anonymous on the TLS one."""
        scheme, _, token = self.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer":  # the scheme is case-insensitive (RFC 6750, 7235)
            return self.api.authenticate(token.strip())
        if cast(_HttpServer, self.server).tls is not None:
            return rbac.User(rbac.ANONYMOUS, groups=(rbac.UNAUTHENTICATED,))
        return ADMIN

    def _route(
        self,
        method: str,
        parts: list[str],
        query: dict[str, str],
        ctype: str,
        body: Any,
        user: rbac.User = ADMIN,
    ) -> None:
        api = self.api
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return self._send(200, "ok")
        if (document := _discovery(parts)) is not None:
            return self._send(200, document)
        res, namespace, name, sub = _target(parts)
        if "dryRun" in query:
            raise StatusError(400, f"dryRun={query['dryRun']}: not supported by the test apiserver")
        accept = self.headers.get("Accept", "")
        if method == "GET" and query.get("watch") in ("true", "1") and not sub:
            meta = metadata_only(accept, listing=False)
            return self._stream(api._watch(res, namespace, name, query), meta)
        if method == "GET" and name:
            meta = metadata_only(accept, listing=False)
            obj = api._store[res.plural].get((namespace, name))
            if obj is None:
                return self._send(404, not_found(res, name).status)
            return self._send(200, partial(obj) if meta and not sub else obj)
        if method == "GET":
            meta = metadata_only(accept, listing=True)
            return self._send(200, api._list(res, namespace, query, meta))
        if method == "POST" and sub == "token" and name:
            return self._send(201, api._token_request(namespace, name, body))
        if method == "POST" and not name and (namespace or not res.namespaced):
            body = api._admitted("CREATE", res, namespace, "", body, None, user)
            return self._send(201, api._create(res, namespace, body, check_namespace=True))
        if method == "PUT" and name:
            old = api._store[res.plural].get((namespace, name))
            body = api._admitted("UPDATE", res, namespace, name, body, old, user, sub)
            return self._send(200, api._update(res, namespace, name, body, sub))
        if method == "PATCH" and name:
            if not api.secure:
                return self._send(200, api._patch(res, namespace, name, ctype, body, sub))
            return self._send(
                200, api._patch_admitted(res, namespace, name, ctype, body, sub, user)
            )
        if method == "DELETE" and name and not sub:
            old = api._store[res.plural].get((namespace, name))
            api._admitted("DELETE", res, namespace, name, None, old, user)
            return self._send(200, api._delete(res, namespace, name, body))
        raise StatusError(405, "the server does not allow this method on the requested resource")

    def _send(self, code: int, body: Obj | str | bytes) -> None:
        """A JSON object (or its encoding, as bytes), or plain text."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        data = data.encode() if isinstance(data, str) else data
        self.send_response(code)
        self.send_header(
            "Content-Type", "text/plain" if isinstance(body, str) else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Events, meta: bool) -> None:
        """A watch: one JSON event per line and per HTTP chunk, until the watch ends; `meta`:
        each object (a bookmark's too, not an error's Status) as PartialObjectMetadata."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                if meta and event["type"] != "ERROR":
                    event = event | {"object": partial(event["object"])}
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            events.close()


def _discovery(parts: list[str]) -> Obj | None:
    """/version and the discovery documents: /api, /apis, /apis/<group>, /api/v1, /apis/<g>/<v>."""
    groups = sorted({r.group for r in RESOURCES if r.group})
    if parts == ["version"]:
        return VERSION
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups]}
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
        return {"kind": "APIGroup", "apiVersion": "v1"} | _group(parts[1])
    served = [r for r in RESOURCES if parts in (["api", r.version], ["apis", r.group, r.version])]
    served = [r for r in served if (parts[0] == "api") == (not r.group)]
    resources = []
    for r in served:
        about = {"namespaced": r.namespaced, "kind": r.kind}
        resources.append({"name": r.plural, "singularName": r.kind.lower(), "verbs": VERBS} | about)
        if r.status:
            status_verbs = ["get", "patch", "update"]
            status = {"name": f"{r.plural}/status", "singularName": "", "verbs": status_verbs}
            resources.append(status | about)
    if not served:
        return None
    listing = {"kind": "APIResourceList", "apiVersion": "v1", "resources": resources}
    return listing | {"groupVersion": served[0].api_version}


def _group(group: str) -> Obj:
    versions = [{"groupVersion": f"{group}/v1", "version": "v1"}]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _target(parts: list[str]) -> tuple[Resource, str, str, str]:
    """(resource, namespace, name, subresource) of a resource path, "" where absent."""
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise PATH_NOT_FOUND
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] != "status":
        namespace, rest = rest[1], rest[2:]
    plural, name, sub = [*rest, "", "", ""][:3]
    found = [r for r in RESOURCES if (r.group, r.version, r.plural) == (group, version, plural)]
    if not found or len(rest) > 3:
        raise PATH_NOT_FOUND
    res = found[0]
    if (namespace and not res.namespaced) or (res.namespaced and name and not namespace):
        raise PATH_NOT_FOUND
    served = ("status",) * res.status + SUBRESOURCES.get(res.plural, ())
    if sub and sub not in served:
        raise PATH_NOT_FOUND
    return res, namespace, name, sub
