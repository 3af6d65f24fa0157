"""`gpuwire inventory` and the kubectl plugin `kubectl-gpuwire` (`kubectl gpuwire inventory`).

Four reads per look: all nodes, the pods that are not done, and DRA's ResourceClaims and
gpuwire's ResourceSlices (none where the API server does not serve `resource.k8s.io/v1`).
Everything else comes from the node annotations the gpuwire agents keep, so the command needs
`list` on nodes, pods, resourceclaims and resourceslices only. Offline, files stand in for
the cluster (`--nodes`, `--pods`, `--claims`, `--slices`: what `kubectl get ... -o yaml`
prints), read again on each look of `--watch`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

import kubeclient
from gpuwire import exits
from gpuwire.dra import DRIVER
from inventory import table, view
from kubeclient import listfile

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


Lists = tuple[list[Any], list[Any], list[Any], list[Any]]
# flag → (the kind its file lists, the command that prints such a file)
FILES = {
    "nodes": ("Node", "kubectl get nodes -o yaml"),
    "pods": ("Pod", "kubectl get pods -A -o yaml"),
    "claims": ("ResourceClaim", "kubectl get resourceclaims -A -o yaml"),
    "slices": ("ResourceSlice", "kubectl get resourceslices -o yaml"),
}


class InventoryFileError(exits.CommandError):
    """A --nodes, --pods, --claims or --slices file that cannot be read as its list."""


def from_files(args: argparse.Namespace) -> Lists:
    """The four lists from the files given (a list not given: empty), as `fetch` filters
    them: the pods not done, of `--namespace` if given, and gpuwire's slices."""
    found = {
        flag: [dict(o) for o in listfile.items(getattr(args, flag), kind, InventoryFileError)]
        if getattr(args, flag)
        else []
        for flag, (kind, _) in FILES.items()
    }
    ns = args.namespace
    pods = [
        p
        for p in found["pods"]
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and (ns is None or (p.get("metadata") or {}).get("namespace") == ns)
    ]
    claims = [
        c for c in found["claims"] if ns is None or (c.get("metadata") or {}).get("namespace") == ns
    ]
    slices = [s for s in found["slices"] if (s.get("spec") or {}).get("driver") == DRIVER]
    return found["nodes"], pods, claims, slices


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
    p.add_argument(
        "--context", help="the kubeconfig context to use (default: the kubeconfig's current one)"
    )
    for flag, (kind, command) in FILES.items():
        p.add_argument(
            f"--{flag}",
            metavar="FILE",
            help=f"offline: the {kind}s from a file ({command}) instead of the cluster; any of "
            "--nodes, --pods, --claims, --slices given, the others are none",
        )
    return p


def main(argv: list[str], out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    p = parser()
    args = p.parse_args(argv)
    offline = any(getattr(args, flag) is not None for flag in FILES)
    if offline and (args.kubeconfig or args.context):
        p.error("--kubeconfig and --context name a cluster; --nodes, --pods, --claims and "
                "--slices stand in for one: give one or the other")  # fmt: skip
    api = None if offline else core_api(args.kubeconfig, args.context)  # NoCluster: exit 4

    def look() -> Lists:
        """The four lists, from the files (read again each time) or the cluster."""
        if api is None:
            return from_files(args)
        with kubeclient.talking(api):
            return fetch(api, args.namespace)

    try:
        return _show(p, args, look, stream)
    except KeyboardInterrupt:  # the way out of --watch
        return 0


def _show(
    p: argparse.ArgumentParser, args: argparse.Namespace, look: Callable[[], Lists], stream: TextIO
) -> int:
    tty = stream.isatty()
    width = shutil.get_terminal_size((80, 24)).columns if tty else 80
    color = tty and not os.environ.get("NO_COLOR")
    shown = None
    while True:
        try:
            nodes, pods, claims, slices = look()
        except exits.CommandError as exc:  # the API server is away or refuses, a file is bad
            if not args.watch:
                raise
            sys.stderr.write(f"{p.prog}: {exc}; trying again\n")
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


def kubectl_plugin(argv: list[str] | None = None) -> int:
    """`kubectl-gpuwire`: kubectl runs it as `kubectl gpuwire inventory ...`."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["inventory"]:
        from gpuwire.cli import run

        return run("kubectl gpuwire inventory", main, args[1:])
    sys.stderr.write("usage: kubectl gpuwire inventory [--node N] [-n NS] [-o wide|json] [-w]\n")
    return 0 if args[:1] in (["-h"], ["--help"]) else 2
