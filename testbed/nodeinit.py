"""PID 1 of a testbed node (testbed/node.py): it makes the node's root, then does what
systemd does on a node for containerd, and only that.

Run by `unshare --pid --mount --net --uts --fork` as `python -m testbed.nodeinit CONFIG`, it
1. mounts the node's root, an overlay whose lower layer is this machine's `/` (read only
   through it: every write lands in the node's upper layer), with a fresh /proc, /sys, a /dev
   of the usual device nodes, tmpfs /run and /tmp, an empty /etc/cni/net.d and /etc/cdi, and
   /var/lib/containerd on a directory of its own (containerd's snapshots cannot live on an
   overlay); the containerd generation's binaries bound over /usr/bin's; the simulated
   driver installed as a driver installs itself (its libraries and binaries in the root and
   the ld cache, its device nodes in /dev, its /proc/driver and /proc/devices bound over
   procfs's), and the
   whole simulated node at /var/lib/gpuwire-sim/node (what the GPU stand-in reads);
2. names the host, brings up `lo` and the pods' bridge with the gateway address (the API
   server's address as pods reach it), writes the bridge CNI config, and a `systemctl`;
3. pivots into the root and runs containerd as `containerd.service` would
   (`Restart=always`), restarting it on `systemctl restart containerd` (the stand-in talks to
   this process over /run/testbed/systemd.sock) and counting the restarts; reaps orphans
   (shims re-parent to it); on SIGTERM stops containerd and exits, which ends every process
   of the node.

The config (JSON): name, home, overlay (upper, work, root), containerd_root, sim, bin (the
generation's binaries), bridge, gateway, subnet, containerd_config (its text), log.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONTROL = "/run/testbed/systemd.sock"
READY = "/run/testbed/ready"
CNI_CONF = "/etc/cni/net.d/10-testbed.conflist"
CNI_BIN = "/usr/lib/cni"  # Debian's containernetworking-plugins
SIM_MOUNT = "/var/lib/gpuwire-sim/node"
BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")
# What `systemctl` is on the node: a client of this process.
SYSTEMCTL = f"""#!/usr/bin/python3
# The testbed's systemctl (testbed/nodeinit.py): asks the node's PID 1, the systemd stand-in.
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("{CONTROL}")
s.sendall((" ".join(sys.argv[1:]) + "\\n").encode())
code, _, text = s.makefile().read().partition(" ")
if text.strip():
    print(text.strip(), file=sys.stdout if code == "0" else sys.stderr)
