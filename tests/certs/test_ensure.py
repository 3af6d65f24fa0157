"""`gpuwire certs ensure` against the kube-apiserver stand-in, through the `kubernetes` client:
first install, idempotency, renewal, CA rollover, replicas racing, and what failures look like."""

from __future__ import annotations

import base64
import datetime as dt
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from certs import grantkey, pki, reconcile, rotation
from certs.cluster import Cluster
from gpuwire import cli, exits
from testbed.apiserver import ApiServer
from tests.certs.test_pki import handshake

REPO = Path(__file__).resolve().parents[2]
NS, SERVICE, SECRET, CONFIG = "gpuwire-system", "gpuwire-webhook", "gpuwire-webhook-tls", "gpuwire"
TARGET = reconcile.Target(NS, SERVICE, SECRET, CONFIG)
SETTINGS = rotation.Settings(tuple(pki.service_hosts(SERVICE, NS)))
NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


def webhook_configuration() -> dict[str, Any]:
    """The one the manifests install (caBundle empty), plus a webhook that is not ours."""
    config: dict[str, Any] = yaml.safe_load(
        (REPO / "deploy/base/webhook-configuration.yaml").read_text()
    )
    other = {
        "name": "other.example.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "clientConfig": {
            "service": {"namespace": "elsewhere", "name": "other"},
            "caBundle": base64.b64encode(b"someone else's").decode(),
        },
    }
    config["webhooks"].append(other)
    return config


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        server.put(webhook_configuration())
        yield server


def ensure(api: ApiServer, now: dt.datetime = NOW) -> dict[str, bytes]:
    return reconcile.reconcile(Cluster(api.client()), TARGET, SETTINGS, now)


def secret_data(api: ApiServer) -> dict[str, bytes]:
    secret = api.get("secrets", SECRET, NS)
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def ca_bundle(api: ApiServer) -> list[x509.Certificate]:
    config = api.get("mutatingwebhookconfigurations", CONFIG)
    assert config is not None
    (ours,) = [w for w in config["webhooks"] if w["name"] == "pods.gpuwire.io"]
    pem = base64.b64decode(ours["clientConfig"].get("caBundle", ""))
    return pki.load_certs(pem, "caBundle") if pem else []


def serving(data: dict[str, bytes]) -> x509.Certificate:
    return pki.load_certs(data["tls.crt"], "tls.crt")[0]


def writes(api: ApiServer, since: int = 0) -> list[str]:
    return [f"{r.method} {r.path}" for r in api.requests[since:] if r.method != "GET"]


def test_first_run_creates_the_secret_and_sets_the_ca_bundle(
    api: ApiServer, tmp_path: Path
) -> None:
    returned = ensure(api)
    data = secret_data(api)
    assert returned == data
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert pki.hosts_of(serving(data)) == set(SETTINGS.hosts)
    # What the kube-apiserver will trust is what signed the certificate the server presents.
    bundle = tmp_path / "caBundle.pem"
    bundle.write_bytes(pki.bundle_pem(ca_bundle(api)))
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    files = pki.TLSFiles(bundle, tmp_path / "tls.crt", tmp_path / "tls.key")
    assert handshake(files, f"{SERVICE}.{NS}.svc", bundle) is None
    # The other webhook in the configuration is not ours to touch.
    config = api.get("mutatingwebhookconfigurations", CONFIG)
    assert config is not None
    assert (
        config["webhooks"][1]["clientConfig"]["caBundle"]
        == base64.b64encode(b"someone else's").decode()
    )


def test_second_run_writes_nothing(api: ApiServer) -> None:
    first = ensure(api)
    seen, version = len(api.requests), api.resource_version
    assert ensure(api, NOW + 30 * DAY) == first
    assert writes(api, seen) == []
    assert api.resource_version == version


def test_renewal_at_two_thirds_replaces_only_the_serving_certificate(api: ApiServer) -> None:
    first = ensure(api)
    seen = len(api.requests)
    assert ensure(api, NOW + 59 * DAY) == first
    renewed = ensure(api, NOW + 61 * DAY)
    assert writes(api, seen) == [f"PUT /api/v1/namespaces/{NS}/secrets/{SECRET}"]
    assert serving(renewed) != serving(first)
    assert renewed["ca.key"] == first["ca.key"]
    assert pki.issued_by(serving(renewed), ca_bundle(api)[0])


