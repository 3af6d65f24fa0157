"""The node agent's MPS control daemons: one per GPU, started, watched, restarted, stopped.

`nvidia-cuda-mps-control -f` (the driver's own program) runs as a child of the agent for
each healthy GPU, with that GPU alone visible, its pipe and log directories, and in a mount
namespace of its own whose `/dev/shm` is its GPU's (`gpuwire.mps`: what its servers share
with its clients, and no other GPU's tenants; made by `shmns` before the exec, never in a
forked copy of the agent); the agent then sets the daemon's defaults
(the share of threads and memory each client gets: a replica's share of a GPU shared
through MPS, else none), checks that it answers, and writes the ready marker the runtime
joins containers by. Each pass (`step`, every second) restarts a daemon that died (the
marker goes first, so no container joins a dead one), restarts one whose defaults changed,
starts one for a new or recovered GPU, and stops the daemons of GPUs gone or unhealthy
(`quit`, as NVIDIA's device plugin stops them). A daemon that a previous agent left running
with the same defaults is kept: its clients keep their server. Failures are retried with
backoff, never fatal to the agent.

Every pass of a GPU shared through MPS also reads its daemon back (`read`: its defaults and
its servers' list in one command, each server's limits in one more where servers run): a
client reaches the daemon through the same socket its commands come on (`gpuwire.mps`), so
a tenant can set the defaults, and a server started meanwhile keeps them (or a tenant sets
them on the server itself). Defaults it lifted are set back (the next server gets the share
again), logged and counted (`gpuwire_mps_defaults_restored_total`); a daemon that does not
take them back is restarted. A server that holds looser limits than the share cannot be set
back for the clients it has (a server's new limits reach only clients that connect later:
docs.nvidia.com/deploy/mps/latest/mpsv2-interface.html), so the daemon is restarted, which
ends the server and its clients, logged and counted (`gpuwire_mps_servers_ended_total`).
And a daemon whose last client is gone (no container record joins it: `gpuwire.records`'
`mps`) but whose `/dev/shm` holds files is restarted on an empty one, under its GPU's lock
(`mps.lock`), so nothing a tenant left there stays for the next; a daemon stopped takes its
`/dev/shm` with it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from deviceplugin import vendors
from deviceplugin.config import Config
from deviceplugin.gpus.discovery import NodeGpus
from gpuwire import mps, records
from gpuwire.devices import Device
from gpuwire.records import process_start

log = logging.getLogger(__name__)

PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ANSWER_TIMEOUT = 10.0  # for a new daemon to answer its first command
RETRY = (1.0, 5.0, 30.0)  # backoff after consecutive failures to start a GPU's daemon


SHMNS = "deviceplugin.agent.shmns"  # what starts a daemon in its own /dev/shm


class MpsError(RuntimeError):
    """A control daemon that would not start or answer."""


class Unread(MpsError):
    """A daemon's answer that is not what its queries ask for; `part`: to which, "defaults"
    (its own) or "servers" (what they hold)."""

    def __init__(self, message: str, part: str) -> None:
        super().__init__(message)
        self.part = part


def control_binary(driver_root: str) -> str | None:
    """The driver's `nvidia-cuda-mps-control` under `driver_root` (the host, the driver's
    files in this container, or the simulated node), found as the runtime finds binaries."""
    from gpuwire.driver import DiscoveryError, discover
    from gpuwire.roots import Roots

    try:
        found = discover(Roots(driver_root), ("compute",)).binaries.get("compute", ())
    except DiscoveryError:
        return None
    return next((b.host_path for b in found if b.name == mps.CONTROL), None)


def send(control: str, root: str, uuid: str, commands: Sequence[str], timeout: float = 5.0) -> str:
    """Run `control` as MPS's client with `commands` on stdin; its answer, or MpsError."""
    done = subprocess.run(
        [control],
        input="".join(f"{c}\n" for c in commands),
        env=mps.control_env(root, uuid, PATH),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise MpsError(f"{' ; '.join(commands)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def read(control: str, root: str, uuid: str) -> tuple[mps.Defaults, dict[int, mps.Defaults]]:
    """GPU `uuid`'s daemon's live defaults, and what each of its servers holds (by pid): one
    command for the defaults and the servers' list, one more where servers run. MpsError
    where it does not answer; Unread where the answer is not that."""
    asked = [*mps.Defaults.queries(), mps.SERVER_LIST]
    lines = _lines(send(control, root, uuid, asked))
    defaults = mps.Defaults.live(" ".join(lines[:2]))
    if defaults is None or not all(line.isdigit() for line in lines[2:]):
        raise Unread(f"{' ; '.join(asked)}: answered {' ; '.join(lines)!r}", "defaults")
    pids = [int(line) for line in lines[2:]]
    if not pids:
        return defaults, {}
    asked = [query for pid in pids for query in mps.Defaults.queries(pid)]
    lines = _lines(send(control, root, uuid, asked))
    held: dict[int, mps.Defaults] = {}
    for n, pid in enumerate(pids):
        limits = mps.Defaults.live(" ".join(lines[2 * n : 2 * n + 2]))
        if limits is None or len(lines) != len(asked):
            raise Unread(f"{' ; '.join(asked)}: answered {' ; '.join(lines)!r}", "servers")
        held[pid] = limits
    return defaults, held


def _lines(answer: str) -> list[str]:
    return [line.strip() for line in answer.splitlines() if line.strip()]


class _Running:
    __slots__ = ("daemon", "process")

    def __init__(self, daemon: mps.Daemon, process: subprocess.Popen[bytes] | None) -> None:
        self.daemon = daemon
        self.process = process  # None: a daemon an earlier agent started


def clients(records_dir: str, host_root: str = "/") -> Callable[[str], bool]:
    """Whether a container the runtime joined to GPU `uuid`'s daemon is still there: its
    record names the GPU as an MPS client's and its container is not gone."""

    def joined(uuid: str) -> bool:
        found = (e.record for e in records.scan(records_dir) if e.record is not None)
        return any(uuid in r.mps and records.status(r, host_root) != records.GONE for r in found)

    return joined


class Supervisor(Collector):
    def __init__(
        self,
        root: str,
        control: str,
        defaults: Callable[[Device], mps.Defaults],
        clock: Callable[[], float] = time.monotonic,
        joined: Callable[[str], bool] | None = None,
        node: str = "",
    ) -> None:
        self.root = root
        self.control = control  # the driver's nvidia-cuda-mps-control
        self.defaults = defaults
        self.clock = clock
        self.joined = joined  # `clients`; None: never empty a daemon's /dev/shm
        self.node = node
        self.running: dict[str, _Running] = {}
        self.restored: Counter[str] = Counter()  # uuid → how often its defaults were set back
        self.ended: Counter[str] = Counter()  # uuid → servers with lifted limits ended
        self._failures: dict[str, tuple[int, float]] = {}  # uuid → (count, retry at)
        self._unread: set[int] = set()  # daemons whose answer was not read (logged once)
        self._read: set[tuple[int, str]] = set()  # (daemon pid, Unread.part) read at least once

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, help_text, counts in (
            (
                "gpuwire_mps_defaults_restored",
                "How often a GPU's MPS control daemon had defaults looser than the share the "
                "agent set (a client can set them: the control socket is its own) and was set "
                "back.",
                self.restored,
            ),
            (
                "gpuwire_mps_servers_ended",
                "How many of a GPU's MPS servers held limits looser than the share the agent "
                "set (started while a client had lifted the defaults, or lifted on the server) "
                "and were ended with their clients by restarting the GPU's control daemon.",
                self.ended,
            ),
        ):
            family = CounterMetricFamily(name, help_text, labels=["node", "uuid"])
            for uuid, count in sorted(counts.items()):
                family.add_metric([self.node, uuid], count)
            yield family

    def step(self, gpus: Sequence[Device], unhealthy: frozenset[str]) -> None:
        """Make the daemons match the healthy GPUs and their defaults."""
        wanted = {g.uuid: self.defaults(g) for g in gpus if g.uuid not in unhealthy}
        for uuid in [u for u in self.running if u not in wanted]:
            self.stop(uuid, "its GPU is gone or unhealthy")
        for uuid, defaults in wanted.items():
            current = self.running.get(uuid) or self._adopt(uuid)
            if current is not None and not current.daemon.alive():
                log.warning(
                    "GPU %s: MPS control daemon %d died; restarting", uuid, current.daemon.pid
                )
                mps.unmark(self.root, uuid)
                self._reap(current)
                del self.running[uuid]
                current = None
            if current is not None and current.daemon.defaults != defaults:
                self.stop(uuid, "its defaults changed")
                current = None
            if current is not None and not self._holds(uuid, current.daemon):
                current = None
            if current is not None and self._left(uuid):
                self._empty(uuid, defaults)
            elif current is None:
                self._start(uuid, defaults)

    def _holds(self, uuid: str, daemon: mps.Daemon) -> bool:
        """Whether the daemon and its servers hold the defaults it was given (or tighter).
        Defaults a client lifted are set back and counted. A server that holds looser limits
        (started while they were lifted, or lifted on it) keeps them for its clients, which
        keep what they connected with, so the daemon is restarted (`quit` ends its servers
        and so their clients) and each such server counted; so is a daemon that would not
        take its defaults back. False where it was stopped, to be started again."""
        if not daemon.defaults.commands():
            return True  # no share: its clients bring their own limits
        try:
            live, servers = read(self.control, self.root, uuid)
        except Unread as exc:
            if (daemon.pid, exc.part) in self._read:  # it answered as we read: a client's value
                return self._ends_unread(uuid, daemon, exc)
            self._not_checked(uuid, daemon.pid, exc)
            return True
        except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("GPU %s: MPS control daemon %d not read: %s", uuid, daemon.pid, exc)
            return True  # a daemon that died is restarted by the next pass
        self._read |= {(daemon.pid, "defaults")} | ({(daemon.pid, "servers")} if servers else set())
        lifted = daemon.defaults.lifted_by(live)
        if lifted:
            self.restored[uuid] += 1
            log.warning(
                "GPU %s: MPS control daemon %d's defaults were lifted (%s): setting them back",
                uuid, daemon.pid, "; ".join(lifted),
            )  # fmt: skip
        if self._ends_loose(uuid, daemon, servers):
            return False
        return not lifted or self._set_back(uuid, daemon)

    def _ends_unread(self, uuid: str, daemon: mps.Daemon, exc: Unread) -> bool:
        """A daemon read before that answers what the agent does not read: a value a client
        set (a unit it does not know) stands where a limit was, so the daemon is restarted
        as for lifted defaults or a lifted server, and counted as that. False: stopped."""
        log.warning(
            "GPU %s: MPS control daemon %d's %s are no longer read as before (%s): a client "
            "set them; restarting the daemon",
            uuid, daemon.pid, exc.part, exc,
        )  # fmt: skip
        (self.restored if exc.part == "defaults" else self.ended)[uuid] += 1
        self.stop(uuid, f"its {exc.part} are no longer read")
        return False

    def _ends_loose(self, uuid: str, daemon: mps.Daemon, servers: dict[int, mps.Defaults]) -> bool:
        """Restart the daemon where any of its `servers` holds looser limits than its
        defaults (logged and counted); whether it did."""
        loose = {
            pid: what for pid, held in servers.items() if (what := daemon.defaults.lifted_by(held))
        }
        for pid, what in loose.items():
            log.warning(
                "GPU %s: MPS server %d of control daemon %d holds lifted limits (%s), which its "
                "clients keep: restarting the daemon ends it and them",
                uuid, pid, daemon.pid, "; ".join(what),
            )  # fmt: skip
        if not loose:
            return False
        self.ended[uuid] += len(loose)
        self.stop(uuid, f"servers with lifted limits: {', '.join(map(str, loose))}")
        return True

    def _set_back(self, uuid: str, daemon: mps.Daemon) -> bool:
        """Set the daemon's defaults back; whether it took them (else it is stopped)."""
        try:
            send(self.control, self.root, uuid, daemon.defaults.commands())
            again = mps.Defaults.live(send(self.control, self.root, uuid, mps.Defaults.queries()))
        except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
            again, why = None, str(exc)
        else:
            why = f"it answers {again}"
        if again is not None and not daemon.defaults.lifted_by(again):
            return True
        self.stop(uuid, f"its defaults could not be set back ({why})")
        return False

    def _left(self, uuid: str) -> bool:
        """Whether the daemon's /dev/shm holds files no client of it is left to use."""
        try:
            used = any(os.scandir(mps.shm_dir(self.root, uuid)))
        except FileNotFoundError:
            return False
        return used and self.joined is not None and not self.joined(uuid)

    def _empty(self, uuid: str, defaults: mps.Defaults) -> None:
        """Restart the daemon on an empty /dev/shm (`_launch` empties it), under the GPU's
        lock: a start that found it ready holds that until its record names the GPU."""
        lock = mps.lock(self.root, uuid, exclusive=True)
        if lock is None:
            return  # a container is joining it now: it is not idle
        try:
            if self.joined is not None and self.joined(uuid):
                return
            self.stop(uuid, "its last client is gone, and its /dev/shm holds files")
            self._start(uuid, defaults)
        finally:
            os.close(lock)

    def _adopt(self, uuid: str) -> _Running | None:
        daemon = mps.ready(self.root, uuid)
        if daemon is None:
            return None
        log.info("GPU %s: keeping the MPS control daemon %d already running", uuid, daemon.pid)
        found = self.running[uuid] = _Running(daemon, None)
        return found

    def _start(self, uuid: str, defaults: mps.Defaults) -> None:
        count, retry_at = self._failures.get(uuid, (0, 0.0))
        if self.clock() < retry_at:
            return
        try:
            self.running[uuid] = self._launch(uuid, defaults)
        except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
            wait = RETRY[min(count, len(RETRY) - 1)]
            self._failures[uuid] = (count + 1, self.clock() + wait)
            log.warning(
                "GPU %s: MPS control daemon not started (%s); retrying in %gs", uuid, exc, wait
            )
            return
        self._failures.pop(uuid, None)
        log.info(
            "GPU %s: MPS control daemon %d up, defaults %s",
            uuid,
            self.running[uuid].daemon.pid,
            defaults,
        )

    def _launch(self, uuid: str, defaults: mps.Defaults) -> _Running:
        mps.unmark(self.root, uuid)
        for directory in (mps.pipe_dir(self.root, uuid), mps.log_dir(self.root, uuid)):
            os.makedirs(directory, mode=0o755, exist_ok=True)
        shm = mps.shm_dir(self.root, uuid)
        shutil.rmtree(shm, ignore_errors=True)  # a new daemon: what its last clients left
        os.makedirs(shm)
        os.chmod(shm, 0o1777)  # noqa: S103 - as /dev/shm: every client user writes it
        with open(os.path.join(mps.log_dir(self.root, uuid), "daemon.out"), "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-I", "-m", SHMNS, shm, self.control, "-f"],
                env=mps.control_env(self.root, uuid, PATH),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        try:
            self._answers(uuid, process)
            if defaults.commands():
                send(self.control, self.root, uuid, defaults.commands())
                self._first_read(uuid, process.pid)
            else:
                send(self.control, self.root, uuid, ["get_default_active_thread_percentage"])
            start = process_start(process.pid)
            if start is None:
                raise MpsError(f"exited with status {process.wait()}")
            daemon = mps.Daemon(process.pid, start, defaults)
            mps.mark_ready(self.root, uuid, daemon)
        except BaseException:
            _end(process)
            raise
        return _Running(daemon, process)

    def _first_read(self, uuid: str, pid: int) -> None:
        """Read a new daemon back once its defaults are set: from then on an answer the
        agent does not read is a client's doing (`_ends_unread`); one it never read (a
        driver that answers otherwise) is logged once and not checked."""
        try:
            read(self.control, self.root, uuid)
        except Unread as exc:
            self._not_checked(uuid, pid, exc)
        else:
            self._read.add((pid, "defaults"))

    def _not_checked(self, uuid: str, pid: int, exc: Unread) -> None:
        """A daemon whose answer the agent never read: said once, not checked."""
        if pid not in self._unread:
            self._unread.add(pid)
            log.warning("GPU %s: MPS control daemon %d not read, not checked: %s", uuid, pid, exc)

    def _answers(self, uuid: str, process: subprocess.Popen[bytes]) -> None:
        """Wait until the new daemon answers a command (it makes its pipes as it starts)."""
        deadline = self.clock() + ANSWER_TIMEOUT
        while True:
            if process.poll() is not None:
                raise MpsError(f"exited with status {process.returncode} (see its log)")
            try:
                send(self.control, self.root, uuid, ["get_default_active_thread_percentage"])
                return
            except MpsError:
                if self.clock() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, uuid: str, why: str) -> None:
        """`quit` the GPU's daemon (after removing its marker: nothing new joins it), then
        remove its `/dev/shm`: nothing its clients wrote stays on the host."""
        running = self.running.pop(uuid)
        mps.unmark(self.root, uuid)
        log.info("GPU %s: stopping its MPS control daemon %d: %s", uuid, running.daemon.pid, why)
        try:
            send(self.control, self.root, uuid, ["quit"])
        except (MpsError, OSError, subprocess.TimeoutExpired) as exc:
            log.warning("GPU %s: quit not taken (%s); ending the daemon", uuid, exc)
        if running.process is not None:
            _end(running.process)
        else:
            _end_adopted(running.daemon)
        shutil.rmtree(mps.shm_dir(self.root, uuid), ignore_errors=True)  # what its clients left

    def _reap(self, running: _Running) -> None:
        if running.process is not None:
            running.process.poll()

    def close(self) -> None:
        for uuid in list(self.running):
            self.stop(uuid, "the node agent stops")


def _end(process: subprocess.Popen[bytes]) -> None:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _end_adopted(daemon: mps.Daemon) -> None:
    """End a daemon an earlier agent started, which this one cannot wait for: as `_end`, a
    grace period after `quit`, then SIGTERM, then SIGKILL, each watched through /proc."""
    for signal in (0, 15, 9):
        if signal and daemon.alive():
            os.kill(daemon.pid, signal)
        deadline = time.monotonic() + 5
        while daemon.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not daemon.alive():
            return


class Job:
    """The daemons as a background job of the node agent: `run(stop)`; its supervisor is a
    metrics collector."""

    def __init__(
        self,
        supervisor: Supervisor,
        gpus: Callable[[], Sequence[Device]],
        unhealthy: Callable[[], frozenset[str]],
    ) -> None:
        self.supervisor = supervisor
        self.gpus = gpus
        self.unhealthy = unhealthy

    def run(self, stop: threading.Event) -> None:
        run(self.supervisor, self.gpus, self.unhealthy, stop)


def job(
    config: Config,
    found: Callable[[], NodeGpus],
    unhealthy: Callable[[], frozenset[str]],
    records_dir: str = records.DEFAULT_DIR,
    host_root: str = "/",
    node: str = "",
) -> Job | None:
    """The daemons as a background job of the node agent, None where the config asks for
    none. Each GPU's defaults are its replicas' share where it is shared through MPS, else
    none (clients bring their own limits). `records_dir` (seen where `host_root` is the
    host's): the runtime's container records, which say who is joined to which daemon;
    `node`: the Node's name, on the metrics."""
    if config.mps_root is None:
        return None
    root = config.sim or "/"
    control = control_binary(root)
    if control is None:
        log.error("mps.root is set, and the driver under %s has no %s: no MPS", root, mps.CONTROL)
        return None
    gpus = found()
    devices = gpus.devices
    shares = {
        g.uuid: share
        for r in vendors.of(config.vendor).resources(config, gpus)[0]
        for g in r.gpus
        if (share := r.share_of(g)) is not None and share.mechanism == "mps"
    }

    def defaults(gpu: Device) -> mps.Defaults:
        share = shares.get(gpu.uuid)
        return mps.Defaults(share.cores, share.memory_mib) if share else mps.Defaults()

    joined = clients(records_dir, host_root)
    supervisor = Supervisor(config.mps_root, control, defaults, joined=joined, node=node)
    return Job(supervisor, lambda: devices, unhealthy)


def run(
    supervisor: Supervisor,
    gpus: Callable[[], Sequence[Device]],
    unhealthy: Callable[[], frozenset[str]],
    stop: threading.Event,
    interval: float = 1.0,
) -> None:
    """Step every `interval` seconds until `stop`; then stop every daemon."""
    try:
        while not stop.is_set():
            try:
                supervisor.step(gpus(), unhealthy())
            except Exception as exc:  # discovery failed this time: try again next pass
                log.warning("MPS control daemons not checked: %s", exc)
            stop.wait(interval)
    finally:
        supervisor.close()
