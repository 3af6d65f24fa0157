"""No traceback reaches a user from any command: bad input, a missing file, no cluster, each
said in one line naming the path or value, with the exit code of its kind (README.md, "Exit
codes"). Before: a ConfigException traceback for a missing kubeconfig, `'str' object does not
support item assignment` for a bad one, the in-cluster error for `KUBECONFIG=/nonexistent`,
`[Errno 2]` without the path for a missing TLS file, FileNotFoundError tracebacks for a
missing simulated node."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwire import cli, exits


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No cluster to talk to: no kubeconfig anywhere, not a pod; a file in the way."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "unreachable").write_text(UNREACHABLE)
    return tmp_path


# A kubeconfig whose API server nobody answers at (port 1: connection refused)
UNREACHABLE = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


NO_CLUSTER = "no cluster to talk to: $KUBECONFIG is unset and "
CERTS = ["--namespace", "n", "--service", "s", "--secret", "t", "--webhook-config", "w"]
# (command words and arguments, exit code, what the line must say); {t}: the test's directory
CASES = [
    (["webhook", "serve", "--tls-cert", "{t}/tls.crt", "--tls-key", "{t}/tls.key"],
     exits.INPUT, "TLS certificate {t}/tls.crt: No such file or directory"),
    (["webhook", "serve", "--tls-cert", "{t}/a-file", "--tls-key", "{t}/a-file"],
     exits.INPUT, "are not a PEM certificate (chain) and its private key"),
    (["mutate", "{t}/pod.yaml"], exits.INPUT, "{t}/pod.yaml: No such file or directory"),
    (["mutate", "{t}/a-file"], exits.INPUT, "{t}/a-file: no Pod or workload in it"),
    (["grant", "verify", "--spec", "{t}/config.json"],
     exits.INPUT, "cannot read spec {t}/config.json: No such file or directory"),
    (["grant", "--namespace", "n", "--container", "c", "--devices", "all", "--pod", "p",
      "--grant-key-dir", "{t}/keys"], exits.INPUT, "no grant key in {t}/keys"),
    (["cdi", "generate", "--root", "{t}/root"], exits.INPUT, "{t}/root"),
    (["containerd", "configure", "--config", "{t}/c.toml", "--runtime-path", "/bin/true",
      "--config-source", "command", "--containerd", "{t}/containerd"],
     exits.INPUT, "{t}/containerd"),
    (["containerd", "unconfigure", "--config", "{t}/a-file"], exits.INPUT, "{t}/a-file"),
    (["containerd", "unconfigure", "--config", "{t}"], exits.INPUT, "{t}: cannot read"),
    (["device-plugin", "serve", "--sim", "{t}/node"],
     exits.INPUT, "{t}/node: no simulated node there"),
    (["dra", "serve", "--sim", "{t}/node"], exits.INPUT, "{t}/node: no simulated node there"),
    (["node", "label", "--sim", "{t}/node"], exits.INPUT, "gpuwire sim node {t}/node"),
    (["node", "advertise", "--count", "1"], exits.NO_CLUSTER, NO_CLUSTER),
    (["node", "unlabel"], exits.NO_CLUSTER, NO_CLUSTER),
    (["certs", "generate", "--out", "{t}/a-file/out", "--host", "a"],
     exits.INPUT, "cannot write --out {t}/a-file/out"),
    (["certs", "ensure", *CERTS], exits.NO_CLUSTER, NO_CLUSTER),
    (["certs", "ensure", *CERTS, "--kubeconfig", "{t}/a-file"],
     exits.NO_CLUSTER, "--kubeconfig {t}/a-file is not a kubeconfig"),
    # before: exit 1, after urllib3's `Retrying (Retry(total=1, …` warnings
    (["certs", "ensure", *CERTS, "--kubeconfig", "{t}/unreachable"],
     exits.CLUSTER, "ERROR certs: cannot reach https://127.0.0.1:1: Connection refused"),
    (["inventory"], exits.NO_CLUSTER, NO_CLUSTER),
    (["inventory", "--nodes", "{t}/nodes.yaml"], exits.INPUT, "{t}/nodes.yaml: No such file"),
    (["sim", "node", "{t}/a-file/node"], exits.INPUT, "cannot write the simulated node"),
    (["sim", "fault", "{t}/node", "--gpu", "0", "--xid", "79"],
     exits.INPUT, "{t}/node: no simulated node there"),
    (["sim", "mig", "{t}/node", "--gpu", "0", "--enable"],
     exits.INPUT, "{t}/node: no simulated node there"),
]  # fmt: skip


def test_every_command_has_a_case() -> None:
    covered = {tuple(w for w in argv if not w.startswith("-"))[:2] for argv, _, _ in CASES}
    for words, _, _ in cli.COMMANDS:
        assert any(c[: len(words)] == words for c in covered), words


@pytest.mark.parametrize(("argv", "code", "says"), CASES, ids=lambda v: None)
def test_a_bad_input_is_one_line_and_its_exit_code(
    nowhere: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    says: str,
) -> None:
    t = str(nowhere)
    try:
        returned = cli.main([a.replace("{t}", t) for a in argv])
    except SystemExit as exc:  # argparse's way, which `gpuwire` exits with as it is
        returned = exc.code  # type: ignore[assignment]
    assert returned == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert says.replace("{t}", t) in err
    assert len(err.strip().splitlines()) == 1, err
