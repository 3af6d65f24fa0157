"""The node agent's MPS control daemons, one per GPU, on a simulated node whose driver has the
stand-in `nvidia-cuda-mps-control` (testbed/mps_control.py): started with their defaults and
marked ready, restarted when they die or their defaults change, stopped with their GPU; each
in a mount namespace whose /dev/shm is its GPU's; their live defaults and their servers'
limits checked against their shares; restarted on an empty /dev/shm when their last client
is gone, and that /dev/shm removed when they stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.agent import mps as daemons
from deviceplugin.config import Config
from deviceplugin.gpus.simulated import SimDiscovery
from gpuwire import mps, records, sim
from testbed import mps_control
from testbed.waiting import until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    sim.write_node(root, sim.make_machine(gpus=2))
    mps_control.install(root)
    return root


@pytest.fixture
def supervisor(node: Path, socket_dir: Path) -> Iterator[daemons.Supervisor]:
    control = daemons.control_binary(str(node))
    assert control == str(node / "usr/bin/nvidia-cuda-mps-control")
    shares = {sim.load_machine(node).devices[0].uuid: mps.Defaults(25, 20480)}
    found = daemons.Supervisor(
        str(socket_dir / "mps"), control, lambda g: shares.get(g.uuid, mps.Defaults()), Clock()
    )
    yield found
    found.close()


def commands(root: str, uuid: str) -> list[str]:
    log = Path(mps.log_dir(root, uuid), "control.log").read_text().splitlines()
    return [line.partition("CMD: ")[2] for line in log if "CMD: " in line]


def test_each_healthy_gpu_gets_a_daemon_with_its_defaults_marked_ready(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    gpus = sim.load_machine(node).devices
    supervisor.step(gpus, frozenset())
    root = supervisor.root
    first, second = (mps.ready(root, g.uuid) for g in gpus)
    assert first is not None
    assert second is not None
    assert first.defaults == mps.Defaults(25, 20480)
    assert second.defaults == mps.Defaults()
    assert commands(root, gpus[0].uuid) == [
        "get_default_active_thread_percentage",
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 20480M",
        *mps.Defaults.queries(),  # read back once: what the agent checks from then on
        mps.SERVER_LIST,
    ]
    assert commands(root, gpus[1].uuid) == ["get_default_active_thread_percentage"] * 2
    environ = Path(f"/proc/{first.pid}/environ").read_bytes().split(b"\0")
    assert f"CUDA_VISIBLE_DEVICES={gpus[0].uuid}".encode() in environ
    assert f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe_dir(root, gpus[0].uuid)}".encode() in environ
    for gpu, daemon in zip(gpus, (first, second), strict=True):  # /dev/shm: its GPU's alone
        shm = os.stat(mps.shm_dir(root, gpu.uuid))
        theirs = os.stat(f"/proc/{daemon.pid}/root/dev/shm")  # as the daemon sees it
        assert (theirs.st_dev, theirs.st_ino) == (shm.st_dev, shm.st_ino)
        assert oct(shm.st_mode & 0o7777) == "0o1777"
    assert os.stat("/dev/shm").st_ino != shm.st_ino  # the agent's own is untouched


def test_defaults_a_tenant_lifted_are_set_back_and_counted(
    node: Path, supervisor: daemons.Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """A client reaches its daemon through the socket commands come on (gpuwire.mps): a
    tenant of the 25 % share sets the defaults to the whole GPU. The next pass reads them
    back, sets the share again, logs and counts it. Before: the marker said 25 while the
    daemon answered 100."""
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    root, uuid = supervisor.root, gpus[0].uuid
    queries = mps.Defaults.queries()
    tenant = [
        "set_default_active_thread_percentage 100",
        "set_default_device_pinned_mem_limit 0 80G",
    ]
    daemons.send(supervisor.control, root, uuid, tenant)
    assert daemons.send(supervisor.control, root, uuid, queries).split() == ["100.0", "80G"]
    pid = supervisor.running[uuid].daemon.pid
    supervisor.step(gpus, frozenset())
    assert daemons.send(supervisor.control, root, uuid, queries).split() == ["25.0", "20480M"]
    assert supervisor.running[uuid].daemon.pid == pid  # set back, not restarted
    assert supervisor.restored == {uuid: 1}
    assert (
        f"GPU {uuid}: MPS control daemon {pid}'s defaults were lifted (active thread percentage "
        "25 → 100; pinned memory limit 20480 MiB → 81920 MiB): setting them back"
    ) in caplog.text
    assert samples(supervisor, "gpuwire_mps_defaults_restored") == [
        ("gpuwire_mps_defaults_restored_total", {"node": "", "uuid": uuid}, 1.0)
    ]
    daemons.send(supervisor.control, root, uuid, ["set_default_active_thread_percentage 10"])
    supervisor.step(gpus, frozenset())  # tighter: lifts nothing
    assert supervisor.restored == {uuid: 1}


LIFT = ["set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 80G"]


def test_a_server_started_while_a_tenant_lifted_the_defaults_is_ended_and_counted(
    node: Path, supervisor: daemons.Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """A tenant lifts the defaults, then a client of a user with no server running gets one
    before the agent's next pass: the server keeps what it started with, and its clients
    what they connected with. The pass ends it and its clients by restarting the daemon,
    logs and counts it. Before: the defaults were set back, and the server kept 100 % and
    80 GiB for every client it served."""
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    root, uuid = supervisor.root, gpus[0].uuid
    first = supervisor.running[uuid].daemon.pid
    daemons.send(supervisor.control, root, uuid, LIFT)
    server = mps_control.cuda_init(mps.pipe_dir(root, uuid), uid=1000)
    lifted = mps.Defaults(None, 81920)
    assert daemons.read(supervisor.control, root, uuid) == (lifted, {server: lifted})
    supervisor.step(gpus, frozenset())
    assert not Path(f"/proc/{server}").exists()
    share = mps.Defaults(25, 20480)
    assert daemons.read(supervisor.control, root, uuid) == (share, {})
    now = mps.ready(root, uuid)
    assert now is not None
    assert (now.pid != first, now.defaults) == (True, share)
    assert (supervisor.ended, supervisor.restored) == ({uuid: 1}, {uuid: 1})
    assert (
        f"GPU {uuid}: MPS server {server} of control daemon {first} holds lifted limits (active "
        "thread percentage 25 → 100; pinned memory limit 20480 MiB → 81920 MiB), which its "
        "clients keep: restarting the daemon ends it and them"
    ) in caplog.text
    assert samples(supervisor, "gpuwire_mps_servers_ended") == [
        ("gpuwire_mps_servers_ended_total", {"node": "", "uuid": uuid}, 1.0)
    ]


def test_a_server_holding_the_share_is_left_alone_and_one_lifted_on_it_is_ended(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    """A server that holds its share, or less, serves on; once a tenant lifts what that
    server holds (its clients from then on would get it), the next pass ends it. Before:
    the server kept 80 GiB."""
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    root, uuid = supervisor.root, gpus[0].uuid
    first = supervisor.running[uuid].daemon.pid
    server = mps_control.cuda_init(mps.pipe_dir(root, uuid))
    daemons.send(supervisor.control, root, uuid, [f"set_active_thread_percentage {server} 10"])
    supervisor.step(gpus, frozenset())  # tighter: lifts nothing
    assert (supervisor.running[uuid].daemon.pid, Path(f"/proc/{server}").exists()) == (first, True)
    assert supervisor.ended == {}
    daemons.send(supervisor.control, root, uuid, [f"set_device_pinned_mem_limit {server} 0 80G"])
    supervisor.step(gpus, frozenset())
    assert not Path(f"/proc/{server}").exists()
    assert supervisor.running[uuid].daemon.pid != first
    assert (supervisor.ended, supervisor.restored) == ({uuid: 1}, {})


def test_an_answer_a_tenant_made_unreadable_ends_what_gave_it(
    node: Path, supervisor: daemons.Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon whose defaults and servers the agent has read once answers as it reads:
    an answer it no longer reads is a value a client set there (a unit it does not know,
    `80T`), so the daemon is restarted as if lifted, ending the server that holds it.
    Before: such an answer was logged once and that daemon never checked again, so the
    value stayed, whatever it gave."""
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    root, uuid = supervisor.root, gpus[0].uuid
    first = supervisor.running[uuid].daemon.pid
    daemons.send(supervisor.control, root, uuid, ["set_default_device_pinned_mem_limit 0 80T"])
    supervisor.step(gpus, frozenset())
    second = supervisor.running[uuid].daemon.pid
    assert second != first
    assert daemons.read(supervisor.control, root, uuid) == (mps.Defaults(25, 20480), {})
    assert (supervisor.ended, supervisor.restored) == ({}, {uuid: 1})
    server = mps_control.cuda_init(mps.pipe_dir(root, uuid))
    supervisor.step(gpus, frozenset())  # its server read once: held
    assert supervisor.running[uuid].daemon.pid == second
    daemons.send(supervisor.control, root, uuid, [f"set_device_pinned_mem_limit {server} 0 80T"])
    supervisor.step(gpus, frozenset())
    assert not Path(f"/proc/{server}").exists()
    assert supervisor.running[uuid].daemon.pid != second
    assert (supervisor.ended, supervisor.restored) == ({uuid: 1}, {uuid: 1})
    assert "no longer read as before" in caplog.text


