"""The webhook's CA and serving certificate: names, chain, lifetimes, and a real TLS handshake."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs import pki
from gpuwire import cli

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
HOSTS = pki.service_hosts("gpuwire-webhook", "gpuwire-system")


def handshake(files: pki.TLSFiles, server_name: str, cafile: Path) -> str | None:
    """A real TLS handshake over a socket pair; None when it succeeds, else the client's error."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(files.cert, files.key)
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    client_sock, server_sock = socket.socketpair()

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(server_sock, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(client_sock, server_hostname=server_name) as c:
            c.sendall(b"x")
        return None
    except ssl.SSLCertVerificationError as exc:
        return exc.verify_message
    finally:
        client_sock.close()
        thread.join()


def test_service_hosts_cover_every_name_the_apiserver_may_dial() -> None:
    assert HOSTS == [
        "gpuwire-webhook",
        "gpuwire-webhook.gpuwire-system",
        "gpuwire-webhook.gpuwire-system.svc",
        "gpuwire-webhook.gpuwire-system.svc.cluster.local",
    ]


def test_generate_writes_a_chain_that_tls_clients_accept_for_every_host(tmp_path: Path) -> None:
    files = pki.generate(tmp_path / "tls", [*HOSTS, "127.0.0.1"])
    for host in [*HOSTS, "127.0.0.1"]:
        assert handshake(files, host, files.ca) is None, host
    assert "mismatch" in (handshake(files, "other.gpuwire-system.svc", files.ca) or "")


def test_another_ca_is_not_trusted(tmp_path: Path) -> None:
    files = pki.generate(tmp_path / "a", HOSTS)
    other = pki.generate(tmp_path / "b", HOSTS)
    assert handshake(files, HOSTS[2], other.ca) is not None


def test_serving_certificate_is_an_end_entity_for_server_auth_signed_by_the_ca() -> None:
    ca = pki.new_ca(NOW)
    serving = pki.issue(ca, HOSTS, NOW)
    assert pki.issued_by(serving.cert, ca.cert)
    assert pki.hosts_of(serving.cert) == set(HOSTS)
    assert serving.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = serving.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert (constraints.ca, constraints.path_length) == (True, 0)
    assert not pki.issued_by(serving.cert, pki.new_ca(NOW).cert)


def test_default_keys_are_ecdsa_p256() -> None:
    ca = pki.new_ca(NOW)
    serving = pki.issue(ca, HOSTS, NOW)
    for issued in (ca, serving):
        assert isinstance(issued.key, ec.EllipticCurvePrivateKey)
        assert issued.key.curve.name == "secp256r1"


def test_lifetimes_and_renewal_at_two_thirds() -> None:
    ca = pki.new_ca(NOW)
    serving = pki.issue(ca, HOSTS, NOW)
    assert serving.cert.not_valid_after_utc == NOW + dt.timedelta(days=90)
    assert ca.cert.not_valid_after_utc == NOW + dt.timedelta(days=3 * 365)
    # Backdated a little, so a node whose clock is behind accepts a fresh certificate.
    assert serving.cert.not_valid_before_utc == NOW - pki.CLOCK_SKEW
    assert not pki.due(serving.cert, NOW + dt.timedelta(days=59))
    assert pki.due(serving.cert, NOW + dt.timedelta(days=61))
    assert not pki.due(ca.cert, NOW + dt.timedelta(days=2 * 365 - 1))
    assert pki.due(ca.cert, NOW + dt.timedelta(days=2 * 365 + 1))


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca = pki.new_ca(NOW, lifetime=dt.timedelta(days=30))
    serving = pki.issue(ca, HOSTS, NOW, lifetime=dt.timedelta(days=90))
    assert serving.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


@pytest.mark.parametrize("key_type", sorted(pki.KEY_TYPES))
def test_every_key_type_makes_a_working_chain(tmp_path: Path, key_type: str) -> None:
    files = pki.generate(tmp_path, HOSTS, key_type=key_type)
    assert handshake(files, HOSTS[2], files.ca) is None


@pytest.mark.parametrize(
    "host",
    ["", "UPPER.example", "-lead.example", "under_score.svc", "a..b", "x" * 64 + ".svc", "*"],
)
def test_bad_host_is_refused_naming_it_and_writes_nothing(tmp_path: Path, host: str) -> None:
    with pytest.raises(pki.PKIError, match="neither an IP address nor a DNS name") as err:
        pki.generate(tmp_path / "out", ["good.svc", host])
    assert repr(host) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_wildcard_and_ipv6_hosts_are_accepted() -> None:
    serving = pki.issue(pki.new_ca(NOW), ["*.gpuwire-system.svc", "::1"], NOW)
    assert pki.hosts_of(serving.cert) == {"*.gpuwire-system.svc", "::1"}


def test_key_is_owner_only_and_certs_are_readable(tmp_path: Path) -> None:
    files = pki.generate(tmp_path, HOSTS)
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.cert.stat().st_mode) == 0o644
    assert stat.S_IMODE(files.ca.stat().st_mode) == 0o644


def test_regenerating_replaces_all_files_together_and_leaves_one_version(tmp_path: Path) -> None:
    first = pki.generate(tmp_path, HOSTS)
    old_cert = first.cert.read_bytes()
    # A reader holding the old files open keeps a consistent old pair.
    with first.cert.open("rb") as held:
        second = pki.generate(tmp_path, HOSTS)
        assert held.read() == old_cert
    cert = pki.load_certs(second.cert.read_bytes(), "tls.crt")[0]
    key = pki.load_key(second.key.read_bytes(), "tls.key")
    ca = pki.load_certs(second.ca.read_bytes(), "ca.crt")[0]
    assert cert.public_bytes(serialization.Encoding.PEM) != old_cert
    assert pki.key_matches(cert, key)
    assert pki.issued_by(cert, ca)
    versions = [p.name for p in tmp_path.iterdir() if p.name.startswith("..")]
    assert len(versions) == 2  # `..data` and the one version it points at
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("..")) == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]


def test_load_errors_name_the_input() -> None:
    with pytest.raises(pki.PKIError, match=r"ca\.crt: not a PEM certificate bundle"):
        pki.load_certs(b"garbage", "ca.crt")
    with pytest.raises(pki.PKIError, match=r"tls\.key: not an unencrypted PEM private key"):
        pki.load_key(b"garbage", "tls.key")


def test_cli_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    argv = ["certs", "generate", "--out", str(out), "--host", "a.svc", "--host", "10.0.0.1"]
    assert cli.main([*argv, "--days", "7"]) == 0
    assert "a.svc, 10.0.0.1" in capsys.readouterr().out
    cert = pki.load_certs((out / "tls.crt").read_bytes(), "tls.crt")[0]
    assert pki.hosts_of(cert) == {"a.svc", "10.0.0.1"}
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=7) + pki.CLOCK_SKEW


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--key-type", "dsa"], "invalid choice: 'dsa'"),
        (["--days", "0"], "'0' is not a whole number of days"),
        (["--host", "Bad_Host"], "host 'Bad_Host' is neither"),
    ],
)
def test_cli_generate_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["certs", "generate", "--out", str(tmp_path / "o"), "--host", "a.svc", *extra]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
