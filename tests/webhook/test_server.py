"""The HTTP contract over real TLS: `gpuwire webhook serve` as a process, certificates from
`certs`, AdmissionReview v1 and v1beta1, bad bodies, probes, metrics, and files that rotate
under a running server."""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kubernetes_validate
import pytest

from certs import pki
from gpuwire import annotations as a
from gpuwire import grant
from testbed.webhook import WebhookProcess, serving
from tests.webhook.support import (
    K8S_VERSION,
    Files,
    client,
    container,
    eventually,
    make_files,
    pod,
)
from webhook.review import request_for


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return make_files(tmp_path_factory.mktemp("webhook"))


@pytest.fixture(scope="module")
def served(files: Files) -> Iterator[WebhookProcess]:
    with serving(files.args()) as process:
        yield process


@pytest.fixture(scope="module")
def http(served: WebhookProcess, files: Files) -> Iterator[httpx.Client]:
    with client(served, files.tls.ca) as c:
        yield c


def post(http: httpx.Client, body: Any) -> httpx.Response:
    return http.post("/mutate", json=body)


def answer(http: httpx.Client, body: Any) -> dict[str, Any]:
    reply = post(http, body)
    assert reply.status_code == 200, reply.text
    data: dict[str, Any] = reply.json()
    return data


