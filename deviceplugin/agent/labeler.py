"""Writing GPU labels, the GPU annotation and extended-resource capacity to this node's Node
object through the `kubernetes` client. Only what changed is patched; a node that already
carries the right labels costs one GET."""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import kubeclient
from deviceplugin import vendors
from deviceplugin.agent import labels, mps
from deviceplugin.config import Config
from deviceplugin.gpus.discovery import REDISCOVER, Latest, NodeGpus
from gpuwire import holders, mig

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# every vendor's: a node's keys of another go
OWNED = tuple(k for v in vendors.NODE_VENDORS for k in v.owned)
JSON_PATCH = "application/json-patch+json"


def core_api(kubeconfig: str | None) -> Any:
    """CoreV1Api with the client `kubeclient` builds."""
    client: Any = importlib.import_module("kubernetes.client")
    return client.CoreV1Api(kubeclient.api_client(kubeconfig))


def node_name(given: str | None) -> str:
    """The Node to write: as given, else $NODE_NAME (the downward API), else the hostname."""
    return given or os.environ.get("NODE_NAME") or socket.gethostname()


def enforced(config: Config) -> tuple[str, ...]:
    """The limit profiles this node enforces: MPS where the agent runs its control daemons
    (and the driver has the program), HAMi-core where its library is there."""
    found = []
    if config.mps_root is not None and mps.control_binary(config.sim or "/") is not None:
        found.append("mps")
    if config.hami_library is not None and os.path.isfile(config.hami_library):
        found.append("hami")
    return tuple(found)


def wanted(config: Config, node: NodeGpus) -> dict[str, str]:
    """The node's labels, its vendor's (`vendors.NodeVendor.labels`). A plugin that answers
    Allocate with CDI devices promises no limits: containerd applies those without gpuwire's
    runtime, which joins a container to them. `runtime_ready`: while the installer's ready
    file is there (and this agent runs under gpuwire's runtime handler), the node can run GPU
    pods."""
    vendor = vendors.of(config.vendor)
    ready = {labels.RUNTIME_READY: "true"} if runtime_ready(config) and node.gpus else {}
    return ready | vendor.labels(config, node, enforced(config) if config.cdi == "none" else ())


def runtime_ready(config: Config) -> bool:
    return config.runtime_ready is not None and os.path.exists(config.runtime_ready)


def node_annotations(
    config: Config, node: NodeGpus, unhealthy: Collection[str] = ()
) -> dict[str, str]:
    """`gpuwire.io/gpus` (none for a node without GPUs), as the node's vendor writes it."""
    if not node.gpus:
        return {}
    vendor = vendors.of(config.vendor)
    value = vendor.annotation(node, vendor.resources(config, node)[0], unhealthy)
    return {labels.GPUS_ANNOTATION: value}


def apply(
    api: Any,
    name: str,
    new_labels: dict[str, str],
    new_annotations: dict[str, str],
    annotations: tuple[str, ...] = (labels.GPUS_ANNOTATION,),
) -> dict[str, Any] | None:
    """Patch the node's labels and annotations (those named in `annotations`) to the
    wanted ones; returns the patch sent (None: nothing to change)."""
    meta = api.read_node(name).metadata
    patch: dict[str, Any] = {}
    label_changes = labels.changes(meta.labels or {}, new_labels, OWNED)
    annotation_changes = labels.changes(meta.annotations or {}, new_annotations, annotations)
    if label_changes:
        patch["labels"] = label_changes
    if annotation_changes:
        patch["annotations"] = annotation_changes
    if not patch:
        return None
    api.patch_node(name, {"metadata": patch}, _content_type=MERGE_PATCH)
    log.info(
        "node %s: patched %s", name, ", ".join(sorted({**label_changes, **annotation_changes}))
    )
    return {"metadata": patch}


def unlabel(api: Any, name: str) -> dict[str, Any] | None:
    """Remove every label and annotation the node agent writes (the uninstaller's last
    step on a node); returns the patch sent (None: none was there)."""
    return apply(api, name, {}, {}, annotations=(labels.GPUS_ANNOTATION, holders.ANNOTATION))


def label_once(
    api: Any, name: str, config: Config, node: NodeGpus, unhealthy: Collection[str] = ()
) -> dict[str, Any] | None:
    return apply(api, name, wanted(config, node), node_annotations(config, node, unhealthy))


def run(
    config: Config,
    latest: Latest,
    stop: threading.Event,
    unhealthy: Callable[[], frozenset[str]] | None = None,
    api: Any = None,
) -> None:
    """Label now, again within a second of a health change or a change of the node, and
    every `label_interval` (looking at the node again, and putting back labels someone
    removed) until `stop` is set."""
    api = api or core_api(config.kubeconfig)
    name = node_name(config.node_name)
    node: NodeGpus | None = None
    last: tuple[frozenset[str], bool] | None = None
    due = 0.0
    while not stop.is_set():
        seen = (unhealthy() if unhealthy else frozenset(), runtime_ready(config))
        try:
            found = latest(config.label_interval)
            now = time.monotonic()
            if seen != last or found != node or now >= due:
                label_once(api, name, config, found, seen[0])
                node, last, due = found, seen, now + config.label_interval
        except Exception as exc:  # the API server may be away; try again later
            log.warning("labeling node %s failed: %s", name, exc)
        stop.wait(1.0)


def keep_mig_map(
    path: str, latest: Latest, stop: threading.Event, every: float = REDISCOVER
) -> None:
    """Write the MIG map again every `every` seconds until `stop` is set, so that one that
    failed to be written or was removed is put back; a MIG change writes it at once."""
    while not stop.wait(every):
        try:
            write_mig_map(path, latest())
        except Exception:
            log.exception("MIG map %s not checked", path)


def write_mig_map(path: str, node: NodeGpus) -> None:
    """The node side's names of this node's MIG devices (`gpuwire.mig`)."""
    try:
        if mig.write_map(path, node.mig_devices):
            log.info("MIG map %s: %d MIG device(s)", path, len(node.mig))
    except OSError as exc:
        log.warning("MIG map %s not written: %s", path, exc)


def advertise(api: Any, name: str, resource: str, count: int) -> list[dict[str, Any]] | None:
    """Set `status.capacity[resource]` with a JSON patch on the status subresource (the
    extended-resource PATCH); returns the patch sent, None when it was already so."""
    status = api.read_node_status(name).status
    capacity = status.capacity if status is not None else None
    if capacity is not None and capacity.get(resource) == str(count):
        return None
    if status is None:  # a node no kubelet has reported on yet
        ops = [{"op": "add", "path": "/status", "value": {"capacity": {resource: str(count)}}}]
    elif capacity is None:
        ops = [{"op": "add", "path": "/status/capacity", "value": {resource: str(count)}}]
    else:
        escaped = resource.replace("~", "~0").replace("/", "~1")
        ops = [{"op": "add", "path": f"/status/capacity/{escaped}", "value": str(count)}]
    api.patch_node_status(name, ops, _content_type=JSON_PATCH)
    return ops
