"""A container's environment and command line as the kubelet makes them
(kubernetes/kubernetes `pkg/kubelet/kubelet_pods.go`, makeEnvironmentVariables;
`third_party/forked/golang/expansion/expand.go` for `$(VAR)`; "Expose Pod Information to
Containers Through Environment Variables", kubernetes.io/docs/tasks/inject-data-application/
environment-variable-expose-pod-information/): `envFrom` first, in order, then `env`, each
value `$(VAR)`-expanded against what came before and the service variables; `valueFrom` from
the downward API (`fieldRef`, `resourceFieldRef` with its divisor, rounded up; a limit
not set is the node's allocatable), ConfigMaps and Secrets (`optional` honoured); then the
`kubernetes` Service's variables (KUBERNETES_SERVICE_HOST and friends: the API server as the
pods reach it); `command` and `args` expanded against the result.

Left out: the variables of the namespace's other Services (no ClusterIPs here: there is no
kube-proxy), `fileKeyRef`.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from testbed.volumes import Read, field_value

Obj = dict[str, Any]
SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


class EnvError(Exception):
    """A variable the kubelet cannot resolve (CreateContainerConfigError)."""


def quantity(text: str) -> Decimal:
    """A resource quantity (`20m`, `64Mi`, `1e3`) as a number."""
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)", str(text).strip())
    if match is None or match[2] not in ("", *SUFFIXES):
        raise EnvError(f"quantity {text!r}: not a Kubernetes quantity")
    return Decimal(match[1]) * Decimal(str(SUFFIXES.get(match[2], 1)))


def expand(text: str, values: Mapping[str, str]) -> str:
    """`$(VAR)` replaced by the variable where it is defined (left as written where not),
    `$$` by `$`."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return values.get(match[1], match[0])

    return _REFERENCE.sub(one, text)


def resource_value(container: Obj, ref: Obj, allocatable: Mapping[str, str]) -> str:
    """A resourceFieldRef: the container's request or limit (a limit it does not set is the
    node's allocatable), over the divisor, rounded up (cpu: 1 core by default)."""
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    given = (resources.get(kind) or {}).get(name)
    if given is None and kind == "limits":
        given = allocatable.get(name)
    if given is None:
        return "0"
    divisor = quantity(ref.get("divisor", "1"))
    return str(math.ceil(quantity(given) / divisor))


def _from_source(kind: str, ref: Obj, namespace: str, read: Read) -> dict[str, str] | None:
    resource = "secrets" if kind == "secret" else "configmaps"
    found = read(resource, ref["name"], namespace)
    if found is None:
        if ref.get("optional"):
            return None
        what = "secret" if kind == "secret" else "configmap"
        raise EnvError(f'{what} "{ref["name"]}" not found')
    data = found.get("data") or {}
    if kind == "secret":
        return {k: base64.b64decode(v).decode() for k, v in data.items()}
    return dict(data)


def environment(
    pod: Obj,
    container: Obj,
    read: Read,
    services: Mapping[str, str],
    allocatable: Mapping[str, str],
) -> list[tuple[str, str]]:
    """The container's variables, in the order the kubelet hands them to the runtime."""
    namespace = pod["metadata"]["namespace"]
    values: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        kind = "secret" if "secretRef" in source else "configMap"
        data = _from_source(kind, source[f"{kind}Ref"], namespace, read)
        for key, value in (data or {}).items():
            values[source.get("prefix", "") + key] = value
    for var in container.get("env") or ():
        name = var["name"]
        if "valueFrom" not in var:
            values[name] = expand(var.get("value", ""), {**services, **values})
            continue
        ref = var["valueFrom"]
        if "fieldRef" in ref:
            values[name] = field_value(pod, ref["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in ref:
            values[name] = resource_value(container, ref["resourceFieldRef"], allocatable)
        else:
            kind = "secret" if "secretKeyRef" in ref else "configMap"
            key_ref = ref[f"{kind}KeyRef"]
            data = _from_source(kind, key_ref, namespace, read)
            if data is None:
                continue
            if key_ref["key"] not in data:
                if key_ref.get("optional"):
                    continue
                what = "secret" if kind == "secret" else "configmap"
                raise EnvError(
                    f"couldn't find key {key_ref['key']} in {what} {namespace}/{key_ref['name']}"
                )
            values[name] = data[key_ref["key"]]
    return [*values.items(), *((k, v) for k, v in services.items() if k not in values)]


def command_line(container: Obj, env: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """`command` and `args` with `$(VAR)` expanded against the container's variables."""
    values = dict(env)
    return (
        [expand(word, values) for word in container.get("command") or ()],
        [expand(word, values) for word in container.get("args") or ()],
    )


def kubernetes_service(host: str, port: int) -> dict[str, str]:
    """The `kubernetes` Service's variables, naming the API server at `host:port`."""
    url = f"tcp://{host}:{port}"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": url,
        f"KUBERNETES_PORT_{port}_TCP": url,
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }
