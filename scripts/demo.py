"""`make demo`: the admission webhook over real TLS, admitting every pod in examples/.

A fresh CA and serving certificate (`certs`), a grant key, the example policy and the example
cluster's nodes; `gpuwire webhook serve` as a process; each example pod sent as the API server
sends it (AdmissionReview v1 over HTTPS, the CA verified) and what came back printed: the
annotations asked, then the patch, the warnings, or the denial.

The scenario (`webhook_scenario`, `admit_examples`) is kept apart from the printing (`show`)
so that a fuller demo can run the same steps and then start the containers.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from certs import pki
from gpuwire import grant
from gpuwire.annotations import KNOWN
from gpuwire.lab.webhook import serving
from webhook.review import request_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOT_PODS = ("nodes.yaml", "policy.yaml")


@dataclass(frozen=True)
class Admission:
    """One example pod and the webhook's answer to it."""

    example: str
    namespace: str
    pod: dict[str, Any]
    allowed: bool
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code: int = 200
    message: str = ""

    @property
    def asked(self) -> dict[str, str]:
        given = self.pod.get("metadata", {}).get("annotations") or {}
        return {k: v for k, v in given.items() if k in KNOWN}


@dataclass(frozen=True)
class Webhook:
    url: str
    ca: Path
    workdir: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=self.ca))


@contextmanager
def webhook_scenario(workdir: Path) -> Iterator[Webhook]:
    """The webhook serving the example cluster under the example policy, with fresh TLS."""
    tls = pki.generate(workdir / "tls", ["localhost", "127.0.0.1"])
    keys = workdir / "grant-keys"
    keys.mkdir()
    (keys / "demo-1").write_text(secrets.token_hex(32))
    args = [
        "--tls-cert", str(tls.cert),
        "--tls-key", str(tls.key),
        "--grant-key-dir", str(keys),
        "--policy", str(EXAMPLES / "policy.yaml"),
        "--nodes", str(EXAMPLES / "nodes.yaml"),
    ]  # fmt: skip
    with serving(args) as served:
        yield Webhook(served.url, tls.ca, workdir)


def example_pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if path.name not in NOT_PODS:
            yield path.name, yaml.safe_load(path.read_text())


def admit_examples(hook: Webhook) -> list[Admission]:
    """Every example pod through POST /mutate, as the API server would send it."""
    results = []
    with hook.client() as http:
        for name, pod in example_pods():
            namespace = pod["metadata"].get("namespace", "default")
            reply = http.post("/mutate", json=request_for(pod, namespace, uid=name))
            reply.raise_for_status()
            response = reply.json()["response"]
            patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
            status = response.get("status", {})
            results.append(
                Admission(
                    example=name,
                    namespace=namespace,
                    pod=pod,
                    allowed=response["allowed"],
                    patch=patch,
                    warnings=response.get("warnings", []),
                    code=status.get("code", 200),
                    message=status.get("message", ""),
                )
            )
    return results


# --- printing


def _container_name(pod: dict[str, Any], path: str) -> str:
    parts = path.split("/")
    return str(pod["spec"][parts[2]][int(parts[3])]["name"])


def _entry(pod: dict[str, Any], path: str, value: Any) -> str:
    if value.get("name") == grant.ENV:
        value = {**value, "value": value["value"][:20] + "…"}
    return f"{_container_name(pod, path)}: {value['name']}={value['value']}"


def _requirements(value: Any) -> list[str]:
    """`key Op values` for every node selector requirement inside `value`."""
    if isinstance(value, list):
        return [r for item in value for r in _requirements(item)]
    if not isinstance(value, dict):
        return []
    if "operator" in value:
        values = value.get("values")
        return [f"{value['key']} {value['operator']}" + (f" {values}" if values else "")]
    return [r for item in value.values() for r in _requirements(item)]


def describe(pod: dict[str, Any], op: dict[str, Any]) -> list[str]:
    """One patch operation in words."""
    path, value = op["path"], op.get("value")
    if "/env" in path:
        if op["op"] == "remove":
            index = int(path.rsplit("/", 1)[1])
            container = pod["spec"][path.split("/")[2]][int(path.split("/")[3])]
            return [f"- env {_container_name(pod, path)}: {container['env'][index]['name']}"]
        mark = "~" if op["op"] == "replace" else "+"
        entries = value if isinstance(value, list) else [value]
        return [f"{mark} env {_entry(pod, path, e)}" for e in entries]
    if "affinity" in path:
        return [f"+ required node affinity: {r}" for r in _requirements(value)]
    return [f"+ {path.removeprefix('/spec/')}: {json.dumps(value)}"]


def show(result: Admission) -> str:
    lines = [f"── {result.example}  (namespace {result.namespace})"]
    asked = ", ".join(f"{k}={v}" for k, v in result.asked.items()) or "no GPU annotations"
    lines.append(f"   asks: {asked}")
    if result.allowed:
        changes = [line for op in result.patch for line in describe(result.pod, op)]
        lines.append(f"   admitted, {len(result.patch)} patch operation(s)")
        lines += [f"     {c}" for c in changes] or ["     (unchanged)"]
    else:
        lines.append(f"   DENIED ({result.code}): {result.message}")
    lines += [f"   warning: {w}" for w in result.warnings]
    return "\n".join(lines)


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="gpuwire-demo-") as tmp,
        webhook_scenario(Path(tmp)) as hook,
    ):
        print(f"gpuwire webhook serving {hook.url} (TLS, verified against a fresh CA)")
        print("policy examples/policy.yaml, nodes examples/nodes.yaml\n")
        results = admit_examples(hook)
        for result in results:
            print(show(result) + "\n")
    admitted = sum(r.allowed for r in results)
    print(f"{len(results)} pods: {admitted} admitted, {len(results) - admitted} denied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