def test_ca_rollover_publishes_the_new_ca_before_serving_from_it(api: ApiServer) -> None:
    for day in range(0, 721, 30):  # a sidecar checking every month keeps it renewed
        ensure(api, NOW + day * DAY)
    old_ca = ca_bundle(api)
    assert len(old_ca) == 1
    seen = len(api.requests)
    data = ensure(api, NOW + 731 * DAY)
    secret_put = f"PUT /api/v1/namespaces/{NS}/secrets/{SECRET}"
    config_put = f"PUT /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG}"
    assert writes(api, seen) == [secret_put, config_put, secret_put]
    bundle = ca_bundle(api)
    assert bundle[1:] == old_ca
    assert pki.issued_by(serving(data), bundle[0])


def test_replicas_racing_on_a_fresh_cluster_converge_on_one_certificate(api: ApiServer) -> None:
    results = race(api, 8, NOW)
    assert all(r == results[0] for r in results)
    assert results[0] == secret_data(api)
    # One create of the Secret, one update of the caBundle: nobody wrote twice.
    assert int(api.resource_version) - results.start_version == 2


def test_replicas_racing_on_a_due_renewal_renew_once(api: ApiServer) -> None:
    first = ensure(api)
    results = race(api, 8, NOW + 61 * DAY)
    assert all(r == results[0] for r in results)
    assert serving(results[0]) != serving(first)
    assert int(api.resource_version) - results.start_version == 1


class Results(list[dict[str, bytes]]):
    start_version = 0


def race(api: ApiServer, replicas: int, now: dt.datetime) -> Results:
    results = Results()
    results.start_version = int(api.resource_version)
    errors: list[BaseException] = []
    barrier = threading.Barrier(replicas)

    def replica() -> None:
        cluster = Cluster(api.client())
        barrier.wait()
        try:
            results.append(reconcile.reconcile(cluster, TARGET, SETTINGS, now))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == replicas
    return results


def test_corrupt_secret_is_repaired_and_the_log_says_why(
    api: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    ensure(api)
    secret = api.get("secrets", SECRET, NS)
    assert secret is not None
    secret["data"]["tls.key"] = base64.b64encode(b"garbage").decode()
    api.put(secret)
    with caplog.at_level("INFO", logger="gpuwire.certs"):
        data = ensure(api)
    assert pki.key_matches(serving(data), pki.load_key(data["tls.key"], "tls.key"))
    assert "tls.key: not an unencrypted PEM private key" in caplog.text


def test_a_secret_of_another_type_is_refused_naming_it(api: ApiServer) -> None:
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": NS},
        }
    )
    wrong_type = r"has type 'Opaque', not 'kubernetes\.io/tls'"
    with pytest.raises(reconcile.ReconcileError, match=wrong_type):
        ensure(api)


def test_missing_configuration_or_service_is_an_error_that_says_so(api: ApiServer) -> None:
    wrong_service = reconcile.Target(NS, "nope", SECRET, CONFIG)
    with pytest.raises(reconcile.ReconcileError, match=f"no webhook calling service {NS}/nope"):
        reconcile.reconcile(Cluster(api.client()), wrong_service, SETTINGS, NOW)
    api.delete("mutatingwebhookconfigurations", CONFIG)
    with pytest.raises(reconcile.ReconcileError, match="'gpuwire' not found"):
        ensure(api)
    assert api.get("secrets", SECRET, NS) is None  # nothing half-done


def test_a_deleted_secret_is_recreated_and_the_old_ca_stays_trusted(api: ApiServer) -> None:
    first = ensure(api)
    api.delete("secrets", SECRET, NS)
    seen = len(api.requests)
    data = ensure(api)
    secret_create = f"POST /api/v1/namespaces/{NS}/secrets"
    secret_put = f"PUT /api/v1/namespaces/{NS}/secrets/{SECRET}"
    config_put = f"PUT /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG}"
    assert writes(api, seen) == [secret_create, config_put, secret_put]
    bundle = ca_bundle(api)
    assert len(bundle) == 2
    assert pki.issued_by(serving(first), bundle[1])  # replicas not yet synced keep working
    assert pki.issued_by(serving(data), bundle[0])


def test_a_reset_ca_bundle_is_restored(api: ApiServer) -> None:
    ensure(api)
    bundle = ca_bundle(api)
    api.put(webhook_configuration())  # `kubectl replace` from the manifests
    ensure(api)
    assert ca_bundle(api) == bundle


