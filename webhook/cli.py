"""`gpuwire webhook serve` and `gpuwire mutate`: thin shells around `review.answer`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import jsonpatch
import yaml

import kubeclient
from gpuwire import grant
from webhook import review
from webhook.fleet import FleetFileError
from webhook.policy import PolicyError
from webhook.sources import FleetFile, FleetSource, Sources


def _cluster_fleet(kubeconfig: str | None) -> FleetSource:
    """A Node watch, with the client `kubeclient` builds."""
    from kubernetes import client

    from webhook.watch import NodeWatch

    return NodeWatch(client.CoreV1Api(kubeclient.api_client(kubeconfig)))


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
    kubeclient.add_kubeconfig_flag(parser)
    parser.add_argument("--reload-seconds", type=float, default=1.0, help="file check interval")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")

    from webhook import tls
    from webhook.server import create_app, run

    try:
        nodes = FleetFile(args.nodes) if args.nodes else _cluster_fleet(args.kubeconfig)
        sources = Sources.load(args.policy, args.grant_key_dir, nodes)
        context = tls.server_context(args.tls_cert, args.tls_key)
        certificate = tls.reloading(context, args.tls_cert, args.tls_key)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"gpuwire webhook serve: {exc}\n")
    app = create_app(sources, certificate, args.reload_seconds)
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
    parser.add_argument("--grant-key-dir", help="sign GPUWIRE_GRANT with these keys")
    parser.add_argument("--namespace", help="default: the pod's metadata.namespace, else default")
    args = parser.parse_args(argv)
    try:
        pod = _read_pod(args.pod)
        sources = Sources.load(args.policy, args.grant_key_dir, FleetFile(args.nodes))
    except (OSError, ValueError, yaml.YAMLError, PolicyError, FleetFileError) as exc:
        parser.exit(2, f"gpuwire mutate: {exc}\n")
    namespace = args.namespace or (pod.get("metadata") or {}).get("namespace") or "default"
    body = json.dumps(review.request_for(pod, namespace)).encode()
    status, reply, _ = review.answer(body, sources.decide)
    if status != 200:
        parser.exit(2, f"gpuwire mutate: {reply['message']}\n")
    answer = reply["response"]
    for warning in answer.get("warnings", []):
        sys.stderr.write(f"warning: {warning}\n")
    if not answer["allowed"]:
        sys.stderr.write(f"denied: {answer['status']['message']}\n")
        return 1
    mutated = jsonpatch.apply_patch(pod, review.decode_patch(reply))
    sys.stdout.write(yaml.safe_dump(mutated, sort_keys=False))
    return 0
