"""`gpuwire inventory` and the kubectl plugin `kubectl-gpuwire` (`kubectl gpuwire inventory`).

Two reads per look: all nodes, and the Pending pods. Everything else comes from the node
annotations the gpuwire agents keep, so the command needs `list` on nodes and pods only.
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
from inventory import table, view

OUTPUTS = ("table", "wide", "json")
CLEAR = "\x1b[H\x1b[2J"


def report(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    node: str | None = None,
    namespace: str | None = None,
    output: str = "table",
    width: int = 80,
    color: bool = False,
) -> str:
    """The inventory of these API objects (JSON dicts) as the command prints it."""
    inventory = view.build(nodes, pods, node=node, namespace=namespace)
    if output == "json":
        return json.dumps(view.as_json(inventory), indent=2) + "\n"
    return table.render(inventory, width=width, wide=output == "wide", color=color)


def core_api(kubeconfig: str | None, context: str | None) -> Any:
    """CoreV1Api with the client `kubeclient` builds."""
    client: Any = importlib.import_module("kubernetes.client")
    return client.CoreV1Api(kubeclient.api_client(kubeconfig, context))


def fetch(api: Any, namespace: str | None) -> tuple[list[Any], list[Any]]:
    """All nodes, and the Pending pods (of `namespace`, if given), as JSON dicts."""
    nodes = json.loads(api.list_node(_preload_content=False).data)["items"]
    pending = "status.phase=Pending"
    if namespace is None:
        answer = api.list_pod_for_all_namespaces(field_selector=pending, _preload_content=False)
    else:
        answer = api.list_namespaced_pod(namespace, field_selector=pending, _preload_content=False)
    return nodes, json.loads(answer.data)["items"]


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
            nodes, pods = fetch(api, args.namespace)
        except Exception as exc:  # the API server is away or refuses: say which and why
            if not args.watch:
                p.exit(1, f"{p.prog}: {_api_error(api, exc)}\n")
            sys.stderr.write(f"{p.prog}: {_api_error(api, exc)}; trying again\n")
        else:
            text = report(
                nodes,
                pods,
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
