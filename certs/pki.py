"""A private CA and the webhook's serving certificate: pure functions over `cryptography`.

The kube-apiserver trusts the webhook through the `caBundle` of its configuration, so the CA is
private to one install and never needs a public root. ECDSA P-256 by default: small, fast to
verify, accepted by every Go TLS stack. Lifetimes are short enough that rotation runs often
(a broken rotation shows while a third of the lifetime is left) and long enough that a
cluster switched off for weeks still comes back with valid certificates.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import files

CA_LIFETIME = dt.timedelta(days=3 * 365)
SERVING_LIFETIME = dt.timedelta(days=90)
# Renew when this fraction of a certificate's lifetime has passed.
RENEW_AT = 2 / 3
# Backdate notBefore so a node whose clock runs a little behind accepts a fresh certificate.
CLOCK_SKEW = dt.timedelta(minutes=5)
CA_NAME = "gpuwire webhook CA"
CLUSTER_DOMAIN = "cluster.local"

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

KEY_TYPES: dict[str, Callable[[], PrivateKey]] = {
    "ecdsa-p256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "ecdsa-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "rsa-2048": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "rsa-3072": lambda: rsa.generate_private_key(public_exponent=65537, key_size=3072),
}
DEFAULT_KEY_TYPE = "ecdsa-p256"

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"

_DNS_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class PKIError(ValueError):
    """Input that cannot make a certificate (bad host name, unknown key type, bad PEM)."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class TLSFiles:
    """Where `generate` put the CA bundle, the serving certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def service_hosts(service: str, namespace: str, cluster_domain: str = CLUSTER_DOMAIN) -> list[str]:
    """Every name the kube-apiserver may use for a Service (it dials `<svc>.<ns>.svc`)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def check_host(host: str) -> x509.GeneralName:
    """A subject alternative name for `host`: an IP address, or a DNS name (`*.` allowed)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.removeprefix("*.").split(".")
    if len(host) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise PKIError(
            f"host {host!r} is neither an IP address nor a DNS name (dot-separated labels of "
            "1-63 lower-case letters, digits and '-'; a '*.' prefix is allowed)"
        )
    return x509.DNSName(host)


def new_key(key_type: str = DEFAULT_KEY_TYPE) -> PrivateKey:
    try:
        make = KEY_TYPES[key_type]
    except KeyError:
        raise PKIError(
            f"key type {key_type!r} is not one of {', '.join(sorted(KEY_TYPES))}"
        ) from None
    return make()


def new_ca(
    now: dt.datetime,
    lifetime: dt.timedelta = CA_LIFETIME,
    key_type: str = DEFAULT_KEY_TYPE,
) -> Issued:
    """A self-signed CA that may sign only end-entity certificates (path length 0)."""
    key = new_key(key_type)
    # A timestamp in the name tells CAs apart in a caBundle during a rollover.
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"{CA_NAME} {now:%Y-%m-%dT%H:%M:%SZ}"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(name, name, key, now, now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True, rsa_key=isinstance(key, rsa.RSAPrivateKey)), True)
        .add_extension(ski, critical=False)
        .sign(key, _hash_for(key))
    )
    return Issued(cert, key)


def issue(
    ca: Issued,
    hosts: Sequence[str],
    now: dt.datetime,
    lifetime: dt.timedelta = SERVING_LIFETIME,
    key_type: str = DEFAULT_KEY_TYPE,
) -> Issued:
    """A TLS server certificate for `hosts`, signed by `ca`, never outliving it."""
    if not hosts:
        raise PKIError("no host given: a serving certificate needs at least one name")
    names = [check_host(h) for h in hosts]
    key = new_key(key_type)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    not_after = min(now + lifetime, ca.cert.not_valid_after_utc)
    cert = (
        _builder(subject, ca.cert.subject, key, now, not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False, rsa_key=isinstance(key, rsa.RSAPrivateKey)), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
        .sign(ca.key, _hash_for(ca.key))
    )
    return Issued(cert, key)


def renew_after(cert: x509.Certificate) -> dt.datetime:
    """When `cert` is due for renewal: two thirds into its validity."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AT


def due(cert: x509.Certificate, now: dt.datetime) -> bool:
    return now >= renew_after(cert)


def hosts_of(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses a certificate is valid for."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(san.get_values_for_type(x509.DNSName)) | ips


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """True when `ca`'s key signed `cert` (names and signature both checked)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def bundle_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def load_certs(pem: bytes, what: str) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle; `what` names the input in the error."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise PKIError(f"{what}: not a PEM certificate bundle ({exc})") from None
    return certs


def load_key(pem: bytes, what: str) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise PKIError(f"{what}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PKIError(f"{what}: {type(key).__name__} keys are not supported (ECDSA or RSA)")
    return key


def generate(
    out_dir: str | os.PathLike[str],
    hosts: Sequence[str],
    *,
    now: dt.datetime | None = None,
    ca_lifetime: dt.timedelta = CA_LIFETIME,
    lifetime: dt.timedelta = SERVING_LIFETIME,
    key_type: str = DEFAULT_KEY_TYPE,
) -> TLSFiles:
    """Write `ca.crt`, `tls.crt`, `tls.key` for `hosts` to `out_dir`, replacing all three at once.

    The CA's key is discarded: nothing can sign another certificate under this CA later.
    """
    now = now or dt.datetime.now(dt.UTC)
    for host in hosts:
        check_host(host)
    ca = new_ca(now, ca_lifetime, key_type)
    serving = issue(ca, hosts, now, lifetime, key_type)
    out = Path(out_dir)
    files.publish(
        out,
        {CA_FILE: ca.cert_pem(), CERT_FILE: serving.cert_pem(), KEY_FILE: serving.key_pem()},
    )
    return TLSFiles(out / CA_FILE, out / CERT_FILE, out / KEY_FILE)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: PrivateKey,
    now: dt.datetime,
    not_after: dt.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
    )


def _key_usage(*, ca: bool, rsa_key: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        # RSA key exchange (TLS 1.2 without ECDHE) encrypts with the server's key.
        key_encipherment=rsa_key and not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _hash_for(key: PrivateKey) -> hashes.SHA256 | hashes.SHA384:
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        return hashes.SHA384()
    return hashes.SHA256()
