"""Kubernetes RBAC as kube-apiserver's authorizer applies it: who a request is, what it asks
for, and which rule of which Role or ClusterRole allows it. Pure: the objects come in, a
decision goes out.

Sources: "Using RBAC Authorization" (kubernetes.io/docs/reference/access-authn-authz/rbac/)
for the objects and their scope (a RoleBinding grants its Role's, or a ClusterRole's, rules in
its own namespace only; a ClusterRoleBinding grants a ClusterRole's everywhere); "Authorization"
(kubernetes.io/docs/reference/access-authn-authz/authorization/, "Determine the request verb")
for the verbs of a request; k8s.io/apiserver `pkg/endpoints/request/requestinfo.go` for the
attributes read from a path (a list or watch with `fieldSelector=metadata.name=N` is a
request for N); kubernetes/kubernetes `plugin/pkg/auth/authorizer/rbac/rbac.go` and
`pkg/apis/rbac/v1/evaluation_helpers.go` for the matching (`*` in verbs, groups and resources;
`resource/subresource` and `*/subresource`; `resourceNames` only for requests that name an
object; `nonResourceURLs` with a trailing `*`); k8s.io/apiserver
`pkg/endpoints/handlers/responsewriters/errors.go` (`forbiddenMessage`) for the wording of a
denial. The bootstrap roles every cluster has for discovery are `BOOTSTRAP`
(`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`: system:discovery,
system:public-info-viewer).

Left out: aggregated ClusterRoles (`aggregationRule`: gpuwire's manifests have none; a role
with one is refused, not guessed at), the `escalate` and `bind` checks on writes of RBAC
objects, impersonation, and the other authorizers (Node, webhook).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

Obj = dict[str, Any]
API_GROUP = "rbac.authorization.k8s.io"
AUTHENTICATED, UNAUTHENTICATED = "system:authenticated", "system:unauthenticated"
ANONYMOUS = "system:anonymous"


@dataclass(frozen=True)
class User:
    """Who sent a request, as an authenticator says (k8s.io/apiserver `user.Info`)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Attributes:
    """What a request asks for (k8s.io/apiserver `authorizer.Attributes`)."""

    user: User
    verb: str
    resource_request: bool
    path: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined(self) -> str:
        """`resource/subresource`, or the resource: what a rule's `resources` names."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True)
class Grant:
    """The rule that allowed a request: rule `index` of `role` (`Kind/namespace/name`, the
    namespace empty for a ClusterRole), bound by `binding`."""

    role: str
    index: int
    binding: str


@dataclass(frozen=True)
class Decision:
    allowed: bool
    grant: Grant | None = None


# --- the request's attributes


def attributes(user: User, method: str, path: str, query: str = "") -> Attributes:
    """A request's attributes from its method, path and query (requestinfo.go)."""
    parts = [p for p in path.split("/") if p]
    params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:  # discovery, /version, /healthz: a non-resource request
        return Attributes(user, method.lower(), False, path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]  # a namespaced resource; else the Namespace itself
    resource, name, subresource = [*rest, "", "", ""][:3]
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, "get"
    )
    if verb == "get" and not name:
        verb = "watch" if params.get("watch") in ("true", "1") else "list"
        name = _named_by_field(params.get("fieldSelector", ""))
    elif verb == "delete" and not name:
        verb = "deletecollection"
    return Attributes(user, verb, True, path, group, resource, subresource, namespace, name)


def _named_by_field(selector: str) -> str:
    """The name a `metadata.name=N` (or `==`) field selector picks, else ""."""
    for term in selector.split(","):
        if "!=" in term:
            continue
        key, _, value = term.partition("==") if "==" in term else term.partition("=")
        if key.strip() == "metadata.name":
            return value.strip()
    return ""


# --- matching


def verb_matches(rule: Obj, verb: str) -> bool:
    verbs = rule.get("verbs") or []
    return "*" in verbs or verb in verbs


def group_matches(rule: Obj, group: str) -> bool:
    groups = rule.get("apiGroups") or []
    return "*" in groups or group in groups


def resource_matches(rule: Obj, attrs: Attributes) -> bool:
    for named in rule.get("resources") or []:
        if named in ("*", attrs.combined):
            return True
        if attrs.subresource and named == f"*/{attrs.subresource}":
            return True
    return False


def name_matches(rule: Obj, name: str) -> bool:
    """A rule with `resourceNames` matches only a request for one of them: never a create,
    a list or a watch of a whole collection (they name no object)."""
    names = rule.get("resourceNames") or []
    return not names or name in names


