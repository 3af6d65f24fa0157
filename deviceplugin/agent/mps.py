"""The node agent's MPS control daemons: one per GPU, started, watched, restarted, stopped.

`nvidia-cuda-mps-control -f` (the driver's own program) runs as a child of the agent for
each healthy GPU, with that GPU alone visible and its pipe and log directories
(`gpuwire.mps`); the agent then sets the daemon's defaults (the share of threads and memory
each client gets: a replica's share of a GPU shared through MPS, else none), checks that it
answers, and writes the ready marker the runtime joins containers by. Each pass (`step`,
every second) restarts a daemon that died (the marker goes first, so no container joins a
dead one), restarts one whose defaults changed, starts one for a new or recovered GPU, and
stops the daemons of GPUs gone or unhealthy (`quit`, as NVIDIA's device plugin stops them).
A daemon that a previous agent left running with the same defaults is kept: its clients
keep their server. Failures are retried with backoff, never fatal to the agent.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from deviceplugin.config import Config
from deviceplugin.gpus.discovery import NodeGpus
from gpuwire import mps
from gpuwire.devices import Device
from gpuwire.records import process_start

log = logging.getLogger(__name__)

PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ANSWER_TIMEOUT = 10.0  # for a new daemon to answer its first command
RETRY = (1.0, 5.0, 30.0)  # backoff after consecutive failures to start a GPU's daemon


class MpsError(RuntimeError):
    """A control daemon that would not start or answer."""


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


class _Running:
    __slots__ = ("daemon", "process")

    def __init__(self, daemon: mps.Daemon, process: subprocess.Popen[bytes] | None) -> None:
        self.daemon = daemon
        self.process = process  # None: a daemon an earlier agent started


class Supervisor:
    def __init__(
        self,
        root: str,
        control: str,
        defaults: Callable[[Device], mps.Defaults],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.control = control  # the driver's nvidia-cuda-mps-control
        self.defaults = defaults
        self.clock = clock
        self.running: dict[str, _Running] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # uuid → (count, retry at)

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
            if current is None:
                self._start(uuid, defaults)

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
        shm = mps.shm_dir(self.root)
        os.makedirs(shm, exist_ok=True)
        os.chmod(shm, 0o1777)  # noqa: S103 - as /dev/shm: every client user writes it
        with open(os.path.join(mps.log_dir(self.root, uuid), "daemon.out"), "ab") as out:
            process = subprocess.Popen(
                [self.control, "-f"],
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
        """`quit` the GPU's daemon (after removing its marker: nothing new joins it)."""
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


def job(
    config: Config, found: Callable[[], NodeGpus], unhealthy: Callable[[], frozenset[str]]
) -> Callable[[threading.Event], None] | None:
    """The daemons as a background job of the node agent (`job(...)(stop)` runs it), None
    where the config asks for none. Each GPU's defaults are its replicas' share where it is
    shared through MPS, else none (clients bring their own limits)."""
    if config.mps_root is None:
        return None
    root = config.sim or "/"
    control = control_binary(root)
    if control is None:
        log.error("mps.root is set, and the driver under %s has no %s: no MPS", root, mps.CONTROL)
        return None
    node = found()
    devices = node.devices
    shares = {
        g.uuid: share
        for r in config.resources(node)[0]
        for g in r.gpus
        if (share := r.share_of(g)) is not None and share.mechanism == "mps"
    }

    def defaults(gpu: Device) -> mps.Defaults:
        share = shares.get(gpu.uuid)
        return mps.Defaults(share.cores, share.memory_mib) if share else mps.Defaults()

    supervisor = Supervisor(config.mps_root, control, defaults)
    return lambda stop: run(supervisor, lambda: devices, unhealthy, stop)


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