sys.exit(int(code))
"""
DEVICES = {
    "null": (1, 3),
    "zero": (1, 5),
    "full": (1, 7),
    "random": (1, 8),
    "urandom": (1, 9),
    "tty": (5, 0),
}


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)


def cni_config(bridge: str, subnet: str, gateway: str) -> str:
    """A bridge network with host-local addresses (containernetworking/plugins `bridge`,
    `host-local`), the gateway on the bridge: pods and the node reach each other."""
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet, "gateway": gateway}]],
        "dataDir": "/run/cni-ipam",
    }
    plugin = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    conf = {"cniVersion": "0.4.0", "name": "testbed", "plugins": [plugin, {"type": "loopback"}]}
    return json.dumps(conf, indent=1)


def mount_root(cfg: dict[str, Any]) -> Path:
    root = Path(cfg["root"])
    sh("mount", "--make-rprivate", "/")
    sh(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir=/,upperdir={cfg['upper']},workdir={cfg['work']}",
        str(root),
    )
    sh("mount", "-t", "proc", "proc", str(root / "proc"))
    sh("mount", "--rbind", "/sys", str(root / "sys"))
    for path in ("dev", "run", "tmp", "etc/cni/net.d", "etc/cdi"):
        (root / path).mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(root / path))
    (root / "tmp").chmod(0o1777)
    dev = root / "dev"
    for name, (major, minor) in DEVICES.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    (dev / "pts").mkdir()
    sh("mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666", "devpts", str(dev / "pts"))
    (dev / "ptmx").symlink_to("pts/ptmx")
    (dev / "shm").mkdir()
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "shm", str(dev / "shm"))
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        (dev / name).symlink_to(target)
    containerd = root / "var/lib/containerd"
    containerd.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", cfg["containerd_root"], str(containerd))
    for name in BINARIES:
        sh("mount", "--bind", f"{cfg['bin']}/{name}", str(root / "usr/bin" / name))
    install_driver(Path(cfg["sim"]), root)
    return root


def install_driver(sim: Path, root: Path) -> None:
    """The simulated driver on the node as the driver's installer and kernel module put
    it: files into the root, device nodes into /dev, procfs entries bound over /proc's."""
    for top in sim.iterdir():
        if top.name not in ("dev", "proc", "sys"):  # merged /usr: /lib is a link, copy into it
            (root / top.name).mkdir(exist_ok=True)
            sh("cp", "-a", f"{top}/.", f"{root / top.name}/")
    for node in (sim / "dev").rglob("*"):
        info = node.lstat()
        target = root / "dev" / node.relative_to(sim / "dev")
        if stat.S_ISDIR(info.st_mode):
            target.mkdir(exist_ok=True)
        elif stat.S_ISCHR(info.st_mode):
            os.mknod(target, info.st_mode, info.st_rdev)
    sh("mount", "--bind", str(sim / "proc/driver"), str(root / "proc/driver"))
    sh("mount", "--bind", str(sim / "proc/devices"), str(root / "proc/devices"))
    (root / SIM_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", "-o", "ro", str(sim), str(root / SIM_MOUNT.lstrip("/")))


def network(cfg: dict[str, Any]) -> None:
    socket.sethostname(cfg["name"])
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", cfg["bridge"], "type", "bridge")
    prefix = cfg["subnet"].split("/")[1]
    sh("ip", "addr", "add", f"{cfg['gateway']}/{prefix}", "dev", cfg["bridge"])
    sh("ip", "link", "set", cfg["bridge"], "up")


def pivot(root: Path) -> None:
    old = root / ".testbed-old-root"
    old.mkdir(exist_ok=True)
    os.chdir(root)
    sh("pivot_root", ".", ".testbed-old-root")
    os.chdir("/")
    sh("umount", "-l", "/.testbed-old-root")
    os.rmdir("/.testbed-old-root")
    # shared, as systemd makes a host's / at boot (HostToContainer and Bidirectional mounts
    # need it); the peers are the node's own, none is this machine's
    sh("mount", "--make-rshared", "/")


class Supervisor:
    """containerd.service: started, restarted when asked or when it exits."""

    def __init__(self, cfg: dict[str, Any], log: int) -> None:
        self.cfg, self.log = cfg, log
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.crashes = 0
        self.stopping = False

    def start(self) -> None:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.process = subprocess.Popen(
            ["/usr/bin/containerd", "--config", "/etc/containerd/config.toml"],
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def command(self, words: list[str]) -> tuple[int, str]:
        verb, unit = [*words, "", ""][:2]
        if unit.removesuffix(".service") != "containerd":
            return 1, f"Unit {unit or '(none)'} not found."
        if verb == "restart":
            self.stop()
            self.start()
            self.restarts += 1
            return 0, ""
        if verb == "is-active":
            up = self.process is not None and self.process.poll() is None
            return (0, "active") if up else (3, "inactive")
        if verb == "show-restarts":  # the testbed's own question
            return 0, str(self.restarts)
        return 1, f"systemctl {verb}: not served by the testbed's systemd stand-in"

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.process is not None and pid == self.process.pid:
                self.process.returncode = 0
                self.process = None
                if not self.stopping:  # Restart=always
                    self.crashes += 1
                    time.sleep(0.5)
                    self.start()


def serve(supervisor: Supervisor) -> None:
    Path(CONTROL).parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(CONTROL)
    os.chmod(CONTROL, 0o600)
    server.listen()
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    signal.signal(signal.SIGTERM, lambda *_: setattr(supervisor, "stopping", True))
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    Path(READY).write_text("ready\n")
    while not supervisor.stopping:
        for _ in selector.select(timeout=0.2):
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):
                words = conn.makefile().readline().split()
                code, text = supervisor.command(words)
                conn.sendall(f"{code} {text}\n".encode())
        supervisor.reap()
    supervisor.stop()


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    root = mount_root(cfg)
    network(cfg)
    pivot(root)
    Path(CNI_CONF).write_text(cni_config(cfg["bridge"], cfg["subnet"], cfg["gateway"]))
    Path("/etc/containerd").mkdir(parents=True, exist_ok=True)
    Path("/etc/containerd/config.toml").write_text(cfg["containerd_config"])
    sh("ldconfig")  # as the driver's installer does: its libraries in the node's ld cache
    Path("/usr/bin/systemctl").write_text(SYSTEMCTL)
    Path("/usr/bin/systemctl").chmod(0o755)
    supervisor = Supervisor(cfg, log)
    supervisor.start()
    serve(supervisor)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