def url_matches(rule: Obj, path: str) -> bool:
    for url in rule.get("nonResourceURLs") or []:
        if url == "*" or url == path or (url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    if not verb_matches(rule, attrs.verb):
        return False
    if not attrs.resource_request:
        return url_matches(rule, attrs.path)
    return (
        group_matches(rule, attrs.api_group)
        and resource_matches(rule, attrs)
        and name_matches(rule, attrs.name)
    )


def subject_matches(subject: Obj, user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


# --- the authorizer


@dataclass(frozen=True)
class Policy:
    """The RBAC objects of a cluster, as listed from the API server."""

    roles: Sequence[Obj] = ()
    cluster_roles: Sequence[Obj] = ()
    role_bindings: Sequence[Obj] = ()
    cluster_role_bindings: Sequence[Obj] = ()

    def role(self, kind: str, name: str, namespace: str) -> Obj | None:
        found = self.cluster_roles if kind == "ClusterRole" else self.roles
        for role in found:
            meta = role["metadata"]
            if meta["name"] == name and (
                kind == "ClusterRole" or meta.get("namespace") == namespace
            ):
                if role.get("aggregationRule"):
                    raise ValueError(f"ClusterRole {name}: aggregationRule is left out here")
                return role
        return None


def role_key(role: Obj) -> str:
    meta = role["metadata"]
    return f"{role['kind']}/{meta.get('namespace', '')}/{meta['name']}"


def _bound(policy: Policy, attrs: Attributes) -> Iterable[tuple[Obj, Obj]]:
    """(binding, role) pairs that apply to the request: every ClusterRoleBinding, and the
    RoleBindings of the request's namespace (none for a cluster-scoped request)."""
    for binding in policy.cluster_role_bindings:
        ref = binding.get("roleRef") or {}
        if ref.get("kind") == "ClusterRole":
            role = policy.role("ClusterRole", ref.get("name", ""), "")
            if role is not None:
                yield binding, role
    if not attrs.namespace or not attrs.resource_request:
        return
    for binding in policy.role_bindings:
        if binding["metadata"].get("namespace") != attrs.namespace:
            continue
        ref = binding.get("roleRef") or {}
        role = policy.role(ref.get("kind", ""), ref.get("name", ""), attrs.namespace)
        if role is not None:
            yield binding, role


def authorize(policy: Policy, attrs: Attributes) -> Decision:
    """Allowed, with the first rule that allows it (bindings in list order, as the
    authorizer visits them), or denied: RBAC only ever allows."""
    for binding, role in _bound(policy, attrs):
        namespace = binding["metadata"].get("namespace", "")
        if not any(
            subject_matches(s, attrs.user, namespace) for s in binding.get("subjects") or ()
        ):
            continue
        for index, rule in enumerate(role.get("rules") or ()):
            if rule_allows(rule, attrs):
                return Decision(True, Grant(role_key(role), index, role_key(binding)))
    return Decision(False)


def forbidden_message(attrs: Attributes) -> str:
    """The Status message of a 403, in kube-apiserver's words."""
    user = f'User "{attrs.user.name}"'
    if not attrs.resource_request:
        return f'forbidden: {user} cannot {attrs.verb} path "{attrs.path}"'
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    head = f'{qualified} "{attrs.name}" is forbidden' if attrs.name else f"{qualified} is forbidden"
    what = f'cannot {attrs.verb} resource "{attrs.combined}" in API group "{attrs.api_group}"'
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    return f"{head}: {user} {what} {where}"


# --- what every cluster has: discovery for everyone (bootstrappolicy/policy.go)

DISCOVERY_URLS = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
]
PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _bootstrap_role(name: str, urls: list[str], groups: list[str]) -> tuple[Obj, Obj]:
    meta = {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}
    role = {
        "apiVersion": f"{API_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": meta,
        "rules": [{"nonResourceURLs": urls, "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": f"{API_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": dict(meta),
        "roleRef": {"apiGroup": API_GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": API_GROUP, "kind": "Group", "name": g} for g in groups],
    }
    return role, binding


BOOTSTRAP: tuple[Obj, ...] = (
    *_bootstrap_role("system:discovery", DISCOVERY_URLS, [AUTHENTICATED]),
    *_bootstrap_role("system:public-info-viewer", PUBLIC_URLS, [AUTHENTICATED, UNAUTHENTICATED]),
)
