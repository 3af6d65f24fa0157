"""`gpuwire webhook serve` and `gpuwire mutate`: thin shells around `review.answer`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import socket
import sys
import time
from typing import Any

import jsonpatch
import yaml

import kubeclient
from gpuwire import grant
from webhook import review
from webhook.fleet import FleetFileError
from webhook.policy import PolicyError
from webhook.pools import SlicesFileError
from webhook.sources import Sources, fleet_file, slices_file

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
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a webhook serves its Service
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--policy", help="policy YAML (a mounted ConfigMap); reloaded")
    parser.add_argument("--grant-key-dir", default=grant.DEFAULT_KEY_DIR, help="reloaded")
    parser.add_argument("--nodes", help="static Node list instead of watching the cluster")
    parser.add_argument("--slices", help="with --nodes: a static ResourceSlice list")
    kubeclient.add_kubeconfig_flag(parser)
    parser.add_argument("--reload-seconds", type=float, default=1.0, help="file check interval")
    parser.add_argument(
        "--template-seconds", type=float, default=2.0,
        help="the most an admission waits for its ResourceClaimTemplates to be created",
    )  # fmt: skip
    parser.add_argument(
        "--template-grace", type=float, default=600.0,
        help="seconds a template stays unused before it is removed",
    )  # fmt: skip
    parser.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", DEFAULT_NAMESPACE),
        help="where the replicas' Lease is (default: $POD_NAMESPACE, else gpuwire-system)",
    )  # fmt: skip
    parser.add_argument(
        "--identity", default=f"{socket.gethostname()}_{secrets.token_hex(4)}",
        help="this replica's name in the Lease",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    from webhook import tls
    from webhook.server import create_app, run

    try:
        if args.nodes:
            sources = Sources.load(args.policy, args.grant_key_dir, fleet_file(args.nodes),
                                   slices_file(args.slices))  # fmt: skip
        else:
            sources = _from_cluster(args)
        context = tls.server_context(args.tls_cert, args.tls_key)
        certificate = tls.reloading(context, args.tls_cert, args.tls_key)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"gpuwire webhook serve: {exc}\n")
    app = create_app(sources, certificate, args.reload_seconds, args.template_seconds)
    run(app, args.host, args.port, context, args.log_level)
    return 0


def _read_pod(path: str) -> Any:
    text = sys.stdin.read() if path == "-" else open(path).read()  # noqa: SIM115
    pod = yaml.safe_load(text)
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        kind = pod.get("kind") if isinstance(pod, dict) else type(pod).__name__
        raise ValueError(f"{path}: expected a Pod (kind: Pod), got {kind!r}")
    return pod


def mutate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire mutate",
        description="Print a pod as the webhook would admit it (exit 1 and the reason if denied).",
    )
    parser.add_argument("pod", metavar="POD.yaml", help="a Pod manifest, or - for stdin")
    parser.add_argument("--policy", help="policy YAML (default: the built-in policy)")
    parser.add_argument("--nodes", help="a v1 List of Node objects (kubectl get nodes -o yaml)")
    parser.add_argument(
        "--slices", help="a v1 List of ResourceSlices (kubectl get resourceslices -o yaml)"
    )
    parser.add_argument("--grant-key-dir", help="sign GPUWIRE_GRANT with these keys")
    parser.add_argument("--namespace", help="default: the pod's metadata.namespace, else default")
    args = parser.parse_args(argv)
    try:
        pod = _read_pod(args.pod)
        sources = Sources.load(args.policy, args.grant_key_dir, fleet_file(args.nodes),
                               slices_file(args.slices))  # fmt: skip
    except (
        OSError,
        ValueError,
        yaml.YAMLError,
        PolicyError,
        FleetFileError,
        SlicesFileError,
    ) as exc:
        parser.exit(2, f"gpuwire mutate: {exc}\n")
    namespace = args.namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    reviewed = review.parse(json.dumps(review.request_for(pod, namespace)).encode())
    outcome = review.outcome_of(reviewed, sources.decide)
    answer = review.response(reviewed, outcome)["response"]
    for warning in answer.get("warnings", []):
        sys.stderr.write(f"warning: {warning}\n")
    if not answer["allowed"]:
        sys.stderr.write(f"denied: {answer['status']['message']}\n")
        return 1
    mutated = jsonpatch.apply_patch(pod, list(outcome.patch))
    # the admitted pod, then the ResourceClaimTemplates the webhook would create for it
    sys.stdout.write(yaml.safe_dump_all([mutated, *outcome.templates], sort_keys=False))
    return 0
