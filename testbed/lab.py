"""Helpers shared by the runtime tests: container specs as containerd writes them, and keys."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gpuwire import amdsim, kfd, sim
from gpuwire.devices import MigDevice
from gpuwire.grant import POD_ANNOTATION, KeyRing, Subject
from gpuwire.roots import Roots
from gpuwire.vendor import AMD, NVIDIA, Vendor
from testbed import mps_control

NAMESPACE, CONTAINER, SANDBOX = "team-a", "trainer", "5" * 64
POD_UID = "4fe556a4-0bd7-45be-966f-46e2cbf4c4ac"
ADMISSION = "7c1e0b52-3d8a-4f6e-9b21-5a4c3e2d1f00"  # the webhook's, as the pod carries it
OTHER_POD = "0b0d1f4e-7f38-4c52-9a3c-1d2e3f4a5b6c"  # another pod's UID


def cri_annotations(
    namespace: str = NAMESPACE,
    container: str = CONTAINER,
    sandbox: str = SANDBOX,
    pod: str | None = POD_UID,
    admission: str | None = ADMISSION,
) -> dict[str, str]:
    """The annotations containerd's CRI plugin puts on a Kubernetes container's spec; the
    pod's UID since containerd 1.6.11 (`pod=None`: an older containerd); the pod's grant
    annotation, which `gpuwire containerd configure` passes through (None: a pod without)."""
    return {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": sandbox,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.container-name": container,
        **({"io.kubernetes.cri.sandbox-uid": pod} if pod else {}),
        **({POD_ANNOTATION: admission} if admission else {}),
    }


def container_spec(
    env: list[str] | dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    bounding: list[str] | None = None,
) -> dict[str, Any]:
    entries = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else list(env or [])
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "env": ["PATH=/usr/bin:/bin", *entries],
            "capabilities": {"bounding": bounding or ["CAP_CHOWN", "CAP_KILL"]},
        },
        "root": {"path": "rootfs"},
        "annotations": cri_annotations() if annotations is None else annotations,
        "mounts": mounts or [],
    }


def write_keys(directory: Path) -> KeyRing:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "2026-06").write_text("node-test-secret\n")
    return KeyRing.load(directory)


def grant_for(
    keys: KeyRing,
    visible: str,
    caps: str = "",
    *,
    namespace: str = NAMESPACE,
    vendor: Vendor = NVIDIA,
    env: dict[str, str] | None = None,
    admission: str = ADMISSION,
) -> str:
    """The webhook's grant for the lab's container of the pod `admission` made, with the
    limit variables of `env`."""
    subject = Subject.of(namespace, CONTAINER, visible, caps, vendor, pod=admission, env=env)
    return keys.sign(subject)


class Lab:
    """A simulated GPU node (with the stand-in MPS control program and HAMi-core library,
    named in the config), grant keys and a gpuwire config file under one directory; with
    `mig` (GPU index → profiles, as `gpuwire sim node --mig`), MIG devices and the MIG map
    the node agent writes of them. `host`: the root of a host the lab lies in
    (testbed/hostroot.py), whose paths the config names."""

    def __init__(
        self,
        root: Path,
        gpus: int = 4,
        mig: dict[int, tuple[str, ...]] | None = None,
        host: Path | None = None,
    ) -> None:
        self.root = root
        self.host = host
        self.node = root / "node"
        self.machine = sim.make_machine(gpus=gpus)
        for index, profiles in (mig or {}).items():
            self.machine = sim.with_mig(self.machine, index, profiles)
        sim.write_node(self.node, self.machine)
        mps_control.install(self.node)  # the driver's MPS control program: the stand-in
        self.mig_map = root / "mig-devices"
        self.mig: tuple[MigDevice, ...] = self.write_mig_map()
        self.keys = write_keys(root / "keys")
        self.allocations = root / "allocations"
        self.log = root / "gpuwire.log"
        self.records = root / "containers"  # what the shim and hook record (gpuwire.records)
        self.config = root / "config.toml"
        self.configure()

    def configure(self, **extra: str) -> None:
        settings = {
            "root": str(self.node),
            "grant-key-dir": str(self.root / "keys"),
            "allocation-dir": str(self.allocations),
            "log": str(self.log),
            "records-dir": str(self.records),
            "mig-map": str(self.mig_map),
            "hami-library": str(self.node / sim.HAMI_LIBRARY),
            "hami-dir": str(self.root / "hami"),
            **extra,
        }
        if self.host is not None:  # as the host names them
            host = self.host
            settings = {
                k: f"/{Path(v).relative_to(host)}" if Path(v).is_relative_to(host) else v
                for k, v in settings.items()
            }
        self.config.write_text("".join(f'{k} = "{v}"\n' for k, v in settings.items()))

    def uuid(self, index: int) -> str:
        return self.machine.devices[index].uuid

    def write_mig_map(self) -> tuple[MigDevice, ...]:
        """The MIG map as the node agent writes it: its discovery of the node's MIG devices."""
        from deviceplugin.gpus.simulated import SimDiscovery
        from gpuwire import mig

        found = SimDiscovery(self.node).discover().mig_devices
        mig.write_map(str(self.mig_map), found)
        return found

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


class AmdLab(Lab):
    """A simulated AMD GPU node (`machine`, default eight MI300X in SPX), grant keys and a
    gpuwire config file (`vendor = "amd"`) under one directory."""

    def __init__(self, root: Path, machine: amdsim.AmdMachine | None = None) -> None:
        self.root = root
        self.node = root / "node"
        self.amd = machine or amdsim.make_machine()
        amdsim.write_node(self.node, self.amd)
        self.found = kfd.discover(Roots(str(self.node)))
        self.keys = write_keys(root / "keys")
        self.allocations = root / "allocations"
        self.log = root / "gpuwire.log"
        self.records = root / "containers"
        self.config = root / "config.toml"
        self.configure()

    def configure(self, **extra: str) -> None:
        settings = {
            "vendor": AMD.name,
            "root": str(self.node),
            "grant-key-dir": str(self.root / "keys"),
            "allocation-dir": str(self.allocations),
            "log": str(self.log),
            "records-dir": str(self.records),
            **extra,
        }
        self.config.write_text("".join(f'{k} = "{v}"\n' for k, v in settings.items()))

    def uuid(self, index: int) -> str:
        return self.found.devices[index].uuid

    def grant(self, visible: str, caps: str = "", namespace: str = NAMESPACE) -> dict[str, str]:
        """AMD_VISIBLE_DEVICES=`visible` with the webhook's grant for it."""
        signed = grant_for(self.keys, visible, caps, vendor=AMD, namespace=namespace)
        return {AMD.visible_env: visible, "GPUWIRE_GRANT": signed}


@functools.cache
def served_launchers() -> Path:
    """A libexec whose launchers only a resident gpuwire can serve (the Python they would
    fall back to does not exist), with that resident running: once per test session."""
    from runtime_hook.setup import launcher
    from testbed.resident import Resident

    home = Path(tempfile.mkdtemp(prefix="gpuwire-served-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    socket = str(home / "resident.sock")
    launcher.install(str(home / "libexec"), python="/nonexistent/python3", socket=socket)
    atexit.register(Resident(socket).close)  # runs first: atexit goes in reverse
    return home / "libexec"
