"""The resident gpuwire and gpuwire-call: a call is served as the Python launcher would run
it, or handed to that Python untouched.

Every GPU start through the resident (runc's prestart hook, the shim, containerd) is proven
in the runtime tests' `-resident` deliveries (tests/system/test_runc.py and those that
share its deliveries): their launchers name a Python that does not exist, so only the
resident can have served them. Here: what it serves and what it declines. The fallback in
these calls is `echo fell back: ARGV0 ARG...`, so a declined call shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.setup import launcher
from runtime_hook.start import resident
from testbed.lab import Lab
from testbed.resident import Resident
from testbed.waiting import until
from tests.conftest import requires_binary, requires_root
from tests.runtime_hook.test_launcher import settings_of

pytestmark = [requires_root(), requires_binary("cc")]

FALLBACK = ["/bin/echo", "fell back:"]
NOT_ROOT = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


class Site:
    def __init__(self, home: Path, call: str, socket: str, pid: int = 0) -> None:
        self.home = home
        self.call_path = call
        self.socket = socket
        self.pid = pid  # the resident's

    def call(
        self,
        kind: str,
        *args: str,
        token: str | None = None,
        stdin: str = "",
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        prefix: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        count = str(len(args) + 1)
        argv = [self.call_path, self.socket, token or resident.token(), kind, count]
        return subprocess.run(
            [*prefix, *argv, *FALLBACK, "argv0", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env if env is not None else {"PATH": os.defpath},
            cwd=cwd,
            timeout=30,
        )


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    # a directory anybody may enter, so that only the socket's mode and the peer check
    # stand between a caller that is not root and the resident
    home = Path(tempfile.mkdtemp(prefix="gpuwire-resident-"))
    home.chmod(0o755)
    call = launcher.build_call(str(home))
    assert call is not None
    socket = str(home / "resident.sock")
    # the resident's own environment names a config that does not exist: a call that works
    # was run with the caller's
    with Resident(socket, env={"GPUWIRE_CONFIG": "/nonexistent/config.toml"}) as running:
        yield Site(home, call, socket, running.process.pid)
    shutil.rmtree(home)


def test_the_socket_is_roots_alone(site: Site) -> None:
    info = os.stat(site.socket)
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)


def test_a_call_is_run_as_the_python_launcher_would_run_it(site: Site) -> None:
    out = site.call("hook", "no-such-subcommand")
    assert (out.returncode, out.stdout) == (2, "")  # gpuwire-hook's usage error, not echo
    assert out.stderr.startswith("usage: gpuwire-hook prestart")


def test_the_callers_environment_and_stdin_are_the_ones_used(site: Site, tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab")
    lab.records.mkdir(parents=True)
    (lab.records / "c1").write_text("{}")
    state = '{"ociVersion": "1.0.2", "id": "c1", "status": "stopped", "bundle": "/b"}'
    good = site.call("hook", "poststop", stdin=state, env={"GPUWIRE_CONFIG": str(lab.config)})
    assert (good.returncode, good.stderr) == (0, "")
    assert not (lab.records / "c1").exists()  # the record of the container on stdin went
    bad = site.call("hook", "poststop", stdin=state, env={"GPUWIRE_CONFIG": str(tmp_path / "x")})
    assert bad.returncode == 1
    assert str(tmp_path / "x") in bad.stderr


def test_the_runtime_to_exec_is_execd_by_the_caller_in_its_directory(
    site: Site, tmp_path: Path
) -> None:
    """The shim's part is served (config.json edited in the caller's working directory), and
    the runtime it names runs as the caller's own exec, with the caller's arguments."""
    from tests.system.test_runc import granted_env, make_bundle

    lab = Lab(tmp_path / "lab")
    lab.configure(runtime="/bin/echo")
    bundle = make_bundle(lab, granted_env(lab, "2"), delivery="shim")
    env = {"GPUWIRE_CONFIG": str(lab.config), "PATH": os.defpath}
    out = site.call("runtime", "create", "c2", env=env, cwd=bundle.path)
    assert (out.returncode, out.stdout) == (0, "create c2\n"), out.stderr
    spec = (bundle.path / "config.json").read_text()
    assert "/dev/nvidia2" in spec
    assert "/dev/nvidia1" not in spec


@pytest.mark.parametrize(
    ("kind", "token", "prefix"),
    [
        ("hook", "/another/build", ()),
        ("nvidia-hook", None, ()),
        ("hook", None, ("unshare", "--mount")),
        ("hook", None, ("unshare", "--cgroup")),
        ("hook", None, ("unshare", "--pid", "--fork")),
        ("hook", None, NOT_ROOT),
    ],
    ids=[
        "another-build",
        "unknown-kind",
        "another-mount-namespace",
        "another-cgroup-namespace",
        "another-pid-namespace",
        "not-root",
    ],
)
def test_what_the_resident_does_not_serve_runs_the_fallback(
    site: Site, kind: str, token: str | None, prefix: tuple[str, ...]
) -> None:
    out = site.call(kind, "prestart", token=token, prefix=prefix)
    assert (out.returncode, out.stdout, out.stderr) == (0, "fell back: argv0 prestart\n", "")


def test_a_caller_that_is_not_root_is_declined_by_the_resident_too(site: Site) -> None:
    """With the socket opened to everybody, the peer's credentials still decide."""
    os.chmod(site.socket, 0o666)
    try:
        out = site.call("hook", "x", prefix=NOT_ROOT)
    finally:
        os.chmod(site.socket, 0o600)
    assert (out.stdout, out.stderr) == ("fell back: argv0 x\n", "")


