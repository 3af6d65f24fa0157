"""Container records: what the runtime side writes, how a crash leaves them, and how the node
agent tells a record of a running container from one of a container that is gone, with real
processes standing in for containers (tests/system/test_records_runc.py does it with runc)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwire import records
from gpuwire.records import DRA, PLUGIN, PLUGIN_LESS, ContainerRecord, RecordError
from testbed.waiting import until

CONTAINERD = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.sandbox-namespace": "team-a",
    "io.kubernetes.cri.sandbox-name": "trainer-0",
    "io.kubernetes.cri.sandbox-uid": "0d5d2c2a-1111-4b4b-8c8c-123456789abc",
    "io.kubernetes.cri.container-name": "main",
}
CRIO = {
    "io.kubernetes.pod.namespace": "team-b",
    "io.kubernetes.pod.name": "server-1",
    "io.kubernetes.pod.uid": "77",
    "io.kubernetes.container.name": "srv",
}
GPU_A, GPU_B = (
    "GPU-aaaaaaaa-0000-0000-0000-000000000000",
    "GPU-bbbbbbbb-0000-0000-0000-000000000000",
)


def record(container: str = "c1", **fields: object) -> ContainerRecord:
    values: dict[str, object] = {
        "annotations": CONTAINERD,
        "gpus": [GPU_B, GPU_A],
        "path": PLUGIN_LESS,
        "whole_node": False,
        "capabilities": ["compute", "utility"],
    }
    values.update(fields)
    return records.started(container, **values)  # type: ignore[arg-type]


def test_a_record_names_the_pod_from_containerd_or_cri_o_annotations() -> None:
    r = record()
    assert (r.namespace, r.pod, r.pod_uid, r.container) == (
        "team-a",
        "trainer-0",
        "0d5d2c2a-1111-4b4b-8c8c-123456789abc",
        "main",
    )
    assert r.gpus == (GPU_A, GPU_B)  # sorted, as the annotation and metrics list them
    crio = record(annotations=CRIO)
    assert (crio.namespace, crio.pod, crio.pod_uid, crio.container) == (
        "team-b",
        "server-1",
        "77",
        "srv",
    )
    bare = record(annotations={})  # `ctr run`, podman: no pod
    assert (bare.namespace, bare.pod, bare.container) == ("", "", "")


def test_written_atomically_into_a_root_only_directory(tmp_path: Path) -> None:
    root = tmp_path / "containers"
    first = record(pid=os.getpid())
    records.write(str(root), first)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "c1").stat().st_mode) == 0o600
    assert os.listdir(root) == ["c1"]  # no temporary file left behind
    assert records.decode((root / "c1").read_text()) == first
    assert json.loads((root / "c1").read_text())["gpus"] == [GPU_A, GPU_B]
    second = record(gpus=[GPU_A], path=PLUGIN)
    records.write(str(root), second)  # the same container again: replaced whole
    assert [e.record for e in records.scan(str(root))] == [second]
    assert records.remove(str(root), "c1") is True
    assert records.remove(str(root), "c1") is False
    assert os.listdir(root) == []


@pytest.mark.parametrize("bad", ["", ".", "..", "../etc", "a/b", ".hidden", "x" * 251, "é"])
def test_an_id_that_is_not_runcs_is_refused_and_nothing_is_written(
    tmp_path: Path, bad: str
) -> None:
    with pytest.raises(RecordError, match="expected letters, digits and _"):
        records.write(str(tmp_path), record(bad))
    with pytest.raises(RecordError):
        records.remove(str(tmp_path), bad)
    assert os.listdir(tmp_path) == []


def test_a_dra_record_names_its_claims_and_shares_and_others_read_as_before() -> None:
    """A container of DRA claims names them and the GPUs it holds as a share; a record
    without claims is written exactly as before they existed (an agent of the previous
    version still reads it)."""
    dra = record(path=DRA, claims=["team-a/b", "team-a/a", "team-a/a"], shares=[GPU_B])
    assert (dra.claims, dra.shares) == (("team-a/a", "team-a/b"), (GPU_B,))
    assert records.decode(records.encode(dra)) == dra
    plain = json.loads(records.encode(record()))
    assert not {"claims", "shares"} & set(plain)
    assert records.decode(records.encode(record())) == record()


def test_an_unknown_path_is_refused() -> None:
    with pytest.raises(RecordError, match=r"path 'gpu': expected one of plugin, dra, plugin-less"):
        record(path="gpu")


def test_writing_imports_nothing_heavy(tmp_path: Path) -> None:
    """The shim and the hook write records on every GPU container start."""
    code = (
        "import sys, gpuwire.records as r;"
        f"r.write({str(tmp_path)!r}, r.started('c', {{}}, ['GPU-a'], path='plugin',"
        " whole_node=False, capabilities=['compute'], pid=1));"
        "print(sorted({'json','re','enum','dataclasses','typing'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert records.decode((tmp_path / "c").read_text()).pid == 1


def test_the_init_pid_tells_a_running_container(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    alive = record(pid=sleeper.pid)
    assert alive.start == records.process_start(sleeper.pid)
    assert records.status(alive) == records.RUNNING
    assert alive.start is not None
    values: list[Any] = [alive.start - 1 if n == "start" else v for n, v in alive.as_dict().items()]
    reused = ContainerRecord(*values)
    assert records.status(reused) == records.GONE  # the pid now belongs to another process
    sleeper.kill()
    until(lambda: records.process_start(sleeper.pid) is None)  # a zombie is gone already
    assert records.status(alive) == records.GONE
    sleeper.wait()
    assert records.status(alive) == records.GONE


def test_the_runtime_state_dir_tells_a_running_container(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    state = tmp_path / "runc" / "c1"
    r = record(state=str(state))
    assert records.status(r) == records.ABSENT  # not created (yet), or deleted
    state.mkdir(parents=True)
    (state / "state.json").write_text("{garbage")
    assert records.status(r) == records.UNKNOWN  # cannot tell: kept
    start = records.process_start(sleeper.pid)
    (state / "state.json").write_text(
        json.dumps({"id": "c1", "init_process_pid": sleeper.pid, "init_process_start": start})
    )
    assert records.status(r) == records.RUNNING
    host = tmp_path / "host"  # the agent sees the host's files under a mount
    (host / "run").mkdir(parents=True)
    (tmp_path / "runc").rename(host / "run" / "runc")
    assert records.status(record(state="/run/runc/c1"), str(host)) == records.RUNNING
    sleeper.kill()
    sleeper.wait()
    assert records.status(record(state="/run/runc/c1"), str(host)) == records.GONE


@pytest.mark.parametrize(
    ("args", "state"),
    [
        (["--root", "/run/containerd/runc/k8s.io", "--log", "l", "create", "c1"], "k8s.io/c1"),
        (["--root=/run/containerd/runc/k8s.io/", "create", "c1"], "k8s.io/c1"),
        (["create", "--bundle", "/b", "c1"], "/run/runc/c1"),
    ],
)
def test_the_state_dir_follows_runcs_root_flag(args: list[str], state: str) -> None:
    assert records.runtime_state(args, "c1").endswith(state)


def test_sweep_removes_what_is_gone_and_keeps_what_may_run(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    root = tmp_path / "containers"
    dead = subprocess.Popen(["true"])
    dead.wait()
    unreadable = tmp_path / "broken-state"
    unreadable.mkdir()
    (unreadable / "state.json").write_text("{")
    records.write(str(root), record("running", pid=sleeper.pid))
    records.write(str(root), record("dead", pid=dead.pid))  # gone at once, however young
    records.write(str(root), record("never-created", state=str(tmp_path / "nowhere")))
    records.write(str(root), record("starting", state=str(tmp_path / "s")))
    records.write(str(root), record("cannot-tell", state=str(unreadable)))
    (root / ".crashed.77.tmp").write_text('{"version":1,"id":"cras')  # a write cut short
    (root / "foreign").write_text("not a record")
    target = tmp_path / "precious"
    target.write_text("keep me")
    (root / "link").symlink_to(target)
    for name in ("never-created", "cannot-tell", ".crashed.77.tmp", "foreign"):
        os.utime(root / name, (0, 100.0))  # old enough
    for name in ("dead", "starting", "running"):
        os.utime(root / name, (0, 990.0))  # written 10 s ago: a container may be starting
    live, removed = records.sweep(str(root), grace=60, now=1000.0)
    assert sorted(removed) == [".crashed.77.tmp", "dead", "foreign", "link", "never-created"]
    assert sorted(r.id for r in live) == ["cannot-tell", "running", "starting"]
    assert sorted(os.listdir(root)) == ["cannot-tell", "running", "starting"]
    assert target.read_text() == "keep me"  # the link was removed, not followed


def test_a_file_that_holds_another_containers_record_is_not_that_record(tmp_path: Path) -> None:
    (tmp_path / "c2").write_text(records.encode(record("c1")))
    [entry] = records.scan(str(tmp_path))
    assert entry.record is None
    assert "holds the record of c1" in str(entry.error)


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"pid": "../../etc"},
        {"gpus": "GPU-a"},
        {"whole_node": "yes"},
        {"path": "device"},
        {"id": "../x"},
        {"extra": 1},
        {"claims": "team-a/a"},
        {"shares": [1]},
    ],
)
def test_decode_refuses_what_the_runtime_side_never_writes(change: dict[str, object]) -> None:
    raw = json.loads(records.encode(record()))
    raw.update(change)
    with pytest.raises(RecordError, match="record"):
        records.decode(json.dumps(raw), "c1")
