"""Container probes as the kubelet's prober runs them ("Configure Liveness, Readiness and
Startup Probes", kubernetes.io/docs/tasks/configure-pod-container/
configure-liveness-readiness-startup-probes/; kubernetes/kubernetes `pkg/kubelet/prober/`):
each probe of a running container is tried at once, then every `periodSeconds` (default 10)
once `initialDelaySeconds` have passed since the container started, each try bounded by
`timeoutSeconds` (default 1); its result flips after `successThreshold` (1) successes or
`failureThreshold` (3) failures in a row. A readiness probe starts failed, a liveness probe
succeeded; while a startup probe has not succeeded the other two do not run.

Handlers: `exec` (CRI ExecSync: exit status 0), `httpGet` (the pod's address unless `host`;
`port` a number or a container port's name; `scheme` HTTP or HTTPS, whose certificate is
not checked, as the kubelet's is not; `httpHeaders`; 200-399 succeeds, a redirect is not
followed), `tcpSocket` (the connection opens). Left out: `grpc` probes, and a probe's own
`terminationGracePeriodSeconds`.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Connect = Callable[[str, int, float], socket.socket]
Exec = Callable[[list[str], int], int]  # (command, timeout) → exit status


def port_of(container: Obj, port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for named in container.get("ports") or ():
        if named.get("name") == port:
            return int(named["containerPort"])
    raise ValueError(f"port {port!r}: no container port of that name")


class _Https(http.client.HTTPSConnection):
    def __init__(self, sock: socket.socket, host: str, timeout: float) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        super().__init__(host, timeout=timeout, context=context)
        self._raw, self._tls = sock, context

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(self._raw, server_hostname=self.host)


class _Http(http.client.HTTPConnection):
    def __init__(self, sock: socket.socket, host: str, timeout: float) -> None:
        super().__init__(host, timeout=timeout)
        self._raw = sock

    def connect(self) -> None:
        self.sock = self._raw


def attempt(
    probe: Obj, container: Obj, pod_ip: str, connect: Connect, run: Exec
) -> tuple[bool, str]:
    """One try of `probe`: whether it succeeded, and what the kubelet would say if not."""
    timeout = int(probe.get("timeoutSeconds", 1))
    try:
        if "exec" in probe:
            status = run(list(probe["exec"]["command"]), timeout)
            return status == 0, f"command {probe['exec']['command']} exited {status}"
        if "tcpSocket" in probe:
            spec = probe["tcpSocket"]
            connect(spec.get("host") or pod_ip, port_of(container, spec["port"]), timeout).close()
            return True, ""
        spec = probe["httpGet"]
        host, port = spec.get("host") or pod_ip, port_of(container, spec["port"])
        sock = connect(host, port, timeout)
        cls = _Https if spec.get("scheme", "HTTP") == "HTTPS" else _Http
        conn = cls(sock, host, timeout)
        headers = {"User-Agent": "kube-probe/1.34", "Accept": "*/*"}
        headers |= {h["name"]: h["value"] for h in spec.get("httpHeaders") or ()}
        conn.request("GET", spec.get("path", "/"), headers=headers)
        answer = conn.getresponse()
        answer.read()
        conn.close()
        ok = 200 <= answer.status < 400
        return ok, f"HTTP probe failed with statuscode: {answer.status}"
    except (OSError, ssl.SSLError, http.client.HTTPException, ValueError) as exc:
        return False, f"probe failed: {exc}"


@dataclass
class Prober:
    """The prober of one probe of one container (its worker)."""

    kind: str  # liveness, readiness, startup
    probe: Obj
    started: float  # when the container started (monotonic)
    result: bool = False
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0
    message: str = ""
    tries: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.result = self.kind == "liveness"
        self.next_at = self.started + float(self.probe.get("initialDelaySeconds", 0))

    def due(self, now: float) -> bool:
        return now >= self.next_at

    @property
    def failed(self) -> bool:
        """`failureThreshold` failures in a row: a liveness or startup probe kills."""
        return self.failures >= int(self.probe.get("failureThreshold", 3))

    def record(self, ok: bool, message: str, now: float) -> None:
        self.tries.append(ok)
        self.next_at = now + float(self.probe.get("periodSeconds", 10))
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.probe.get("successThreshold", 1)):
                self.result = True
        else:
            self.successes, self.failures = 0, self.failures + 1
            self.message = message
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.result = False


def probers(container: Obj, started: float) -> dict[str, Prober]:
    return {
        kind: Prober(kind, container[f"{kind}Probe"], started)
        for kind in ("startup", "liveness", "readiness")
        if container.get(f"{kind}Probe")
    }


def run_due(
    found: dict[str, Prober], container: Obj, pod_ip: str, connect: Connect, run: Exec
) -> None:
    """Try every probe that is due (the startup probe alone until it succeeded)."""
    now = time.monotonic()
    startup = found.get("startup")
    kinds = ["startup"] if startup is not None and not startup.result else ["liveness", "readiness"]
    for kind in kinds:
        prober = found.get(kind)
        if prober is not None and prober.due(now):
            ok, message = attempt(prober.probe, container, pod_ip, connect, run)
            prober.record(ok, message, time.monotonic())
