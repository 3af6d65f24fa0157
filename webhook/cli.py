"""`gpuwire webhook serve` and `gpuwire mutate`: thin shells around `review.answer`."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

import kubeclient
from gpuwire import exits, grant, logs
from webhook import manifests, review
from webhook.mutation import Denial
from webhook.sources import Sources, fleet_file, slices_file

COMPONENT = "webhook"  # its log lines' component
DEFAULT_NAMESPACE = "gpuwire-system"
LEASE = "gpuwire-webhook"


def _from_cluster(args: argparse.Namespace) -> Sources:
    """Watches of Nodes, gpuwire's ResourceSlices and its templates, the templates made at
    admission, and the Lease whose holder removes unused ones; one client, `kubeclient`'s."""
    from kubernetes import client

    from webhook import templates
    from webhook.lease import Leader, Lease
    from webhook.templates import TemplateStore
    from webhook.watch import NodeWatch, SliceWatch, TemplateWatch

    api_client = kubeclient.api_client(args.kubeconfig)
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    sources = Sources.load(args.policy, args.grant_key_dir, NodeWatch(core), SliceWatch(resource))
    sources.templates = TemplateStore(resource, TemplateWatch(resource))
    lease = Lease(client.CoordinationV1Api(api_client), args.lease_namespace, LEASE, args.identity)
    grace = args.template_grace
    sources.leader = Leader(lease, lambda: templates.sweep(resource, core, time.time(), grace))
    return sources


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire webhook serve",
        description="Serve the gpuwire mutating admission webhook over TLS.",
    )
    parser.add_argument("--tls-cert", required=True, help="PEM certificate (chain); reloaded")
    parser.add_argument("--tls-key", required=True, help="PEM private key; reloaded")
    parser.add_argument(
        "--host", default="0.0.0.0",  # noqa: S104 - a webhook serves its Service
        help="address to listen on (default %(default)s: all)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8443, help="TLS port (default %(default)s)")
    parser.add_argument(
        "--policy", metavar="FILE",
        help="policy YAML (a mounted ConfigMap); reloaded (default: the built-in policy)",
    )  # fmt: skip
    parser.add_argument(
        "--grant-key-dir", default=grant.DEFAULT_KEY_DIR, metavar="DIR",
        help="the grant keys, one file per key id; reloaded (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes", metavar="FILE",
        help="a static Node list instead of watching the cluster (default: watch it)",
    )  # fmt: skip
    parser.add_argument(
        "--slices", metavar="FILE", help="with --nodes: a static ResourceSlice list (default: none)"
    )
    kubeclient.add_kubeconfig_flag(parser)
    parser.add_argument(
        "--reload-seconds", type=float, default=1.0,
        help="how often the files are checked for changes (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--template-seconds", type=float, default=2.0,
        help="the most an admission waits for its ResourceClaimTemplates to be created "
        "(default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--template-grace", type=float, default=600.0,
        help="seconds a template stays unused before it is removed (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", DEFAULT_NAMESPACE),
        help="where the replicas' Lease is (default: $POD_NAMESPACE, else gpuwire-system)",
    )  # fmt: skip
    parser.add_argument(
        "--identity", default=f"{socket.gethostname()}_{secrets.token_hex(4)}",
        help="this replica's name in the Lease (default: <hostname>_<random>)",
    )  # fmt: skip
    logs.add_flags(parser)
    args = parser.parse_args(argv)
    logs.from_args(COMPONENT, args)

    from webhook import tls
    from webhook.server import create_app, run

    try:
        context = tls.server_context(args.tls_cert, args.tls_key)
        certificate = tls.reloading(context, args.tls_cert, args.tls_key)
        if args.nodes:
            sources = Sources.load(args.policy, args.grant_key_dir, fleet_file(args.nodes),
                                   slices_file(args.slices))  # fmt: skip
        else:
            sources = _from_cluster(args)
    except (OSError, ValueError) as exc:  # a file that cannot be read or says no policy
        raise exits.CommandError(str(exc), exits.INPUT) from None
    app = create_app(sources, certificate, args.reload_seconds, args.template_seconds)
    run(app, args.host, args.port, context, args.log_level)
    return 0


NO_NODES_HINT = (
    "hint: no --nodes given, so the pod was checked against a cluster without GPU nodes; "
    "give --nodes NODES.yaml (kubectl get nodes -o yaml; examples/nodes.yaml is an example "
    "cluster) and, for the DRA path, --slices SLICES.yaml (kubectl get resourceslices -o yaml; "
    "examples/slices.yaml)"
)
NO_SLICES_HINT = (
    "hint: no --slices given, so the DRA path saw no ResourceSlices; give --slices SLICES.yaml "
    "(kubectl get resourceslices -o yaml; examples/slices.yaml is the example cluster's)"
)