def test_nobody_listening_runs_the_fallback(site: Site) -> None:
    nobody = Site(site.home, site.call_path, str(site.home / "nobody.sock"))
    out = nobody.call("hook", "prestart")
    assert (out.returncode, out.stdout) == (0, "fell back: argv0 prestart\n")


def test_calls_at_once_are_each_answered(site: Site) -> None:
    results: list[int] = []

    def one() -> None:
        results.append(site.call("hook", "no-such-subcommand").returncode)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [2] * 16


def test_a_call_still_running_holds_up_no_other(site: Site) -> None:
    """The next child is forked as soon as a call is accepted, not when it is answered."""
    argv = [site.call_path, site.socket, resident.token(), "hook", "2", *FALLBACK, "argv0"]
    env = {"PATH": os.defpath}
    with subprocess.Popen([*argv, "poststop"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as slow:  # fmt: skip
        assert slow.stdin is not None
        until(lambda: serving(site.pid, slow.stdin.fileno()))  # type: ignore[union-attr]
        started = time.monotonic()
        out = site.call("hook", "no-such-subcommand")  # while poststop waits for its stdin
        assert (out.returncode, out.stdout) == (2, "")
        assert time.monotonic() - started < 1.5  # served, not passed by after 2 s
        assert slow.poll() is None
        _, err = slow.communicate("not json")
    assert (slow.returncode, err.startswith("gpuwire-hook poststop: the OCI state")) == (1, True)


def serving(pid: int, stdin: int) -> bool:
    """Whether a child of the resident has taken on this stdin (a call it is serving)."""
    pipe = os.fstat(stdin).st_ino
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    with contextlib.suppress(OSError):
        return any(os.stat(f"/proc/{child}/fd/0").st_ino == pipe for child in children)
    return False


def test_gpuwire_call_is_static(site: Site) -> None:
    """It runs on the host whatever glibc the host has: no program interpreter."""
    data = Path(site.call_path).read_bytes()
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    size, count = struct.unpack_from("<HH", data, 0x36)
    types = {struct.unpack_from("<I", data, phoff + i * size)[0] for i in range(count)}
    assert 3 not in types  # PT_INTERP


def test_without_a_compiler_the_launchers_run_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    (tmp_path / launcher.CALL).write_text("an earlier install's")  # CDI specs would name it
    _, hook = launcher.install(str(tmp_path), python="/usr/bin/python3")
    assert not (tmp_path / launcher.CALL).exists()
    settings = settings_of(Path(hook).read_text())
    assert (settings["python"], settings["call"]) == ("/usr/bin/python3", "")
    assert f"{launcher.CALL} not built (no C compiler" in capfd.readouterr().err


def test_a_resident_that_does_not_greet_is_passed_by(site: Site) -> None:
    """A stopped (or swamped) resident holds no start up for long, and never serves a call
    that has already run its fallback."""
    stopped = [site.pid, waiting_child(site.pid)]  # the resident, and its child forked ahead
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        out = site.call("hook", "no-such-subcommand")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert (out.returncode, out.stdout) == (0, "fell back: argv0 no-such-subcommand\n")
    again = site.call("hook", "no-such-subcommand")  # served again, the late one dropped
    assert (again.returncode, again.stdout) == (2, "")


def test_a_stopped_resident_leaves_neither_socket_nor_child(tmp_path: Path) -> None:
    socket = str(tmp_path / "resident.sock")
    with Resident(socket) as running:
        waiting = waiting_child(running.process.pid)
    assert running.process.returncode == 0  # SIGTERM: a clean stop
    assert not os.path.exists(socket)
    assert not Path(f"/proc/{waiting}").exists()  # the child forked ahead went with it


def test_a_graceful_stop_finishes_the_calls_it_took(tmp_path: Path) -> None:
    """SIGTERM to the resident's whole process group, as systemd's KillMode=control-group
    sends it to every process of the unit: a call a child has taken is answered as if
    nothing had happened (killed with it, its start failed: `gave no answer`), the resident
    and its child forked ahead go, and the next call runs the fallback."""
    call = launcher.build_call(str(tmp_path))
    assert call is not None
    site = Site(tmp_path, call, str(tmp_path / "resident.sock"))
    argv = [call, site.socket, resident.token(), "hook", "2", *FALLBACK, "argv0", "poststop"]
    with Resident(site.socket, process_group=True) as running:
        pid = running.process.pid
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={"PATH": os.defpath}) as taken:  # fmt: skip
            assert taken.stdin is not None
            until(lambda: serving(pid, taken.stdin.fileno()))  # type: ignore[union-attr]
            until(lambda: len(children(pid)) == 2)  # the call's, and the next one forked ahead
            forked = children(pid)
            os.killpg(pid, signal.SIGTERM)
            stopped = running.process.wait(timeout=10)
            state = json.dumps({"id": "c-stopping", "bundle": str(tmp_path)})
            _, err = taken.communicate(state)  # what poststop waited for
        assert (taken.returncode, err) == (0, "")
        assert stopped == 0
    until(lambda: not any(Path(f"/proc/{child}").exists() for child in forked))
    assert not os.path.exists(site.socket)
    out = site.call("hook", "poststop")
    assert (out.returncode, out.stdout) == (0, "fell back: argv0 poststop\n")


def test_a_graceful_stop_with_80_calls_in_flight_fails_none(tmp_path: Path) -> None:
    """The issue's load: many calls at once when the group's SIGTERM comes, five times. Each
    is served or runs its fallback; none is left without an answer (before, ~2% were)."""
    call = launcher.build_call(str(tmp_path))
    assert call is not None
    state = json.dumps({"id": "c-stopping", "bundle": str(tmp_path)})
    answers: list[tuple[int, str]] = []
    for round_ in range(5):
        socket = str(tmp_path / f"resident-{round_}.sock")
        argv = [call, socket, resident.token(), "hook", "2", *FALLBACK, "argv0", "poststop"]

        def one(argv: list[str] = argv) -> None:
            done = subprocess.run(argv, input=state, capture_output=True, text=True,
                                  env={"PATH": os.defpath}, timeout=30)  # fmt: skip
            answers.append((done.returncode, done.stderr))

        with Resident(socket, process_group=True) as running:
            calls = [threading.Thread(target=one) for _ in range(80)]
            for thread in calls:
                thread.start()
            time.sleep(0.01 * (round_ + 1))  # the stop lands at another point of the storm
            os.killpg(running.process.pid, signal.SIGTERM)
            for thread in calls:
                thread.join()
    assert [a for a in answers if a != (0, "")] == []


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def waiting_child(pid: int) -> int:
    """The child a resident keeps forked ahead, waiting in accept."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    until(lambda: len(children.read_text().split()) == 1)
    return int(children.read_text())


@pytest.mark.parametrize("source", launcher.CALL_SOURCES)
def test_gpuwire_call_compiles_without_warnings(source: str) -> None:
    """The C files' lint: what -Wall -Wextra would say, with the hook's settings in (its
    `gpuwire-hook` mode compiled too), a failure."""
    defines = launcher.hook_defines("/usr/bin/python3", "/opt/gpuwire", "/run/gpuwire.sock")
    lint = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *defines]
    out = subprocess.run([*lint, source], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_declined_call_gives_the_callers_stdio_back_before_it_answers() -> None:
    """A runtime reads a hook's output until every copy of its pipes is closed: the child
    that declines must not keep the caller's until its own exit."""
    caller, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe()
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    request = b"\0".join([b"another-build", b"hook", b"22", b"1", b"argv0", b""])
    socket.send_fds(caller, [request], [write_end, write_end, write_end, cwd])
    os.close(write_end)
    os.close(cwd)
    assert resident.answer(child, resident.Served()) == 0
    assert (caller.recv(1), caller.recv(1)) == (b"r", b"f")
    os.set_blocking(read_end, False)
    assert os.read(read_end, 1) == b""  # no copy of the caller's stdout is left open
    os.close(read_end)


# -- no Python to fall back to: the image's install (docs/runtime.md, "No Python on the host")


def resident_only_call(home: Path, socket: str, wait: float) -> str:
    """gpuwire-call as the image builds it: no fallback to run, `wait` seconds to wait."""
    defines = launcher.hook_defines(None, resident.token(), socket, wait)
    call = launcher.build_call(str(home), defines)
    assert call is not None
    return call


def sleeping(pid: int) -> bool:
    """Whether the process is between two tries (gpuwire-call's pause)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/wchan").read_text() in ("hrtimer_nanosleep", "do_nanosleep")
    return False


def test_without_a_fallback_a_call_waits_for_a_resident_to_serve_it(tmp_path: Path) -> None:
    """The resident restarted during a start: the call waits and is served by the next one."""
    socket = str(tmp_path / "resident.sock")
    call = resident_only_call(tmp_path, socket, wait=120)
    with Resident(socket):
        pass  # stopped: its socket is gone
    argv = [call, socket, resident.token(), "hook", "2", "argv0", "no-such-subcommand"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={"PATH": os.defpath}) as waiting:  # fmt: skip
        until(lambda: sleeping(waiting.pid))  # it found nobody and waits
        with Resident(socket):
            out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (2, "")  # gpuwire-hook's usage error: served
    assert err.startswith("usage: gpuwire-hook prestart")


def test_without_a_resident_a_gpu_start_fails_clearly_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Absent for longer than the wait: the create fails, saying why on stderr and in the
    runtime's log (where containerd reads it), its bundle as it was, no record, no runtime."""
    from tests.system.test_runc import granted_env, make_bundle

    lab = Lab(tmp_path / "lab")
    lab.configure(runtime="/bin/echo")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))
    socket = str(tmp_path / "resident.sock")
    runtime, _ = launcher.install(str(tmp_path / "libexec"), python=None, socket=socket, wait=0.5)
    bundle = make_bundle(lab, granted_env(lab, "0"), delivery="shim")
    spec = (bundle.path / "config.json").read_text()
    log = tmp_path / "runc.log"
    argv = [runtime, "--log", str(log), "--log-format", "json", "create", "--bundle"]
    out = subprocess.run([*argv, str(bundle.path), "c1"], capture_output=True, text=True)
    message = (
        f"no resident gpuwire served this call within 0.5 s ({socket}: nobody listens there: "
        "No such file or directory): it fails, as nothing else here checks what the "
        "container asks for (is the gpuwire-node pod running on this node?)"
    )
    assert (out.returncode, out.stdout, out.stderr) == (1, "", f"gpuwire-runtime: {message}\n")
    assert json.loads(log.read_text())["msg"] == f"gpuwire: {message}"
    assert (bundle.path / "config.json").read_text() == spec
    assert not lab.records.exists()


