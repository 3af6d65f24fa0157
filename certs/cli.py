"""`gpuwire certs …`: thin argparse shells over `certs.pki` (and `certs.ensure`)."""

from __future__ import annotations

import argparse
import datetime as dt

from certs import pki


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
        parser.exit(1, f"gpuwire certs generate: cannot write --out {args.out!r}: {exc}\n")
    print(f"wrote {paths.ca}, {paths.cert}, {paths.key} for {', '.join(args.host)}")
    return 0