class _Plain(yaml.SafeDumper):
    """YAML a person reads and kubectl applies: a list the patch shares is written out
    twice, not as an anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _documents(path: str) -> list[Any]:
    """The YAML (or JSON) documents of `path` (- for stdin); CommandError naming the file
    and what is wrong where it cannot be read."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise exits.CommandError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise exits.CommandError(f"{path}: not text (UTF-8): {exc.reason}") from None
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or exc
        raise exits.CommandError(f"{path}: not YAML{at}: {problem}") from None


def _workloads(path: str) -> list[manifests.Workload]:
    try:
        found, skipped = manifests.read(_documents(path))
    except manifests.ManifestError as exc:
        raise exits.CommandError(f"{path}: {exc}") from None
    if not found:
        held = f" (it holds {', '.join(skipped)})" if skipped else ""
        raise exits.CommandError(
            f"{path}: no Pod or workload in it{held}; accepted: {', '.join(manifests.KINDS)} "
            "(or a List of them), in one or more YAML documents"
        )
    for name in skipped:
        sys.stderr.write(f"skipped: {name}: makes no pod\n")
    return found


def mutate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire mutate",
        description="Print manifests as the webhook would admit their pods (exit 1 and the "
        "reason where one is denied): Pods, and the pod templates of Deployments, "
        "StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs, one or more YAML "
        "documents. Offline: the cluster is what --nodes and --slices say.",
    )
    parser.add_argument(
        "manifest", metavar="FILE.yaml", help="manifests (YAML documents, or a List), - for stdin"
    )
    parser.add_argument(
        "--policy", metavar="FILE", help="policy YAML (default: the built-in policy)"
    )
    parser.add_argument(
        "--nodes", metavar="FILE",
        help="the cluster's GPU nodes: a v1 List of Node objects (kubectl get nodes -o yaml; "
        "default: none, a cluster without GPU nodes)",
    )  # fmt: skip
    parser.add_argument(
        "--slices", metavar="FILE",
        help="the cluster's ResourceSlices, for the DRA path: a v1 List (kubectl get "
        "resourceslices -o yaml; default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--grant-key-dir", metavar="DIR",
        help="sign GPUWIRE_GRANT with these keys (default: none, no grant written)",
    )  # fmt: skip
    parser.add_argument(
        "--namespace", help="default: each object's metadata.namespace, else default"
    )
    args = parser.parse_args(argv)
    workloads = _workloads(args.manifest)
    try:
        sources = Sources.load(args.policy, args.grant_key_dir, fleet_file(args.nodes),
                               slices_file(args.slices))  # fmt: skip
    except (OSError, ValueError) as exc:  # PolicyError, FleetFileError, SlicesFileError too
        raise exits.CommandError(str(exc)) from None
    several = len(workloads) > 1
    admitted: list[Any] = []
    templates: dict[str, Any] = {}
    denials: list[Denial] = []
    for workload in workloads:
        said = f"{workload.title}: " if several else ""
        namespace = args.namespace or workload.namespace or "default"
        reviewed = review.parse(review.encode(review.request_for(workload.pod, namespace)))
        outcome = review.outcome_of(reviewed, sources.decide)
        for warning in outcome.warnings:
            sys.stderr.write(f"warning: {said}{warning}\n")
        if outcome.denial is not None:
            sys.stderr.write(f"denied: {said}{outcome.denial.message}\n")
            denials.append(outcome.denial)
            continue
        admitted.append(workload.admitted(jsonpatch.apply_patch(workload.pod, list(outcome.patch))))
        templates.update((t["metadata"]["name"], t) for t in outcome.templates)
    cluster = [d for d in denials if d.of_cluster]  # those the cluster's GPUs decided
    if cluster and not args.nodes:
        sys.stderr.write(NO_NODES_HINT + "\n")
    elif not args.slices and any("ResourceSlice" in d.message for d in cluster):
        sys.stderr.write(NO_SLICES_HINT + "\n")
    # the admitted objects, then the ResourceClaimTemplates the webhook would create for them
    if admitted:
        documents = [*admitted, *templates.values()]
        sys.stdout.write(yaml.dump_all(documents, Dumper=_Plain, sort_keys=False))
    return exits.NO if denials else exits.OK