def patched(p: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    mutated: dict[str, Any] = jsonpatch.apply_patch(p, ops)
    kubernetes_validate.validate(mutated, K8S_VERSION, strict=True)
    return mutated


GPU_POD = pod({a.MODEL: "H100", a.COUNT: "all"}, [container("trainer")])
MEDIA = "media"  # where examples/policy.yaml lets a pod take every GPU of its node (allGpus)


def test_v1_review_gets_a_v1_answer_with_uid_and_base64_patch(http: httpx.Client) -> None:
    body = request_for(GPU_POD, MEDIA, uid="8d5e1a6f-1")
    reply = answer(http, body)
    assert reply["apiVersion"] == "admission.k8s.io/v1"
    assert reply["kind"] == "AdmissionReview"
    response = reply["response"]
    assert response["uid"] == "8d5e1a6f-1"
    assert response["allowed"] is True
    mutated = patched(GPU_POD, response)
    env = {e["name"]: e["value"] for e in mutated["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env[grant.ENV].startswith("2024-01:")
    assert mutated["spec"]["runtimeClassName"] == "gpuwire"


def test_v1beta1_is_answered_in_v1beta1(http: httpx.Client) -> None:
    body = request_for(GPU_POD, MEDIA, uid="old-1")
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    reply = answer(http, body)
    assert reply["apiVersion"] == "admission.k8s.io/v1beta1"
    assert reply["response"]["uid"] == "old-1"
    assert reply["response"]["allowed"] is True


def test_a_denial_is_allowed_false_with_a_4xx_and_the_reason(http: httpx.Client) -> None:
    bad = pod({a.MODEL: "B200"}, [container(gpus=1)])
    response = answer(http, request_for(bad, "ml-research"))["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    assert response["status"]["code"] == 400
    assert response["status"]["message"] == (
        "gpuwire.io/gpu-model: 'B200' matches no GPU node; models present: NVIDIA-A100-SXM4-40GB, "
        "NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-L4, Tesla-T4"
    )
    forbidden = answer(http, request_for(GPU_POD, "sandbox-1"))["response"]
    assert forbidden["status"]["code"] == 403
    assert forbidden["status"]["reason"] == "Forbidden"


def test_warnings_reach_the_client_and_stay_short(http: httpx.Client) -> None:
    handwritten = pod({}, [container("web", env={"NVIDIA_VISIBLE_DEVICES": "all"})])
    response = answer(http, request_for(handwritten, "default"))["response"]
    assert response["warnings"] == ["container 'web': NVIDIA_VISIBLE_DEVICES=all replaced by void"]
    long_name = "x" * 60
    noisy = pod({}, [container(long_name, env={"NVIDIA_VISIBLE_DEVICES": "GPU-" + "f" * 80})])
    (warning,) = answer(http, request_for(noisy, "default"))["response"]["warnings"]
    assert len(warning) == 120
    assert warning.endswith("…")


def test_dry_run_gets_the_same_answer(http: httpx.Client) -> None:
    body = request_for(GPU_POD, MEDIA)
    dry = request_for(GPU_POD, MEDIA)
    dry["request"]["dryRun"] = True
    assert answer(http, dry) == answer(http, body)


def test_what_the_webhook_does_not_handle_passes_untouched(http: httpx.Client) -> None:
    mirror = pod(
        {"kubernetes.io/config.mirror": "x"}, [container(env={"NVIDIA_VISIBLE_DEVICES": "all"})]
    )
    update = request_for(GPU_POD, MEDIA)
    update["request"]["operation"] = "UPDATE"
    other = request_for({"kind": "ConfigMap"}, "ml-research")
    other["request"]["kind"]["kind"] = "ConfigMap"
    for body in (
        request_for(GPU_POD, "kube-system"),
        request_for(mirror, "default"),
        update,
        other,
    ):
        response = answer(http, body)["response"]
        assert response == {"uid": "gpuwire-mutate", "allowed": True}


def test_an_admitted_pod_admitted_again_gets_no_patch(http: httpx.Client) -> None:
    first = patched(GPU_POD, answer(http, request_for(GPU_POD, MEDIA))["response"])
    again = answer(http, request_for(first, MEDIA))["response"]
    assert again == {"uid": "gpuwire-mutate", "allowed": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "body is not JSON"),
        (b"[]", "body is not a JSON object"),
        (b'{"kind": "Pod", "apiVersion": "v1"}', "expected kind AdmissionReview"),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}',
            "has no request object",
        ),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}',
            "request.uid is missing",
        ),
        (b"\xff\xfe", "body is not JSON"),
        (b"[" * 100_000, "body is not JSON"),  # nested deeper than a decoder recurses
    ],
)
def test_malformed_bodies_get_400_with_a_status(
    http: httpx.Client, body: bytes, message: str
) -> None:
    reply = http.post("/mutate", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400
    status = reply.json()
    assert status["kind"] == "Status"
    assert status["code"] == 400
    assert message in status["message"]


def test_a_malformed_pod_is_a_denial_naming_the_field(http: httpx.Client) -> None:
    body = request_for({"spec": {"containers": [{"name": "a", "env": "x"}]}}, "ml")
    response = answer(http, body)["response"]
    assert response["status"]["code"] == 400
    assert (
        response["status"]["message"] == "malformed pod: spec.containers[0].env is str, not a list"
    )


def test_oversized_bodies_get_413_and_the_server_keeps_serving(http: httpx.Client) -> None:
    big = b"x" * (5 << 20)
    refused = http.post("/mutate", content=big)
    assert refused.status_code == 413
    assert refused.json()["message"] == f"body over {4 << 20} bytes"

    def chunks() -> Iterator[bytes]:  # no content-length: cut off while streaming
        for _ in range(6):
            yield b"x" * (1 << 20)

    assert http.post("/mutate", content=chunks()).status_code == 413
    assert answer(http, request_for(GPU_POD, MEDIA))["response"]["allowed"] is True


def test_only_post_mutates(http: httpx.Client) -> None:
    assert http.get("/mutate").status_code == 405


def test_probes(http: httpx.Client) -> None:
    assert http.get("/healthz").text == "ok"
    ready = http.get("/readyz")
    assert (ready.status_code, ready.text) == (200, "ok")


def metric(http: httpx.Client, name: str) -> float:
    """One sample from /metrics, `name` with its labels as Prometheus prints them."""
    samples = dict(
        line.rsplit(" ", 1) for line in http.get("/metrics").text.splitlines() if line[:1] != "#"
    )
    return float(samples[name])


def test_metrics_count_admissions_by_outcome_and_time_them(http: httpx.Client) -> None:
    mutated = 'gpuwire_webhook_admissions_total{outcome="mutated"}'
    denied = 'gpuwire_webhook_admissions_total{outcome="denied"}'
    invalid = 'gpuwire_webhook_admissions_total{outcome="invalid"}'
    timed = "gpuwire_webhook_admission_duration_seconds_count"
    before = {m: metric(http, m) for m in (mutated, denied, invalid, timed)}
    answer(http, request_for(GPU_POD, MEDIA))
    answer(http, request_for(pod({a.COUNT: "x"}), "ml-research"))
    http.post("/mutate", content=b"nope")
    after = {m: metric(http, m) for m in before}
    assert {m: after[m] - before[m] for m in before} == {
        mutated: 1,
        denied: 1,
        invalid: 1,
        timed: 3,
    }
    assert metric(http, "gpuwire_webhook_inventory_gpu_nodes") == 5


# a line of gpuwire.logs' text format, the webhook's component
LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) webhook: \S")


