"""The testbed cluster the manifests run on (testbed/cluster.py): a sandboxed node whose
kubelet runs pods over CRI with what their specs say, the controllers and the secure API
server. Busybox pods, one cluster for the module."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import containerds
from testbed.cluster import Cluster, up
from testbed.image import NAME, write_layout_tar
from testbed.node import GATEWAY
from testbed.waiting import until
from tests.conftest import requires_binary, requires_root

Obj = dict[str, Any]
NS = "t"
pytestmark = [requires_root(), requires_binary("unshare", "runc", "ip")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    image = write_layout_tar(tmp_path_factory.mktemp("image") / "busybox.tar")
    with up(containerds.system(), images=[image]) as made:
        made.api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield made


def pod(name: str, *containers: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": NAME} | c for c in containers],
            **spec,
        },
    }


def shell(script: str, **container: Any) -> Obj:
    return {"command": ["sh", "-c", script], **container}


def stored(cluster: Cluster, name: str) -> Obj:
    found = cluster.api.get("pods", name, NS)
    assert found is not None
    return found


def condition(cluster: Cluster, name: str, kind: str) -> bool:
    conditions = (stored(cluster, name).get("status") or {}).get("conditions") or ()
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def container_state(cluster: Cluster, name: str, index: int = 0) -> Obj:
    statuses = (stored(cluster, name).get("status") or {}).get("containerStatuses") or [{}]
    found: Obj = statuses[index]
    return found


def logs(cluster: Cluster, name: str) -> str:
    status = container_state(cluster, name)
    cid = status.get("containerID", "").removeprefix("containerd://")
    return cluster.kubelet.runtime.logs(cid) if cid else ""


def test_a_host_path_is_the_nodes_never_this_machines(cluster: Cluster) -> None:
    where = f"/var/lib/testbed-{uuid.uuid4().hex[:6]}"
    volume = {"name": "h", "hostPath": {"path": where, "type": "DirectoryOrCreate"}}
    cluster.api.create(
        pod(
            "host",
            shell(
                "echo here > /h/file; sleep 600", volumeMounts=[{"name": "h", "mountPath": "/h"}]
            ),
            volumes=[volume],
        )
    )
    until(lambda: cluster.node.path(f"{where}/file").exists(), 60)
    assert cluster.node.path(f"{where}/file").read_text() == "here\n"
    assert (cluster.node.upper / where.lstrip("/") / "file").exists()
    assert not Path(where).exists()
    missing = {"name": "m", "hostPath": {"path": "/nowhere", "type": "Directory"}}
    cluster.api.create(
        pod(
            "missing",
            shell("true", volumeMounts=[{"name": "m", "mountPath": "/m"}]),
            volumes=[missing],
        )
    )
    until(
        lambda: (
            "hostPath type check failed: /nowhere is not a directory"
            in str(container_state(cluster, "missing"))
        ),
        30,
    )
    assert stored(cluster, "missing")["status"]["phase"] == "Pending"


def test_env_command_and_volumes_as_the_kubelet_makes_them(cluster: Cluster) -> None:
    cluster.api.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": NS},
            "data": {"greeting": "hello", "other": "x"},
        }
    )
    secret = base64.b64encode(b"s3cret").decode()
    cluster.api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": NS},
            "data": {"key": secret},
        }
    )
    script = (
        "echo args: $(WHO) '$$(WHO)' '$(NOT_SET)'; "
        "echo node=$NODE mem=$MEM grt=$GREETING svc=$KUBERNETES_SERVICE_HOST; id; "
        "ls -lnL /cm/ /s/; cat /cm/hello /s/key; echo; sleep 600"
    )
    env = [
        {"name": "WHO", "value": "me"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {
            "name": "MEM",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        },
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
    ]
    container = shell(
        script,
        env=env,
        resources={"limits": {"memory": "64Mi"}},
        securityContext={"runAsUser": 1000, "runAsGroup": 1000},
        volumeMounts=[{"name": "cm", "mountPath": "/cm"}, {"name": "s", "mountPath": "/s"}],
    )
    volumes = [
        {
            "name": "cm",
            "configMap": {
                "name": "cm",
                "items": [{"key": "greeting", "path": "hello", "mode": 0o600}],
            },
        },
        {"name": "s", "secret": {"secretName": "s", "defaultMode": 0o400}},
    ]
    cluster.api.create(pod("env", container, volumes=volumes, securityContext={"fsGroup": 2000}))
    until(lambda: "s3cret" in logs(cluster, "env"), 60)
    out = logs(cluster, "env")
    assert "args: me $(WHO) $(NOT_SET)" in out
    assert f"node=gpu-node-0 mem=64 grt=hello svc={GATEWAY}" in out
    assert "uid=1000 gid=1000 groups=1000,2000" in out
    assert "-rw-r----- " in out  # mode 0600 item / 0400 secret, read for the fsGroup: 0640, 0440
    assert "-r--r----- " in out
    assert [line.split()[2:4] for line in out.splitlines() if line.startswith("-r")] == [
        ["0", "2000"],
        ["0", "2000"],
    ]
    assert "hello" in out


def test_a_projected_token_authenticates_the_pod_as_its_account(cluster: Cluster) -> None:
    cluster.api.put(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "agent", "namespace": NS},
        }
    )
    cluster.api.create(
        pod(
            "token",
            shell("cat /var/run/secrets/kubernetes.io/serviceaccount/token; echo; sleep 600"),
            serviceAccountName="agent",
        )
    )
    until(lambda: logs(cluster, "token").count(".") >= 2, 60)
    token = logs(cluster, "token").strip()
    user = cluster.api.authenticate(token)
    assert user.name == f"system:serviceaccount:{NS}:agent"
    assert user.extra["authentication.kubernetes.io/pod-name"] == ("token",)
    assert user.extra["authentication.kubernetes.io/node-name"] == ("gpu-node-0",)


def test_init_containers_run_one_after_another_until_each_succeeds(cluster: Cluster) -> None:
    where = f"/var/lib/testbed-{uuid.uuid4().hex[:6]}"
    mount = [{"name": "h", "mountPath": "/h"}]
    cluster.api.create(
        pod(
            "init",
            shell("cat /h/order; sleep 600", volumeMounts=mount),
            initContainers=[
                {
                    "name": "wait",
                    "image": NAME,
                    "volumeMounts": mount,
                    "command": ["sh", "-c", "echo tried >> /h/order; test -e /h/go"],
                },
                {
                    "name": "second",
                    "image": NAME,
                    "volumeMounts": mount,
                    "command": ["sh", "-c", "echo second >> /h/order"],
                },
            ],
            volumes=[{"name": "h", "hostPath": {"path": where, "type": "DirectoryOrCreate"}}],
        )
    )
    until(
        lambda: (
            cluster.node.path(f"{where}/order").exists()
            and cluster.node.path(f"{where}/order").read_text().count("tried") >= 2
        ),
        60,
    )
    assert not condition(cluster, "init", "Initialized")
    assert container_state(cluster, "init")["state"]["waiting"]
    cluster.node.path(f"{where}/go").touch()
    until(lambda: condition(cluster, "init", "Ready"), 60)
    order = cluster.node.path(f"{where}/order").read_text().split()
    assert order[-1] == "second"
    assert set(order[:-1]) == {"tried"}
    statuses = stored(cluster, "init")["status"]["initContainerStatuses"]
    assert [s["restartCount"] >= 1 for s in statuses] == [True, False]


def test_readiness_keeps_a_pod_out_of_its_service_and_liveness_restarts_it(
    cluster: Cluster,
) -> None:
    where = f"/var/lib/testbed-{uuid.uuid4().hex[:6]}"
    cluster.node.path(where).mkdir(parents=True)
    (cluster.node.path(where) / "alive").touch()
    container = shell(
        "exec httpd -f -p 8080 -h /h",
        ports=[{"name": "web", "containerPort": 8080}],
        volumeMounts=[{"name": "h", "mountPath": "/h"}],
        readinessProbe={"httpGet": {"path": "/ready", "port": "web"}, "periodSeconds": 1},
        livenessProbe={
            "exec": {"command": ["test", "-e", "/h/alive"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    )
    served = pod("probed", container, volumes=[{"name": "h", "hostPath": {"path": where}}])
    served["metadata"]["labels"] = {"app": "probed"}
    cluster.api.create(served)
    cluster.api.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "probed", "namespace": NS},
            "spec": {
                "selector": {"app": "probed"},
                "ports": [{"name": "http", "port": 80, "targetPort": "web"}],
            },
        }
    )

    def endpoint_ready() -> bool:
        found = cluster.api.get("endpointslices", "probed-testbed", NS)
        return bool(found and found["endpoints"] and found["endpoints"][0]["conditions"]["ready"])

    until(lambda: container_state(cluster, "probed").get("started"), 60)
    until(lambda: cluster.api.get("endpointslices", "probed-testbed", NS), 30)
    assert not endpoint_ready()
    assert not condition(cluster, "probed", "Ready")
    (cluster.node.path(where) / "ready").write_text("yes\n")
    until(endpoint_ready, 30)
    assert condition(cluster, "probed", "Ready")
    (cluster.node.path(where) / "alive").unlink()
    until(lambda: container_state(cluster, "probed")["restartCount"] >= 1, 60)
    assert container_state(cluster, "probed")["lastState"]["terminated"]["message"] == (
        "liveness probe failed"
    )


def test_run_as_non_root_refuses_an_image_that_runs_as_root(cluster: Cluster) -> None:
    cluster.api.create(pod("rooted", shell("sleep 600", securityContext={"runAsNonRoot": True})))
    until(
        lambda: (
            container_state(cluster, "rooted").get("state", {}).get("waiting", {}).get("reason")
            == "CreateContainerConfigError"
        ),
        60,
    )
    assert (
        "image will run as root"
        in container_state(cluster, "rooted")["state"]["waiting"]["message"]
    )


def test_a_daemonset_rolls_and_a_deployment_keeps_its_replicas(cluster: Cluster) -> None:
    template: Obj = {
        "metadata": {"labels": {"app": "d"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": NAME,
                    "command": ["sh", "-c", "sleep 600"],
                    "env": [{"name": "V", "value": "1"}],
                }
            ],
        },
    }
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": template},
    }
    cluster.apply([ds])
    until(
        lambda: len([p for p in cluster.pods(NS, {"app": "d"}) if p["spec"].get("nodeName")]) == 1,
        60,
    )
    (first,) = cluster.pods(NS, {"app": "d"})
    until(lambda: condition(cluster, first["metadata"]["name"], "Ready"), 60)
    template["spec"]["containers"][0]["env"][0]["value"] = "2"
    cluster.apply([ds])
    until(
        lambda: (
            [p["metadata"]["uid"] for p in cluster.pods(NS, {"app": "d"})]
            not in ([], [first["metadata"]["uid"]])
        ),
        60,
    )
    (second,) = cluster.pods(NS, {"app": "d"})
    assert second["spec"]["containers"][0]["env"] == [{"name": "V", "value": "2"}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "w"}},
            "template": {**template, "metadata": {"labels": {"app": "w"}}},
        },
    }
    cluster.apply([deployment])
    until(
        lambda: (
            sum(
                condition(cluster, p["metadata"]["name"], "Ready")
                for p in cluster.pods(NS, {"app": "w"})
            )
            == 2
        ),
        60,
    )
    cluster.delete([ds, deployment])
    cluster.wait_gone(NS, {"app": "d"})
    cluster.wait_gone(NS, {"app": "w"})


def test_restarting_containerd_leaves_the_pods_running(cluster: Cluster) -> None:
    cluster.api.create(pod("steady", shell("sleep 600")))
    until(lambda: container_state(cluster, "steady").get("started"), 60)
    cid = container_state(cluster, "steady")["containerID"]
    before = cluster.node.containerd_restarts
    assert cluster.node.systemctl("restart", "containerd") == (0, "")
    assert cluster.node.containerd_restarts == before + 1
    until(lambda: cluster.node.ctr("version", check=False).returncode == 0, 30)
    assert container_state(cluster, "steady")["containerID"] == cid
    assert container_state(cluster, "steady")["restartCount"] == 0