def test_grant_key_is_made_once_and_never_replaced(api: ApiServer) -> None:
    cluster = Cluster(api.client())
    made = grantkey.ensure_grant_key(cluster, NS, "gpuwire-grant-keys", NOW)
    assert made == grantkey.key_id(NOW)
    secret = api.get("secrets", "gpuwire-grant-keys", NS)
    assert secret is not None
    key = base64.b64decode(secret["data"][made])
    assert len(key) == 64  # 32 random bytes, hex
    assert grantkey.ensure_grant_key(cluster, NS, "gpuwire-grant-keys", NOW + DAY) is None
    again = api.get("secrets", "gpuwire-grant-keys", NS)
    assert again is not None
    assert again["data"] == secret["data"]


def test_grant_key_fills_the_empty_secret_the_manifests_install(api: ApiServer) -> None:
    empty = yaml.safe_load((REPO / "deploy/base/grant-keys.yaml").read_text())
    api.put(empty | {"metadata": empty["metadata"] | {"namespace": NS}})
    made = grantkey.ensure_grant_key(Cluster(api.client()), NS, "gpuwire-grant-keys", NOW)
    secret = api.get("secrets", "gpuwire-grant-keys", NS)
    assert secret is not None
    assert list(secret["data"]) == [made]
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "grant-keys"


# --- the command line, as the Deployment runs it


def ensure_argv(kubeconfig: Path, out: Path, *extra: str) -> list[str]:
    return [
        "certs",
        "ensure",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={NS}",
        f"--service={SERVICE}",
        f"--secret={SECRET}",
        f"--webhook-config={CONFIG}",
        "--grant-key-secret=gpuwire-grant-keys",
        f"--out={out}",
        *extra,
    ]


def test_cli_writes_the_files_the_server_reads_and_never_the_ca_key(
    api: ApiServer, tmp_path: Path
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    out = tmp_path / "tls"
    assert cli.main(ensure_argv(kubeconfig, out)) == 0
    data = secret_data(api)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("..")) == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert (out / name).read_bytes() == data[name]
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert b"PRIVATE KEY" not in (out / "ca.crt").read_bytes()
    assert api.get("secrets", "gpuwire-grant-keys", NS) is not None


def test_cli_processes_racing_converge(api: ApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    start = int(api.resource_version)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuwire.cli", *ensure_argv(kubeconfig, tmp_path / f"out{i}")],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    certs = {(tmp_path / f"out{i}" / "tls.crt").read_bytes() for i in range(4)}
    assert certs == {secret_data(api)["tls.crt"]}
    # The TLS Secret, the caBundle and the grant key: each written once.
    assert int(api.resource_version) - start == 3


def test_cli_an_api_server_s_refusal_exits_5_with_the_reason(
    api: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.fail("POST", f"/api/v1/namespaces/{NS}/secrets", 500)
    assert cli.main(ensure_argv(kubeconfig, tmp_path / "out")) == exits.CLUSTER
    assert " answered 500 Internal Server Error: " in caplog.text
    assert "injected fault (500)" in caplog.text
    assert not (tmp_path / "out").exists()
    assert cli.main(ensure_argv(kubeconfig, tmp_path / "out")) == 0  # the next try converges


def test_cli_bad_input_changes_nothing(
    api: ApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    for bad, message in [
        ("--interval=0", "'0' is not a duration"),
        ("--interval=5d", "'5d' is not a duration"),
        ("--service=Bad_Name", "host 'Bad_Name' is neither"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(ensure_argv(kubeconfig, tmp_path / "out", bad))
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
    assert api.get("secrets", SECRET, NS) is None
    assert not (tmp_path / "out").exists()


def test_cli_interval_mode_keeps_running_and_stops_cleanly_on_sigterm(
    api: ApiServer, tmp_path: Path
) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    out = tmp_path / "tls"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwire.cli", *ensure_argv(kubeconfig, out, "--interval=1s")],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The sidecar's second check finds the caBundle reset and puts it back.
        wait_for(lambda: (out / "tls.crt").exists())
        bundle = ca_bundle(api)
        api.put(webhook_configuration())
        wait_for(lambda: ca_bundle(api) != [])
        assert ca_bundle(api) == bundle
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "caBundle of pods.gpuwire.io set" in err


def wait_for(condition: Any) -> None:
    for _ in range(600):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in 30 s")


def test_no_cluster_to_talk_to_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = cli.main(ensure_argv(tmp_path / "missing-kubeconfig", tmp_path / "out"))
    assert code == exits.NO_CLUSTER
    assert capsys.readouterr().err == (
        f"gpuwire certs ensure: --kubeconfig {tmp_path}/missing-kubeconfig does not exist; "
        "give a kubeconfig file\n"
    )
