"""A cluster to install gpuwire on: the API server stand-in, secure (testbed/apiserver.py),
its controllers and scheduler (testbed/controllers.py), and one sandboxed GPU node
(testbed/node.py) with its kubelet (testbed/kubelet_pods.py). Pods reach the API server at
https://10.88.0.1:443 (the `kubernetes` Service's variables, the root CA in every
namespace's `kube-root-ca.crt`); the API server reaches webhooks in pods through the node's
network.

`apply` creates or updates objects as `kubectl apply` would for the ones gpuwire ships: a
new object is created; an existing one gets a strategic merge patch of what is given, so
what others wrote into it (a webhook's caBundle, a Secret's data) stays. `delete` deletes as
`kubectl delete` does (a pod goes gracefully, its owner's dependents through the garbage
collector).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwire import sim
from testbed import containerds
from testbed.apiserver import STRATEGIC, ApiServer, StatusError
from testbed.containerds import Generation
from testbed.controllers import Controllers
from testbed.kubelet_pods import NodeKubelet
from testbed.node import GATEWAY, Node
from testbed.waiting import until

Obj = dict[str, Any]
API_PORT = 443


@dataclass
class Cluster:
    api: ApiServer
    node: Node
    kubelet: NodeKubelet
    controllers: Controllers

    def apply(self, objects: Iterable[Obj]) -> None:
        """Create each object, or patch it with what is given (`kubectl apply` of objects
        whose fields only gpuwire's manifests set)."""
        for obj in objects:
            res = self.api._resource_of(obj)
            meta = obj["metadata"]
            namespace = meta.get("namespace", "") if res.namespaced else ""
            if self.api.get(res.plural, meta["name"], namespace) is None:
                self.api.create(obj)
            else:
                self.api.patch(res.plural, meta["name"], namespace, obj, STRATEGIC)

    def delete(self, objects: Iterable[Obj]) -> None:
        """Delete each object that is there (`kubectl delete --ignore-not-found`)."""
        for obj in objects:
            res = self.api._resource_of(obj)
            meta = obj["metadata"]
            namespace = meta.get("namespace", "") if res.namespaced else ""
            with contextlib.suppress(StatusError):
                self.api.delete(res.plural, meta["name"], namespace)

    def pods(self, namespace: str, labels: dict[str, str]) -> list[Obj]:
        return [
            p
            for p in self.api.objects("pods", namespace)
            if labels.items() <= (p["metadata"].get("labels") or {}).items()
        ]

    def wait_gone(self, namespace: str, labels: dict[str, str], timeout: float = 120) -> None:
        until(lambda: not self.pods(namespace, labels), timeout)


@contextlib.contextmanager
def up(
    generation: Generation | None = None,
    *,
    node_name: str = "gpu-node-0",
    labels: dict[str, str] | None = None,
    machine: sim.Machine | None = None,
    images: Iterable[Path] = (),
    backoff: float = 1.0,
    refresh: float = 1.0,
) -> Iterator[Cluster]:
    """The cluster, torn down (node, kubelet, loops, API server) when the block ends.
    `backoff` and `refresh`: the kubelet's restart back-off and volume refresh, shorter
    than a real kubelet's (10 s, about a minute) so that a test waits seconds for what a
    cluster does in minutes; the order of events is the same."""
    generation = generation or containerds.system()
    with ExitStack() as stack:
        node = stack.enter_context(Node.start(node_name, generation, machine))
        for image in images:
            node.import_image(image)
        api = stack.enter_context(
            ApiServer(secure=True, connect=node.connect, graceful_delete=True)
        )
        api.serve_tls(node.listen(GATEWAY, API_PORT))
        kubelet = stack.enter_context(
            NodeKubelet(
                api, node, (GATEWAY, API_PORT), labels=labels, backoff=backoff, refresh=refresh
            )
        )
        controllers = stack.enter_context(Controllers(api))
        yield Cluster(api, node, kubelet, controllers)