def test_without_a_resident_other_calls_run_the_runtime_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No container but a GPU create waits: a create asking for no GPU and the delete of a
    GPU container run the runtime directly (the delete's record is left to the node
    agent's sweep), under a wait no test would sit through."""
    from tests.system.test_runc import make_bundle

    lab = Lab(tmp_path / "lab")
    lab.configure(runtime="/bin/echo")
    monkeypatch.setenv("GPUWIRE_CONFIG", str(lab.config))
    socket = str(tmp_path / "resident.sock")
    runtime, _ = launcher.install(str(tmp_path / "libexec"), python=None, socket=socket, wait=3600)
    plain = make_bundle(lab, {"A": "1"}, delivery="shim", script="true")
    lab.records.mkdir()
    (lab.records / "held").write_text("{}")
    for args in (["create", "--bundle", str(plain.path), "c1"], ["delete", "--force", "held"]):
        out = subprocess.run([runtime, *args], capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout, out.stderr) == (0, " ".join(args) + "\n", "")
    assert (lab.records / "held").exists()


def test_without_a_fallback_a_declined_call_fails_saying_why(site: Site, tmp_path: Path) -> None:
    """Another build's launcher (an upgrade's, before its resident is up) waits for its own;
    where none comes, the failure names whom the resident there serves."""
    call = resident_only_call(tmp_path, site.socket, wait=0.5)
    argv = [call, site.socket, "/another/build", "hook", "2", "argv0", "prestart"]
    out = subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.defpath})
    assert out.returncode == 1
    assert (
        f"({site.socket}: the resident there declines: it serves the launchers of "
        f"{resident.token()}, not of /another/build)"
    ) in out.stderr


