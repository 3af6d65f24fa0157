"""`gpuwire certs …`: thin argparse shells over `certs.pki` (and `certs.ensure`)."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import signal
import threading
from pathlib import Path

import kubeclient
from certs import files, grantkey, pki, reconcile, rotation
from certs.cluster import Cluster
from certs.reconcile import Target
from gpuwire import exits, logs

log = logging.getLogger("gpuwire.certs")
# What the webhook server reads: never the CA key.
SERVED_FILES = (pki.CA_FILE, pki.CERT_FILE, pki.KEY_FILE)
# After a failed check a long-running `ensure` retries sooner than its interval.
RETRY_SECONDS = 30


def _days(value: str) -> dt.timedelta:
    try:
        days = int(value)
    except ValueError:
        days = 0
    if days < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days ≥ 1")
    return dt.timedelta(days=days)


def _add_lifetimes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-type",
        default=pki.DEFAULT_KEY_TYPE,
        choices=sorted(pki.KEY_TYPES),
        help="key algorithm for the CA and the serving certificate (default %(default)s)",
    )
    parser.add_argument(
        "--days",
        type=_days,
        default=pki.SERVING_LIFETIME,
        metavar="N",
        help=f"serving certificate lifetime (default {pki.SERVING_LIFETIME.days})",
    )
    parser.add_argument(
        "--ca-days",
        type=_days,
        default=pki.CA_LIFETIME,
        metavar="N",
        help=f"CA lifetime (default {pki.CA_LIFETIME.days})",
    )


def generate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire certs generate",
        description="Write ca.crt, tls.crt and tls.key for the given hosts (the CA key is "
        "discarded). For local use and tests; in a cluster `gpuwire certs ensure` manages them.",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write to")
    parser.add_argument(
        "--host",
        action="append",
        required=True,
        metavar="H",
        help="DNS name or IP address the certificate is valid for (repeat for more)",
    )
    _add_lifetimes(parser)
    args = parser.parse_args(argv)
    try:
        paths = pki.generate(
            args.out,
            args.host,
            ca_lifetime=args.ca_days,
            lifetime=args.days,
            key_type=args.key_type,
        )
    except pki.PKIError as exc:
        parser.exit(2, f"gpuwire certs generate: {exc}\n")
    except OSError as exc:
        raise exits.CommandError(f"cannot write --out {args.out}: {exc.strerror}") from None
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} for {', '.join(args.host)}")
    return 0


def _interval(value: str) -> float:
    match = re.fullmatch(r"(\d+)([smh]?)", value)
    if not match or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration: a whole number ≥ 1 with an optional unit s, m or h"
        )
    return int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def ensure(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire certs ensure",
        description="Create or renew the webhook's TLS Secret and set the caBundle of its "
        "MutatingWebhookConfiguration; safe to run from several replicas at once.",
    )
    parser.add_argument("--namespace", required=True, help="namespace of the Service and Secret")
    parser.add_argument("--service", required=True, help="the webhook's Service")
    parser.add_argument("--secret", required=True, help="Secret (kubernetes.io/tls) to keep")
    parser.add_argument(
        "--webhook-config", required=True, help="MutatingWebhookConfiguration whose caBundle to set"
    )
    kubeclient.add_kubeconfig_flag(parser)
    parser.add_argument(
        "--cluster-domain", default=pki.CLUSTER_DOMAIN,
        help="the cluster's DNS domain, for the Service's names (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="also write ca.crt, tls.crt, tls.key here (all at once) for the webhook server",
    )
    parser.add_argument(
        "--grant-key-secret",
        metavar="NAME",
        help="also put a random grant key into this Secret if it holds none",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        metavar="DURATION",
        help="keep running, checking every DURATION (e.g. 10m); default: check once and exit",
    )
    _add_lifetimes(parser)
    logs.add_flags(parser)
    args = parser.parse_args(argv)
    logs.from_args("certs", args)
    hosts = pki.service_hosts(args.service, args.namespace, args.cluster_domain)
    try:
        for host in hosts:
            pki.check_host(host)
    except pki.PKIError as exc:
        parser.exit(2, f"gpuwire certs ensure: {exc}\n")
    cluster = Cluster(kubeclient.api_client(args.kubeconfig))  # NoCluster: exit 4, saying why
    target = Target(args.namespace, args.service, args.secret, args.webhook_config)
    settings = rotation.Settings(tuple(hosts), args.ca_days, args.days, args.key_type)
    stop = threading.Event()
    if args.interval:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while True:
        code = _run_once(cluster, target, settings, args.out, args.grant_key_secret)
        if args.interval is None:
            return code
        ok = code == exits.OK
        if stop.wait(args.interval if ok else min(args.interval, RETRY_SECONDS)):
            return exits.OK


def _run_once(
    cluster: Cluster,
    target: Target,
    settings: rotation.Settings,
    out: str | None,
    grant_key_secret: str | None,
) -> int:
    """One check; its exit code: a check that failed is 1, the API server unreachable or
    refusing 5 (README.md, "Exit codes"), each said in one line."""
    now = dt.datetime.now(dt.UTC)
    try:
        data = reconcile.reconcile(cluster, target, settings, now)
        if grant_key_secret:
            grantkey.ensure_grant_key(cluster, target.namespace, grant_key_secret, now)
        if out and files.publish(Path(out), {n: data[n] for n in SERVED_FILES}):
            log.info("wrote %s to %s", ", ".join(SERVED_FILES), out)
    except (reconcile.ReconcileError, pki.PKIError, OSError) as exc:
        log.error("%s", exc)
        return exits.NO
    except Exception as exc:  # the API server's answer, or no answer: said, then retried
        said = kubeclient.explain(exc, kubeclient.host(cluster.core))
        if said is None:
            raise
        log.error("%s", said)
        return exits.CLUSTER
    return exits.OK
