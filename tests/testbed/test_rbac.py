"""RBAC as the API server stand-in enforces it, through the real `kubernetes` client with a
service account's bound token, as a pod's in-cluster client sends it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from testbed import rbac
from testbed.apiserver import ApiServer

Obj = dict[str, Any]
NS = "team"
ACCOUNT = "agent"
USER = f"system:serviceaccount:{NS}:{ACCOUNT}"


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(secure=True) as server:
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        server.put({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": ACCOUNT, "namespace": NS}})  # fmt: skip
        yield server


def token(api: ApiServer, pod: str = "") -> str:
    """A bound token as the kubelet gets it (TokenRequest), bound to `pod` if named."""
    body: Obj = {"spec": {}}
    if pod:
        found = api.get("pods", pod, NS)
        assert found is not None
        body["spec"]["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod,
                                          "uid": found["metadata"]["uid"]}  # fmt: skip
    with api.client() as admin:
        v1: Any = client.CoreV1Api(admin)
        answer = v1.create_namespaced_service_account_token(ACCOUNT, NS, body)
    return str(answer.status.token)


def core(api: ApiServer, bearer: str) -> Any:
    configuration = client.Configuration(host=api.url)
    configuration.api_key = {"authorization": f"Bearer {bearer}"}
    return client.CoreV1Api(client.ApiClient(configuration))


def grant(api: ApiServer, rules: list[Obj], *, cluster: bool, namespace: str = NS) -> None:
    """A role with `rules`, bound to the account: a ClusterRole by a ClusterRoleBinding
    (`cluster`), else by a RoleBinding in `namespace`."""
    group = "rbac.authorization.k8s.io/v1"
    api.put({"apiVersion": group, "kind": "ClusterRole", "metadata": {"name": "r"},
             "rules": rules})  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS}
    ref = {"apiGroup": rbac.API_GROUP, "kind": "ClusterRole", "name": "r"}
    meta: Obj = {"name": "b"} | ({} if cluster else {"namespace": namespace})
    kind = "ClusterRoleBinding" if cluster else "RoleBinding"
    api.put({"apiVersion": group, "kind": kind, "metadata": meta, "roleRef": ref,
             "subjects": [subject]})  # fmt: skip


def status_of(call: Callable[[], object]) -> Obj:
    with pytest.raises(ApiException) as caught:
        call()
    status: Obj = json.loads(caught.value.body or "")
    assert status["code"] == caught.value.status
    return status


def test_a_token_authenticates_as_its_service_account_and_nothing_more(api: ApiServer) -> None:
    v1 = core(api, token(api))
    status = status_of(lambda: v1.list_node())
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        f'nodes is forbidden: User "{USER}" cannot list resource "nodes" in API group "" '
        "at the cluster scope"
    )
    (attrs, decision) = api.authorizations[-1]
    assert attrs.user.groups == ("system:serviceaccounts", f"system:serviceaccounts:{NS}",
                                 rbac.AUTHENTICATED)  # fmt: skip
    assert not decision.allowed


def test_a_bad_or_unbound_token_is_401(api: ApiServer) -> None:
    assert status_of(lambda: core(api, "not-a-token").list_node())["code"] == 401
    api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
             "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    bound = token(api, "p")
    grant(api, [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}], cluster=True)
    assert core(api, bound).list_node()
    api.delete("pods", "p", NS)  # a bound token dies with its pod
    assert status_of(lambda: core(api, bound).list_node())["reason"] == "Unauthorized"


def test_verbs_are_distinct_get_list_watch(api: ApiServer) -> None:
    grant(api, [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}], cluster=True)
    v1 = core(api, token(api))
    assert v1.read_node("n1")
    assert status_of(lambda: v1.list_node())["code"] == 403
    assert status_of(lambda: v1.list_node(watch=True, timeout_seconds=1))["code"] == 403


def test_resource_names_allow_only_requests_that_name_the_object(api: ApiServer) -> None:
    rule = {"apiGroups": [""], "resources": ["nodes"], "resourceNames": ["n1"],
            "verbs": ["get", "list", "watch", "patch"]}  # fmt: skip
    grant(api, [rule], cluster=True)
    api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
    v1 = core(api, token(api))
    assert v1.read_node("n1")
    assert status_of(lambda: v1.read_node("n2"))["code"] == 403
    assert status_of(lambda: v1.list_node())["code"] == 403  # a list names no object
    # ... but a list picking the name by field selector is a request for it
    assert [n.metadata.name for n in v1.list_node(field_selector="metadata.name=n1").items] == [
        "n1"
    ]


def test_a_subresource_is_its_own_resource(api: ApiServer) -> None:
    grant(api, [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}], cluster=True)
    v1 = core(api, token(api))
    v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    status = status_of(lambda: v1.patch_node_status("n1", {"status": {"capacity": {"x/y": "1"}}}))
    assert status["message"] == (
        f'nodes "n1" is forbidden: User "{USER}" cannot patch resource "nodes/status" in API '
        'group "" at the cluster scope'
    )
    grant(api, [{"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]}], cluster=True)
    assert v1.patch_node_status("n1", {"status": {"capacity": {"x/y": "1"}}})
    assert status_of(lambda: v1.patch_node("n1", {"metadata": {"labels": {"c": "d"}}}))


def test_a_role_binding_grants_only_in_its_namespace(api: ApiServer) -> None:
    """A ClusterRole through a RoleBinding: its rules, in the binding's namespace only."""
    grant(api, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "create"]}],
          cluster=False)  # fmt: skip
    v1 = core(api, token(api))
    assert v1.list_namespaced_config_map(NS) is not None
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    status = status_of(lambda: v1.list_namespaced_config_map("default"))
    assert status["message"].endswith('in the namespace "default"')
    assert status_of(lambda: v1.list_config_map_for_all_namespaces())["code"] == 403


def test_eviction_is_a_subresource_create(api: ApiServer) -> None:
    attrs = rbac.attributes(rbac.User(USER), "POST", f"/api/v1/namespaces/{NS}/pods/p/eviction", "")
    assert (attrs.verb, attrs.resource, attrs.subresource, attrs.name) == (
        "create", "pods", "eviction", "p"
    )  # fmt: skip
    assert rbac.rule_allows({"apiGroups": [""], "resources": ["pods/eviction"],
                             "verbs": ["create"]}, attrs)  # fmt: skip
    assert not rbac.rule_allows({"apiGroups": [""], "resources": ["pods"],
                                 "verbs": ["create"]}, attrs)  # fmt: skip


def test_discovery_is_open_to_the_authenticated_and_health_to_everyone(api: ApiServer) -> None:
    attrs = rbac.attributes(rbac.User(rbac.ANONYMOUS, groups=(rbac.UNAUTHENTICATED,)), "GET",
                            "/healthz")  # fmt: skip
    assert rbac.authorize(api.policy(), attrs).allowed
    anonymous_api = rbac.attributes(attrs.user, "GET", "/apis")
    assert not rbac.authorize(api.policy(), anonymous_api).allowed
    v1 = core(api, token(api))
    assert v1.get_api_resources()


def test_the_grant_names_the_rule_that_allowed_a_request(api: ApiServer) -> None:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
             {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]  # fmt: skip
    grant(api, rules, cluster=True)
    core(api, token(api)).read_node("n1")
    _, decision = api.authorizations[-1]
    assert decision.grant == rbac.Grant("ClusterRole//r", 1, "ClusterRoleBinding//b")
