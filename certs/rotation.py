"""What the webhook's TLS Secret should hold next: a pure decision, one step at a time.

The Secret holds `ca.crt` (the trust bundle: the current CA first, then older CAs that have
not expired), `ca.key` (the current CA's key), and the serving pair `tls.crt`/`tls.key`.
Two rules keep every request working, whichever certificate a replica still serves: a new
serving certificate is written only once the webhook configuration trusts its CA (or trusts
nothing alive yet: a fresh install), and a CA leaves the bundle only when it expires (a
serving certificate never outlives its CA). So a CA rollover takes three steps, each a
separate write that any replica may make or repeat: add the new CA to the bundle, publish the
bundle as the `caBundle`, then reissue the serving certificate from the new CA. CAs the
`caBundle` trusts now stay in the bundle even when the Secret has lost them (deleted to force
a rotation), since replicas may still serve certificates they signed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cryptography import x509

from certs import pki

CA_KEY_FILE = "ca.key"


@dataclass(frozen=True)
class Settings:
    """What `ensure` is asked to keep: the names to serve, lifetimes and key type."""

    hosts: tuple[str, ...]
    ca_lifetime: dt.timedelta = pki.CA_LIFETIME
    lifetime: dt.timedelta = pki.SERVING_LIFETIME
    key_type: str = pki.DEFAULT_KEY_TYPE


@dataclass(frozen=True)
class Material:
    """The Secret's certificates and keys, parsed; `problems` says what could not be used."""

    ca: pki.Issued | None = None
    trust: tuple[x509.Certificate, ...] = ()
    serving: pki.Issued | None = None
    problems: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Mapping[str, bytes]) -> Material:
        problems: dict[str, str] = {}
        trust = _read_certs(data, pki.CA_FILE, problems)
        ca = _pair(trust, data, CA_KEY_FILE, problems)
        serving = _pair(_read_certs(data, pki.CERT_FILE, problems), data, pki.KEY_FILE, problems)
        return cls(ca, trust, serving, problems)

    def bundle(self) -> bytes:
        return pki.bundle_pem(self.trust)


@dataclass(frozen=True)
class Change:
    """Secret entries to write, and why (for the log)."""

    updates: dict[str, bytes] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)


def next_change(
    material: Material,
    published: Sequence[x509.Certificate],
    settings: Settings,
    now: dt.datetime,
) -> Change | None:
    """The next write the Secret needs, or None when it is as it should be.

    `published` is what the webhook configuration's `caBundle` trusts now.
    """
    change = Change()
    ca_reason = _ca_reason(material, now)
    if material.ca is None or ca_reason:
        ca = pki.new_ca(now, settings.ca_lifetime, settings.key_type)
        change.reasons.append(f"new CA ({ca_reason})")
        change.updates[CA_KEY_FILE] = ca.key_pem()
    else:
        ca = material.ca
    kept = [c for c in (*material.trust, *published) if c != ca.cert and _alive(c, now)]
    trust = (ca.cert, *dict.fromkeys(kept))
    if trust != material.trust:
        change.updates[pki.CA_FILE] = pki.bundle_pem(trust)
        if any(c not in trust for c in material.trust) and not ca_reason:
            change.reasons.append("expired CA dropped from the trust bundle")
        if any(c not in material.trust for c in published if c in trust):
            change.reasons.append("CAs the caBundle trusts kept in the trust bundle")
    problem = material.problems.get(pki.KEY_FILE) or material.problems.get(pki.CERT_FILE)
    serving_reason = _serving_reason(material.serving, problem, ca, settings, now)
    if serving_reason and _may_replace(ca, published, now):
        serving = pki.issue(ca, settings.hosts, now, settings.lifetime, settings.key_type)
        change.updates[pki.CERT_FILE] = serving.cert_pem()
        change.updates[pki.KEY_FILE] = serving.key_pem()
        change.reasons.append(f"new serving certificate ({serving_reason})")
    return change if change.updates else None


def _ca_reason(material: Material, now: dt.datetime) -> str | None:
    if material.ca is None:
        return material.problems.get(CA_KEY_FILE) or material.problems.get(pki.CA_FILE, "none yet")
    if not _alive(material.ca.cert, now):
        return f"the CA expired at {material.ca.cert.not_valid_after_utc:%Y-%m-%d %H:%M}Z"
    if pki.due(material.ca.cert, now):
        return f"renewal due since {pki.renew_after(material.ca.cert):%Y-%m-%d %H:%M}Z"
    return None


def _serving_reason(
    serving: pki.Issued | None,
    problem: str | None,
    ca: pki.Issued,
    settings: Settings,
    now: dt.datetime,
) -> str | None:
    if serving is None:
        return problem or "none yet"
    if not pki.issued_by(serving.cert, ca.cert):
        return "not issued by the current CA"
    if not _alive(serving.cert, now):
        return f"expired at {serving.cert.not_valid_after_utc:%Y-%m-%d %H:%M}Z"
    if pki.hosts_of(serving.cert) != set(settings.hosts):
        return f"names changed to {', '.join(settings.hosts)}"
    if pki.due(serving.cert, now):
        return f"renewal due since {pki.renew_after(serving.cert):%Y-%m-%d %H:%M}Z"
    return None


def _may_replace(ca: pki.Issued, published: Sequence[x509.Certificate], now: dt.datetime) -> bool:
    """Safe when clients trust the new issuer already, or trust nothing that is alive."""
    alive = [p for p in published if _alive(p, now)]
    return not alive or ca.cert in alive


def _alive(cert: x509.Certificate, now: dt.datetime) -> bool:
    return now < cert.not_valid_after_utc


def _read_certs(
    data: Mapping[str, bytes], name: str, problems: dict[str, str]
) -> tuple[x509.Certificate, ...]:
    if not data.get(name):  # absent, or empty as in a Secret that waits for its pair
        return ()
    try:
        return tuple(pki.load_certs(data[name], name))
    except pki.PKIError as exc:
        problems[name] = str(exc)
        return ()


def _pair(
    certs: tuple[x509.Certificate, ...],
    data: Mapping[str, bytes],
    key_name: str,
    problems: dict[str, str],
) -> pki.Issued | None:
    """The first certificate with its key from `key_name`, when both are there and match."""
    if not certs or not data.get(key_name):
        return None
    try:
        key = pki.load_key(data[key_name], key_name)
    except pki.PKIError as exc:
        problems[key_name] = str(exc)
        return None
    if not pki.key_matches(certs[0], key):
        problems[key_name] = f"{key_name} does not match its certificate"
        return None
    return pki.Issued(certs[0], key)
