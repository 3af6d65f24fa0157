"""One precedence for every command's Kubernetes client, kubectl's: `--kubeconfig`, then
`$KUBECONFIG`, then `~/.kube/config`, then (none of them there) the pod's service account."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.config import incluster_config

import kubeclient
from certs import pki
from gpuwire import cli, exits
from tests.certs.test_ensure import NOW


def kubeconfig(path: Path, server: str, contexts: tuple[str, ...] = ("main",)) -> str:
    """A kubeconfig whose contexts each name their own server (`server/<context>`)."""
    lines = ["apiVersion: v1", "kind: Config", f"current-context: {contexts[0]}"]
    lines += ["users:", "- name: u", "  user: {token: t}", "clusters:"]
    lines += [f"- name: {c}\n  cluster: {{server: '{server}/{c}'}}" for c in contexts]
    lines += ["contexts:"]
    lines += [f"- name: {c}\n  context: {{cluster: {c}, user: u}}" for c in contexts]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home without a kubeconfig, no $KUBECONFIG, and a pod's service account around."""
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "ca.crt").write_bytes(pki.new_ca(NOW).cert_pem())
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def host(kubeconfig: str | None = None, context: str | None = None) -> str:
    return str(kubeclient.api_client(kubeconfig, context).configuration.host)


def test_in_cluster_config_is_used_in_a_pod(home: Path) -> None:
    """Without --kubeconfig, inside a pod: the service account's token and the service host."""
    client = kubeclient.api_client(None)
    assert client.configuration.host == "https://10.0.0.1:443"
    assert client.configuration.api_key == {"BearerToken": "bearer t0ken"}


def test_each_source_beats_the_ones_after_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / ".kube").mkdir()
    kubeconfig(home / ".kube/config", "http://home")
    assert host() == "http://home/main"  # ~/.kube/config before the service account
    env = kubeconfig(tmp_path / "env", "http://env")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/missing:{env}")
    assert host() == "http://env/main"  # $KUBECONFIG (its files that exist) before the home's
    flag = kubeconfig(tmp_path / "flag", "http://flag", ("main", "other"))
    assert host(flag) == "http://flag/main"  # --kubeconfig before everything
    assert host(flag, "other") == "http://flag/other"  # and --context picks within it


def test_a_kubeconfig_named_but_unusable_is_an_error_not_a_fallback(
    home: Path, tmp_path: Path
) -> None:
    with pytest.raises(kubeclient.NoCluster) as missing:
        kubeclient.api_client(str(tmp_path / "missing"))
    assert str(missing.value) == (
        f"--kubeconfig {tmp_path}/missing does not exist; give a kubeconfig file"
    )
    with pytest.raises(kubeclient.NoCluster) as context:
        kubeclient.api_client(kubeconfig(tmp_path / "k", "http://k"), "no-such-context")
    assert str(context.value).startswith(f"--kubeconfig {tmp_path}/k cannot be used: ")
    assert "no-such-context" in str(context.value)
    assert context.value.exit_code == exits.NO_CLUSTER


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("foo\n", "is not a kubeconfig (a YAML mapping of clusters, contexts and users"),
        ("", "cannot be used: Invalid kube-config."),
        ("clusters: [\n", "cannot be read: while parsing"),
    ],
)
def test_a_kubeconfig_that_is_none_says_so(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str, said: str
) -> None:
    """Before: `'str' object does not support item assignment`, and a traceback."""
    path = tmp_path / "config"
    path.write_text(content)
    with pytest.raises(kubeclient.NoCluster) as flag:
        kubeclient.api_client(str(path))
    assert str(flag.value).startswith(f"--kubeconfig {path} {said}")
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(kubeclient.NoCluster) as env:
        kubeclient.api_client(None)
    assert str(env.value).startswith(f"kubeconfig {path} {said}")


def test_without_any_source_the_error_says_where_it_looked(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ConfigException `Service host/port is not set.`, also for a $KUBECONFIG that
    names nothing (the in-cluster error, not the file's)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(kubeclient.NoCluster) as unset:
        kubeclient.api_client(None)
    assert str(unset.value) == (
        f"no cluster to talk to: $KUBECONFIG is unset and {home}/.kube/config does not exist, "
        "and this is not a pod (KUBERNETES_SERVICE_HOST is unset); give --kubeconfig FILE, "
        "set $KUBECONFIG, or run in a pod with a service account"
    )
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    with pytest.raises(kubeclient.NoCluster) as env:
        kubeclient.api_client(None)
    assert str(env.value).startswith(
        "no cluster to talk to: $KUBECONFIG=/nonexistent names no file that exists, and this "
        "is not a pod"
    )


@pytest.mark.parametrize(
    "command",
    [
        "webhook.cli:serve",
        "deviceplugin.cli:serve",
        "deviceplugin.cli:label",
        "deviceplugin.cli:advertise",
        "certs.cli:ensure",
        "inventory.cli:main",
    ],
)
def test_every_command_offers_the_one_kubeconfig_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.resolve(command)(["--help"])
    assert f"--kubeconfig FILE {kubeclient.HELP}" in " ".join(capsys.readouterr().out.split())