def test_a_stopped_daemon_leaves_nothing_its_clients_wrote(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    """A daemon stopped (its GPU unhealthy or gone, the agent stopping) takes its
    /dev/shm, and what its tenants wrote there, with it. Before: it stayed on the host."""
    gpus = sim.load_machine(node).devices
    supervisor.step(gpus, frozenset())
    shm = [Path(mps.shm_dir(supervisor.root, g.uuid)) for g in gpus]
    for directory in shm:
        (directory / "team-a").write_text("secret\n")
    supervisor.step(gpus, frozenset({gpus[1].uuid}))
    assert [d.exists() for d in shm] == [True, False]
    supervisor.close()
    assert [d.exists() for d in shm] == [False, False]


def samples(supervisor: daemons.Supervisor, name: str) -> list[tuple[str, dict[str, str], float]]:
    (family,) = [f for f in supervisor.collect() if f.name == name]
    return [(s.name, s.labels, s.value) for s in family.samples]


def test_a_daemon_whose_last_client_is_gone_is_restarted_on_an_empty_shm(
    node: Path, socket_dir: Path, tmp_path: Path
) -> None:
    """What a tenant left in its GPU's /dev/shm does not stay for the next: once no record
    names a container joined to the daemon (and no start holds its lock), it is restarted
    on an empty one."""
    gpus = sim.load_machine(node).devices[:1]
    uuid = gpus[0].uuid
    control = daemons.control_binary(str(node))
    assert control is not None
    joined = daemons.clients(str(tmp_path / "containers"))
    supervisor = daemons.Supervisor(
        str(socket_dir / "mps"), control, lambda g: mps.Defaults(), Clock(), joined
    )
    try:
        supervisor.step(gpus, frozenset())
        first = supervisor.running[uuid].daemon.pid
        left = Path(mps.shm_dir(supervisor.root, uuid), "team-a")
        left.write_text("secret\n")
        record = records.started("c1", {}, [uuid], path=records.PLUGIN, whole_node=False,
                                 capabilities=(), pid=os.getpid(), mps=[uuid])  # fmt: skip
        records.write(str(tmp_path / "containers"), record)
        supervisor.step(gpus, frozenset())  # its client is there
        assert (supervisor.running[uuid].daemon.pid, left.exists()) == (first, True)
        records.remove(str(tmp_path / "containers"), "c1")
        lock = mps.lock(supervisor.root, uuid)  # a start joining it now
        supervisor.step(gpus, frozenset())
        assert (supervisor.running[uuid].daemon.pid, left.exists()) == (first, True)
        assert lock is not None
        os.close(lock)
        supervisor.step(gpus, frozenset())
        assert not left.exists()
        assert os.listdir(mps.shm_dir(supervisor.root, uuid)) == []
        now = mps.ready(supervisor.root, uuid)
        assert now is not None
        assert now.pid != first
    finally:
        supervisor.close()


def test_a_dead_daemon_is_restarted_and_its_marker_never_names_it(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    before = mps.ready(supervisor.root, gpus[0].uuid)
    assert before is not None
    os.kill(before.pid, signal.SIGKILL)
    until(lambda: mps.ready(supervisor.root, gpus[0].uuid) is None)  # the marker names no daemon
    supervisor.step(gpus, frozenset())
    after = mps.ready(supervisor.root, gpus[0].uuid)
    assert after is not None
    assert after.pid != before.pid
    assert after.defaults == mps.Defaults(25, 20480)


def test_a_gpu_gone_unhealthy_loses_its_daemon_and_gets_it_back(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    gpus = sim.load_machine(node).devices
    supervisor.step(gpus, frozenset())
    pid = supervisor.running[gpus[1].uuid].daemon.pid
    supervisor.step(gpus, frozenset({gpus[1].uuid}))
    assert mps.ready(supervisor.root, gpus[1].uuid) is None
    assert not Path(f"/proc/{pid}").exists()
    assert commands(supervisor.root, gpus[1].uuid)[-1] == "quit"
    supervisor.step(gpus, frozenset())
    assert mps.ready(supervisor.root, gpus[1].uuid) is not None


def test_new_defaults_restart_the_daemon(node: Path, socket_dir: Path) -> None:
    gpus = sim.load_machine(node).devices[:1]
    control = daemons.control_binary(str(node))
    assert control is not None
    wanted = [mps.Defaults(50, None)]
    supervisor = daemons.Supervisor(str(socket_dir / "mps"), control, lambda g: wanted[0], Clock())
    try:
        supervisor.step(gpus, frozenset())
        first = supervisor.running[gpus[0].uuid].daemon.pid
        supervisor.step(gpus, frozenset())
        assert supervisor.running[gpus[0].uuid].daemon.pid == first  # nothing changed
        wanted[0] = mps.Defaults(25, None)
        supervisor.step(gpus, frozenset())
        now = mps.ready(supervisor.root, gpus[0].uuid)
        assert now is not None
        assert (now.pid != first, now.defaults) == (True, mps.Defaults(25, None))
    finally:
        supervisor.close()


def test_a_daemon_left_by_an_earlier_agent_is_kept(
    node: Path, supervisor: daemons.Supervisor
) -> None:
    gpus = sim.load_machine(node).devices[:1]
    supervisor.step(gpus, frozenset())
    pid = supervisor.running[gpus[0].uuid].daemon.pid
    supervisor.running.clear()  # a new agent: same root, same defaults
    try:
        again = daemons.Supervisor(
            supervisor.root, supervisor.control, supervisor.defaults, Clock()
        )
        again.step(gpus, frozenset())
        assert again.running[gpus[0].uuid].daemon.pid == pid
        again.close()
        assert (
            not Path(f"/proc/{pid}").exists()
            or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        )
    finally:
        os.waitpid(pid, os.WNOHANG) if Path(f"/proc/{pid}").exists() else None


# An agent whose library's fork handler blocks in a child (gRPC's can: grpc/grpc#22624), as a
# script of its own: a handler once registered stays for the life of the process.
AGENT_WITH_A_FORK_HANDLER = """
import os, sys, threading
from deviceplugin.agent import mps as daemons
from gpuwire import mps, sim
held = threading.Lock()
held.acquire()  # as another thread holds it when the agent forks
os.register_at_fork(after_in_child=held.acquire)
node, root = sys.argv[1:]
supervisor = daemons.Supervisor(root, daemons.control_binary(node), lambda g: mps.Defaults())
gpus = sim.load_machine(node).devices
supervisor.step(gpus, frozenset())
print(sum(mps.ready(root, g.uuid) is not None for g in gpus))
supervisor.close()
"""


def test_daemons_start_in_an_agent_whose_fork_handlers_would_block(
    node: Path, socket_dir: Path
) -> None:
    """No daemon is started through a fork that runs the agent's fork handlers (a
    `preexec_fn`'s): with one that blocks, every GPU still gets its daemon."""
    started = subprocess.run(
        [sys.executable, "-c", AGENT_WITH_A_FORK_HANDLER, str(node), str(socket_dir / "mps")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert started.stdout.split() == ["2"]


def test_a_daemon_that_will_not_start_is_retried_with_backoff(tmp_path: Path) -> None:
    broken = tmp_path / "nvidia-cuda-mps-control"
    broken.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    clock = Clock()
    supervisor = daemons.Supervisor(
        str(tmp_path / "mps"), str(broken), lambda g: mps.Defaults(), clock
    )
    gpu = sim.make_machine(gpus=1).devices[0]
    supervisor.step([gpu], frozenset())
    assert supervisor.running == {}
    assert mps.ready(supervisor.root, gpu.uuid) is None
    tries = Path(mps.log_dir(supervisor.root, gpu.uuid), "daemon.out")
    assert tries.read_text() == "no GPU here\n"
    supervisor.step([gpu], frozenset())  # within the backoff: not tried again
    assert tries.read_text() == "no GPU here\n"
    clock.now += 1.5
    supervisor.step([gpu], frozenset())
    assert tries.read_text() == "no GPU here\n" * 2


def test_the_job_shares_a_gpu_through_its_daemon_as_the_config_says(
    node: Path, socket_dir: Path
) -> None:
    config = Config(sim=str(node), mps_root=str(socket_dir / "mps"), mps_replicas=4)
    job = daemons.job(config, SimDiscovery(node).discover, frozenset)
    assert job is not None
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=job.run, args=(stop,))
    thread.start()
    gpus = sim.load_machine(node).devices
    try:
        until(lambda: all(mps.ready(config.mps_root or "", g.uuid) for g in gpus))
        marked = mps.ready(config.mps_root or "", gpus[0].uuid)
        assert marked is not None
        assert marked.defaults == mps.Defaults(25, gpus[0].memory_mib // 4)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert all(mps.ready(config.mps_root or "", g.uuid) is None for g in gpus)
    assert daemons.job(Config(sim=str(node)), SimDiscovery(node).discover, frozenset) is None
