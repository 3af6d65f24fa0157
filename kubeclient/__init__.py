"""The Kubernetes client every gpuwire command builds, from one precedence, kubectl's:

1. `--kubeconfig FILE` (with `--context NAME` where a command offers it);
2. else `$KUBECONFIG` (a `:`-separated list, merged as kubectl merges it);
3. else `~/.kube/config`;
4. else, where none of these exists, the pod's service account (in-cluster config).

That is the order of client-go's loading rules, which kubectl uses ("Organizing Cluster
Access Using kubeconfig Files", kubernetes.io/docs/concepts/configuration/
organize-cluster-access-kubeconfig/, section "Merging kubeconfig files"; in-cluster config:
"Accessing the Kubernetes API from a Pod", kubernetes.io/docs/tasks/run-application/
access-api-from-pod/). A pod that runs gpuwire has no kubeconfig, so it talks with its
service account; a person's shell has one.

A library of the components, not a component: `webhook`, `deviceplugin`, `certs` and
`inventory` all build a client and may not import each other, and `gpuwire/` may not import
`kubernetes`, so this package sits between them: it imports `kubernetes` and nothing of
gpuwire's.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

HOME_CONFIG = "~/.kube/config"
HELP = "default $KUBECONFIG, else ~/.kube/config, else the pod's service account"


def default_kubeconfig() -> str:
    """`$KUBECONFIG`, else `~/.kube/config`: where a kubeconfig is looked for by default."""
    return os.environ.get("KUBECONFIG") or HOME_CONFIG


def default_files() -> list[str]:
    """The default kubeconfig files that exist (none: the in-cluster config is used)."""
    paths = default_kubeconfig().split(os.pathsep)
    return [p for p in paths if p and os.path.exists(os.path.expanduser(p))]


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` (the package is untyped) for the cluster the
    precedence names; `kubernetes.config.ConfigException` where it names none, or a
    kubeconfig given or found cannot be used."""
    from kubernetes import client, config

    loader: Any = config  # the loaders are untyped
    if kubeconfig or context or default_files():
        source = kubeconfig or default_kubeconfig()
        return loader.new_client_from_config(config_file=source, context=context)
    configuration = client.Configuration()
    loader.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def add_kubeconfig_flag(parser: argparse.ArgumentParser) -> None:
    """`--kubeconfig FILE`, with the one help every command shows."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=HELP)