def test_each_admission_is_logged_once_saying_who_and_what_in_one_format(
    served: WebhookProcess, http: httpx.Client
) -> None:
    """Before: uvicorn's lines and the webhook's in two formats, no time; a denial's line
    named no pod; admissions and warnings were not logged, warnings not counted."""
    warned = 'gpuwire_webhook_warnings_total{kind="env-replaced"}'
    before = metric(http, warned) if warned in http.get("/metrics").text else 0.0
    named = pod({a.MODEL: "H100"}, [container("trainer", gpus=1)])
    named["metadata"]["name"] = "trainer-0"
    answer(http, request_for(named, "ml-research", uid="uid-admitted"))
    typo = pod({"gpuwire.io/gpu-modle": "A100"}, [container(gpus=1)])
    typo["metadata"] = {
        "generateName": "web-7d9f-",
        "annotations": typo["metadata"]["annotations"],
        "ownerReferences": [
            {"kind": "ReplicaSet", "name": "web-7d9f", "uid": "u", "apiVersion": "apps/v1"}
        ],
    }
    answer(http, request_for(typo, "ml-research", uid="uid-denied"))
    baked = pod({}, [container("web", env={"NVIDIA_VISIBLE_DEVICES": "all"})])
    answer(http, request_for(baked, "default", uid="uid-warned"))
    assert metric(http, warned) - before == 1
    expected = [
        "INFO webhook: admitted ml-research/trainer-0 (uid uid-admitted): trainer: 1 from the "
        "device plugin, compute,utility",
        "INFO webhook: denied ml-research/web-7d9f-* (of ReplicaSet web-7d9f) (uid uid-denied): "
        "400: gpuwire.io/gpu-modle: 'A100': unknown annotation gpuwire.io/gpu-modle: did you "
        "mean gpuwire.io/gpu-model?",
        "INFO webhook: admitted default/p (uid uid-warned): no GPU asked for",
        "WARNING webhook: warning for default/p (uid uid-warned): env-replaced: container "
        "'web': NVIDIA_VISIBLE_DEVICES=all replaced by void",
    ]
    eventually(lambda: all(e in served.output() for e in expected), "the admissions' lines")
    for e in expected:
        assert sum(e in line for line in served.log) == 1, e
    lines = [line for line in served.log if line.strip()]
    assert any("Uvicorn running on" in line for line in lines)  # uvicorn's, in the same format
    assert [line for line in lines if not LINE.match(line)] == []


def test_plain_http_is_not_served(http: httpx.Client) -> None:
    url = http.base_url.copy_with(scheme="http", path="/healthz")
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, timeout=5)


# --- files rotated under a running server


def handshake_ca(url: str, ca: Path) -> bool:
    """Whether a new connection verifies against `ca`."""
    host, port = url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=ca)
    try:
        with (
            socket.create_connection((host, int(port)), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError:
        return False


def test_rotated_files_take_effect_without_a_restart(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    with serving(files.args()) as served, client(served, files.tls.ca):
        pid = served.pid
        old_ca = tmp_path / "old-ca.crt"
        shutil.copy(files.tls.ca, old_ca)

        # certificate: a new CA and serving pair published the way the kubelet updates a Secret
        pki.generate(tmp_path / "tls", ["localhost", "127.0.0.1"])
        eventually(lambda: handshake_ca(served.url, files.tls.ca), "the new certificate")
        assert not handshake_ca(served.url, old_ca)

        with client(served, files.tls.ca) as fresh:
            # grant keys: a newer key signs, by name
            (files.keys / "2024-02").write_text("second-secret\n")

            def signed_by(key_id: str) -> bool:
                mutated = patched(GPU_POD, answer(fresh, request_for(GPU_POD, MEDIA))["response"])
                env = {e["name"]: e["value"] for e in mutated["spec"]["containers"][0]["env"]}
                return str(env[grant.ENV]).startswith(key_id + ":")

            eventually(lambda: signed_by("2024-02"), "the new grant key")

            # policy: a broken file keeps the last good one, a fixed file takes effect
            two = request_for(pod({a.COUNT: "2"}), "ml-research")
            assert answer(fresh, two)["response"]["allowed"] is True
            files.policy.write_text("devicePlugin: [oops\n")
            eventually(
                lambda: metric(fresh, 'gpuwire_webhook_reload_failures{source="policy"}') == 1,
                "the failed policy reload",
            )
            assert answer(fresh, two)["response"]["allowed"] is True
            files.policy.write_text("devicePlugin: false\n")
            eventually(lambda: not answer(fresh, two)["response"]["allowed"], "the new policy")
            assert served.process.poll() is None
            assert served.pid == pid
    assert "policy" in served.output()
    assert "did not load" in served.output()


def test_not_ready_without_a_grant_key_until_one_arrives(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    (files.keys / "2024-01").unlink()
    with serving(files.args()) as served, client(served, files.tls.ca) as http:
        ready = http.get("/readyz")
        assert (ready.status_code, ready.text) == (503, "no grant key loaded")
        response = answer(http, request_for(GPU_POD, MEDIA))["response"]
        assert response["warnings"] == ["no grant key loaded: GPUWIRE_GRANT not written"]
        (files.keys / "2024-03").write_text("late\n")
        eventually(lambda: http.get("/readyz").status_code == 200, "readiness")


def test_bad_start_up_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    files.policy.write_text("unknownModel: maybe\n")
    refused = "policy unknownModel: 'maybe' is not accepted"
    with pytest.raises(RuntimeError, match=refused), serving(files.args()):
        pass
    files.policy.write_text("")
    missing = [*files.args(), "--tls-key", str(tmp_path / "missing.key")]
    with pytest.raises(RuntimeError, match="No such file"), serving(missing):
        pass
