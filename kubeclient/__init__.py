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
`kubernetes`, so this package sits between them: it imports `kubernetes` and, of gpuwire's,
the contract. Its errors say what was looked for, or which server answered what, and what
to do, with the exit codes of `gpuwire.exits` (4: no cluster, 5: the cluster's answer).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpuwire import exits

HOME_CONFIG = "~/.kube/config"
HELP = "default $KUBECONFIG, else ~/.kube/config, else the pod's service account"
ADVICE = "give --kubeconfig FILE, set $KUBECONFIG, or run in a pod with a service account"


class NoCluster(exits.CommandError):
    """No cluster to talk to: no kubeconfig or service account, or one that cannot be used.
    The message names what was looked for and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exits.NO_CLUSTER)


class ClusterError(exits.CommandError):
    """The API server could not be reached, or refused a request; the message says which
    server and what it answered."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exits.CLUSTER)


def default_kubeconfig() -> str:
    """`$KUBECONFIG`, else `~/.kube/config`: where a kubeconfig is looked for by default."""
    return os.environ.get("KUBECONFIG") or HOME_CONFIG


def default_files() -> list[str]:
    """The default kubeconfig files that exist (none: the in-cluster config is used)."""
    paths = default_kubeconfig().split(os.pathsep)
    return [p for p in paths if p and os.path.exists(os.path.expanduser(p))]


def _looked_for() -> str:
    """Where the default sources were looked for, for a message that none was there."""
    env = os.environ.get("KUBECONFIG")
    files = (
        f"$KUBECONFIG={env} names no file that exists"
        if env
        else f"$KUBECONFIG is unset and {os.path.expanduser(HOME_CONFIG)} does not exist"
    )
    return f"{files}, and this is not a pod (KUBERNETES_SERVICE_HOST is unset)"


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A `kubernetes.client.ApiClient` (the package is untyped) for the cluster the
    precedence names; NoCluster, saying why and what to do, where it names none, or a
    kubeconfig given or found cannot be used."""
    import yaml
    from kubernetes import client, config

    loader: Any = config  # the loaders are untyped
    if kubeconfig:
        path = os.path.expanduser(kubeconfig)
        if not os.path.isfile(path):
            why = "is a directory" if os.path.isdir(path) else "does not exist"
            raise NoCluster(f"--kubeconfig {kubeconfig} {why}; give a kubeconfig file")
    if kubeconfig or context or default_files():
        source = kubeconfig or default_kubeconfig()
        where = f"--kubeconfig {source}" if kubeconfig else f"kubeconfig {source}"
        try:
            return loader.new_client_from_config(config_file=source, context=context)
        except loader.ConfigException as exc:
            raise NoCluster(f"{where} cannot be used: {exc}") from None
        except (OSError, yaml.YAMLError) as exc:
            raise NoCluster(f"{where} cannot be read: {exc}") from None
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            # what the loader makes of a file that is YAML but no kubeconfig
            raise NoCluster(
                f"{where} is not a kubeconfig (a YAML mapping of clusters, contexts and "
                f"users, as kubectl config view prints it): {type(exc).__name__}: {exc}"
            ) from None
    configuration = client.Configuration()
    try:
        loader.load_incluster_config(client_configuration=configuration)
    except loader.ConfigException as exc:
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise NoCluster(f"no cluster to talk to: {_looked_for()}; {ADVICE}") from None
        raise NoCluster(f"the pod's service account cannot be used: {exc}; {ADVICE}") from None
    return client.ApiClient(configuration)


def host(api: Any) -> str:
    """The API server an ApiClient (or an API built on one) talks to."""
    inner = getattr(api, "api_client", api)
    return str(getattr(getattr(inner, "configuration", None), "host", "the API server"))


def explain(exc: Exception, server: str) -> str | None:
    """What an API call's failure says to a person: the server, the HTTP status and the
    API server's own message; None for an exception that is not the API's."""
    import urllib3
    from kubernetes.client import ApiException

    if isinstance(exc, ApiException):
        message = _status_message(exc.body)
        said = f": {message}" if message else ""
        return f"{server} answered {exc.status} {exc.reason}{said}"
    if isinstance(exc, urllib3.exceptions.HTTPError):
        return f"cannot reach {server}: {_first_cause(exc)}"
    return None


def _first_cause(exc: BaseException) -> str:
    """What went wrong under urllib3's wrappers (`Connection refused`, not the pool's and the
    URL's retelling of it): the innermost reason or cause, an OSError by its own words."""
    while isinstance(inner := getattr(exc, "reason", None) or exc.__cause__, BaseException):
        exc = inner
    return str(exc.strerror) if isinstance(exc, OSError) and exc.strerror else str(exc)


def _status_message(body: object) -> str:
    """The `message` of the Status the API server sent, else the body (short)."""
    try:
        return str(json.loads(body)["message"])  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        return str(body or "")[:200]


@contextmanager
def talking(api: Any) -> Iterator[None]:
    """Inside: an API call that fails becomes a ClusterError naming the server and its
    answer (what `gpuwire` prints, exit 5), instead of the client's traceback."""
    try:
        yield
    except Exception as exc:
        said = explain(exc, host(api))
        if said is None:
            raise
        raise ClusterError(said) from None


def add_kubeconfig_flag(parser: argparse.ArgumentParser) -> None:
    """`--kubeconfig FILE`, with the one help every command shows."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=HELP)
