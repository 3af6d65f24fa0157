"""`gpuwire inventory` and the kubectl plugin `kubectl-gpuwire` (`kubectl gpuwire inventory`).

Four reads per look: all nodes, the pods that are not done, and DRA's ResourceClaims and
gpuwire's ResourceSlices (none where the API server does not serve `resource.k8s.io/v1`).
Everything else comes from the node annotations the gpuwire agents keep, so the command needs
`list` on nodes, pods, resourceclaims and resourceslices only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import kubeclient
from gpuwire.dra import DRIVER
from inventory import table, view

OUTPUTS = ("table", "wide", "json")
CLEAR = "\x1b[H\x1b[2J"


def report(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    claims: Iterable[Mapping[str, Any]] = (),
    slices: Iterable[Mapping[str, Any]] = (),
    node: str | None = None,
    namespace: str | None = None,
    output: str = "table",
    width: int = 80,
    color: bool = False,
) -> str:
    """The inventory of these API objects (JSON dicts) as the command prints it."""
    inventory = view.build(nodes, pods, claims=claims, slices=slices, node=node,
                           namespace=namespace)  # fmt: skip
    if output == "json":
        return json.dumps(view.as_json(inventory), indent=2) + "\n"
    return table.render(inventory, width=width, wide=output == "wide", color=color)


def core_api(kubeconfig: str | None, context: str | None) -> Any:
    """CoreV1Api with the client `kubeclient` builds."""
    client: Any = importlib.import_module("kubernetes.client")
    return client.CoreV1Api(kubeclient.api_client(kubeconfig, context))


NOT_DONE = "status.phase!=Succeeded,status.phase!=Failed"


def _listed(call: Any, **query: Any) -> list[Any]:
    """A list's items; none where the API server does not serve the resource (404)."""
    client: Any = importlib.import_module("kubernetes.client")
    try:
        return list(json.loads(call(_preload_content=False, **query).data)["items"])
    except client.ApiException as exc:
        if exc.status == 404:
            return []
        raise


def fetch(api: Any, namespace: str | None) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """All nodes, the pods not done and DRA's claims (of `namespace`, if given), and
    gpuwire's slices, as JSON dicts."""
    client: Any = importlib.import_module("kubernetes.client")
    resource = client.ResourceV1Api(api.api_client)
    if namespace is None:
        pods = _listed(api.list_pod_for_all_namespaces, field_selector=NOT_DONE)
        claims = _listed(resource.list_resource_claim_for_all_namespaces)
    else:
        pods = _listed(api.list_namespaced_pod, namespace=namespace, field_selector=NOT_DONE)
        claims = _listed(resource.list_namespaced_resource_claim, namespace=namespace)
    slices = _listed(resource.list_resource_slice, field_selector=f"spec.driver={DRIVER}")
    return _listed(api.list_node), pods, claims, slices


def _output(text: str) -> str:
    if text not in OUTPUTS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(OUTPUTS)}")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds above 0")
    return value


def parser(prog: str = "gpuwire inventory") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Which pod holds which GPU, on every node; pending GPU pods and why they "
        "wait; GPUs held twice.",
    )
    p.add_argument("--node", metavar="N", help="only this node (and the pods bound to it)")
    p.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="only the pods of this namespace and the GPUs they hold (totals count all GPUs)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=_output,
        default="table",
        metavar="FORMAT",
        help="table (default), wide or json",
    )
    p.add_argument("-w", "--watch", action="store_true", help="print again whenever it changes")
    p.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="with --watch: how often to look (default 2)",
    )
    kubeclient.add_kubeconfig_flag(p)
    p.add_argument("--context", help="the kubeconfig context to use")
    return p


def main(argv: list[str], out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    p = parser()
    args = p.parse_args(argv)
    try:
        api = core_api(args.kubeconfig, args.context)
    except Exception as exc:  # no kubeconfig, unknown context, not in a cluster
        p.exit(1, f"{p.prog}: no cluster to ask: {exc}\n")
    try:
        return _show(p, args, api, stream)
    except KeyboardInterrupt:  # the way out of --watch
        return 0


def _show(p: argparse.ArgumentParser, args: argparse.Namespace, api: Any, stream: TextIO) -> int:
    tty = stream.isatty()
    width = shutil.get_terminal_size((80, 24)).columns if tty else 80
    color = tty and not os.environ.get("NO_COLOR")
    shown = None
    while True:
        try:
            nodes, pods, claims, slices = fetch(api, args.namespace)
        except Exception as exc:  # the API server is away or refuses: say which and why
            if not args.watch:
                p.exit(1, f"{p.prog}: {_api_error(api, exc)}\n")
            sys.stderr.write(f"{p.prog}: {_api_error(api, exc)}; trying again\n")
        else:
            text = report(
                nodes,
                pods,
                claims=claims,
                slices=slices,
                node=args.node,
                namespace=args.namespace,
                output=args.output,
                width=width,
                color=color,
            )
            if text != shown:
                stream.write((CLEAR if args.watch and tty else "") + text)
                stream.flush()
                shown = text
        if not args.watch:
            return 0
        time.sleep(args.interval)


def _api_error(api: Any, exc: Exception) -> str:
    host = getattr(getattr(api.api_client, "configuration", None), "host", "the API server")
    reason = getattr(exc, "reason", None) or exc
    status = getattr(exc, "status", None)
    return f"{host}: {status} {reason}" if status else f"{host}: {reason}"


def kubectl_plugin(argv: list[str] | None = None) -> int:
    """`kubectl-gpuwire`: kubectl runs it as `kubectl gpuwire inventory ...`."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["inventory"]:
        return main(args[1:])
    sys.stderr.write("usage: kubectl gpuwire inventory [--node N] [-n NS] [-o wide|json] [-w]\n")
    return 0 if args[:1] in (["-h"], ["--help"]) else 2