def test_a_resident_that_entered_a_host_serves_its_starts_with_its_paths(tmp_path: Path) -> None:
    """As the DaemonSet runs it: loaded here, then in the host's namespaces (a host whose
    root is a busybox tree with no Python), serving the launchers installed there; the
    shim's edits land in the host's bundle, the runtime it names is the host's."""
    from testbed.hostroot import HostRoot
    from testbed.rootfs import busybox_rootfs
    from tests.system.test_runc import granted_env, make_bundle

    root = busybox_rootfs(tmp_path / "host")
    shutil.copy("/sbin/ldconfig", root / "sbin/ldconfig")  # static: what the config names
    lab = Lab(root / "lab", host=root)
    lab.configure(runtime="/bin/echo")  # the host's (busybox's)
    libexec = root / "opt/gpuwire/t/libexec"
    launcher.install(str(libexec), python=None, runs_from="/opt/gpuwire/t/libexec", wait=60)
    bundle = make_bundle(lab, granted_env(lab, "1"), delivery="shim")
    inside = f"/{bundle.path.relative_to(root)}"
    env = {"PATH": "/usr/bin:/bin", "GPUWIRE_CONFIG": f"/{lab.config.relative_to(root)}"}
    with HostRoot(root) as host, Resident(resident.DEFAULT_SOCKET, enter=host.pid):
        assert (root / resident.DEFAULT_SOCKET.lstrip("/")).is_socket()  # the host's /run
        runtime = "/opt/gpuwire/t/libexec/gpuwire-runtime"
        created = host.run([runtime, "create", "--bundle", inside, "c1"], env=env)
        assert (lab.records / "c1").exists()
        deleted = host.run([runtime, "delete", "c1"], env=env)  # its record goes with it
    assert (created.returncode, created.stdout) == (0, f"create --bundle {inside} c1\n")
    spec = json.loads((bundle.path / "config.json").read_text())
    devices = [d["path"] for d in spec["linux"]["devices"]]
    assert "/dev/nvidia1" in devices
    assert "/dev/nvidia0" not in devices
    assert (deleted.returncode, deleted.stdout) == (0, "delete c1\n")
    assert not (lab.records / "c1").exists()
