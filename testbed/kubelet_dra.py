"""A kubelet stand-in for DRA plugins, over real unix sockets: the plugin watcher and the DRA
manager's calls (Kubernetes pkg/kubelet/pluginmanager, pkg/kubelet/cm/dra).

What it does as the kubelet does: watches `<root>/plugins_registry` for sockets (names that
start with `.` are skipped), calls GetInfo on each new one, checks the type (`DRAPlugin`), the
driver name and the supported versions — it takes the first `<version>.DRAPlugin` of the
plugin's list that it supports itself (`versions`: a 1.34–1.37 kubelet supports v1 and
v1beta1, a 1.33 one v1beta1 only) — dials `unix:<endpoint>` (on its host: `host`), and answers with
NotifyRegistrationStatus; a refused registration is retried from scratch after a backoff; a
removed socket deregisters that driver. `prepare` and `unprepare` are one call per driver with
the claims' namespace, name and UID (45 s timeout), and the claims prepared are kept in
`dra_manager_state` (a claim is prepared once per node: preparing it again for another pod
sends nothing). When the plugin lists a DRAResourceHealth service the kubelet supports, it
keeps a NodeWatchResources stream open, redialled every 5 s, and keeps each device's last
report with its own receive time (Unknown after the report's timeout, default 30 s). With an
API client it deletes the node's ResourceSlices at start and a driver's slices once no
instance of it has been registered for `wipe_delay` seconds (30 s in the kubelet).
`restart` is a new kubelet process: streams and connections end, the state file is read back
(its claims prepared again on their next use, as the kubelet does), and every socket already
in the registry directory is registered again.

Left out: the plugin watcher's inotify (the directory is listed every 50 ms), rolling updates
(several instances of one driver), the reconcile loop that unprepares for pods the kubelet
forgot, and the pod and container side (the CRI kubelet stand-in takes the CDI ids).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

CALL_TIMEOUT = 45.0
HEALTH_REDIAL = 5.0
DEFAULT_HEALTH_TIMEOUT = 30.0
STATE = "dra_manager_state"
KUBELET_1_37 = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth")  # fmt: skip
KUBELET_1_34 = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
KUBELET_1_33 = ("v1beta1.DRAPlugin",)
_DRIVER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_STUBS = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
_HEALTH = {
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}


class KubeletError(RuntimeError):
    """A call that failed as a whole (a gRPC error), as the kubelet would report it."""


@dataclass
class DeviceHealth:
    health: str  # Healthy, Unhealthy, Unknown
    message: str
    received: float
    timeout: float


@dataclass
class Plugin:
    """The kubelet's view of one registered driver."""

    driver: str
    endpoint: str
    socket: Path
    version: str  # v1 or v1beta1
    channel: Any
    health_version: str | None
    health: dict[tuple[str, str], DeviceHealth] = field(default_factory=dict)
    health_messages: int = 0

    @property
    def pb(self) -> Any:
        return _STUBS[self.version][0]

    @property
    def stub(self) -> Any:
        return _STUBS[self.version][1].DRAPluginStub(self.channel)


class DraKubelet:
    def __init__(
        self,
        root: Path,
        node: str,
        versions: tuple[str, ...] = KUBELET_1_37,
        api: Any = None,
        wipe_delay: float = 30.0,
        retry: float = 0.2,
        host: Callable[[str], Path] = Path,
    ) -> None:
        self.root = root
        self.host = host  # where a path on the kubelet's host is seen from here (an endpoint)
        self.registry = root / "plugins_registry"
        self.node = node
        self.versions = versions
        self.api = api  # kubernetes ApiClient, for the slice wiping
        self.wipe_delay = wipe_delay
        self.retry = retry
        self.plugins: dict[str, Plugin] = {}
        self.infos: list[pluginregistration_pb2.PluginInfo] = []
        self.refusals: list[str] = []
        self.prepared: dict[str, dict[str, Any]] = {}  # claim UID → claim and answer
        self.fresh: set[str] = set()  # the claims this instance has prepared (not just read)
        self.starts = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: dict[Path, tuple[int, int, int]] = {}  # registered socket → its identity
        self._failed: dict[Path, float] = {}  # socket → when to try again
        self._gone: dict[str, float] = {}  # driver → when it deregistered

    # lifecycle

    def __enter__(self) -> DraKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self._stop = threading.Event()
        state = self.root / STATE
        self.prepared = json.loads(state.read_text()) if state.exists() else {}
        self.fresh = set()
        if self.api is not None:
            self._delete_slices(None)
        watcher = threading.Thread(target=self._watch, name="plugin-watcher", daemon=True)
        self._threads = [watcher]
        watcher.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._lock:
            for plugin in self.plugins.values():
                plugin.channel.close()
            self.plugins.clear()
            self._sockets.clear()
            self._failed.clear()

    def restart(self) -> None:
        self.stop()
        self.start()

    # the plugin watcher

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            present = {}
            with contextlib.suppress(FileNotFoundError):
                for path in self.registry.iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        st = path.lstat()
                        if not path.name.startswith(".") and stat.S_ISSOCK(st.st_mode):
                            present[path] = (
                                st.st_dev,
                                st.st_ino,
                                st.st_ctime_ns,
                            )  # a new socket, even at a reused inode
            with self._lock:
                for path in [p for p in self._sockets if self._sockets[p] != present.get(p)]:
                    self._deregister(path)
            for path, ident in present.items():
                if path in self._sockets or time.monotonic() < self._failed.get(path, 0.0):
                    continue
                self._register(path, ident)
            self._wipe()

    def _register(self, path: Path, ident: tuple[int, int, int]) -> None:
        try:
            with grpc.insecure_channel(f"unix:{path}") as channel:
                registration = pluginregistration_pb2_grpc.RegistrationStub(channel)
                info = registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
                self.infos.append(info)
                error = self._validate(info)
                plugin = None if error else self._connect(info, path)
                registration.NotifyRegistrationStatus(
                    pluginregistration_pb2.RegistrationStatus(
                        plugin_registered=error is None, error=error or ""
                    ),
                    timeout=5,
                )
        except grpc.RpcError as exc:
            error, plugin = f"plugin at {path}: {exc.code().name}: {exc.details()}", None
        if plugin is None:
            self.refusals.append(error or "")
            self._failed[path] = time.monotonic() + self.retry
            return
        with self._lock:
            self.plugins[plugin.driver] = plugin
            self._sockets[path] = ident
            self._gone.pop(plugin.driver, None)
        if plugin.health_version:
            thread = threading.Thread(target=self._health, args=(plugin,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _validate(self, info: Any) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if not _DRIVER.match(info.name) or len(info.name) > 63:
            return f"driver name {info.name!r} is not a lower-case DNS subdomain of ≤ 63"
        if info.name in self.plugins:
            return f"driver {info.name} is already registered"
        if not self._pick(info.supported_versions, "DRAPlugin"):
            wanted = [v for v in self.versions if v.endswith(".DRAPlugin")]
            return f"none of {list(info.supported_versions)} is supported (this kubelet: {wanted})"
        return None

    def _pick(self, offered: Any, service: str) -> str | None:
        """The first of the plugin's `<version>.<service>` entries this kubelet supports."""
        for entry in offered:
            version, _, name = entry.partition(".")
            if name == service and entry in self.versions:
                return str(version)
        return None

    def _connect(self, info: Any, path: Path) -> Plugin:
        return Plugin(
            driver=info.name,
            endpoint=info.endpoint,
            socket=path,
            version=self._pick(info.supported_versions, "DRAPlugin") or "",
            channel=grpc.insecure_channel(f"unix:{self.host(info.endpoint)}"),
            health_version=self._health_version(info.supported_versions),
        )

    def _health_version(self, offered: Any) -> str | None:
        """1.37: the plugin's listed service, v1 preferred; 1.34–1.36: v1alpha1 always."""
        if "v1.DRAResourceHealth" in self.versions:
            for version in ("v1", "v1alpha1"):
                if f"{version}.DRAResourceHealth" in offered:
                    return str(version)
            return None
        return "v1alpha1" if "v1alpha1.DRAResourceHealth" in self.versions else None

    def _deregister(self, path: Path) -> None:
        del self._sockets[path]
        for driver, plugin in list(self.plugins.items()):
            if plugin.socket == path:
                plugin.channel.close()
                del self.plugins[driver]
                self._gone[driver] = time.monotonic()

    def _wipe(self) -> None:
        if self.api is None:
            return
        for driver, since in list(self._gone.items()):
            if time.monotonic() - since >= self.wipe_delay:
                self._delete_slices(driver)
                del self._gone[driver]

    def _delete_slices(self, driver: str | None) -> None:
        client: Any = importlib.import_module("kubernetes.client")
        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        api = client.ResourceV1Api(self.api)
        for item in api.list_resource_slice(field_selector=selector).items:
            with contextlib.suppress(client.ApiException):
                api.delete_resource_slice(item.metadata.name)

    # health

    def _health(self, plugin: Plugin) -> None:
        pb, grpc_module = _HEALTH[plugin.health_version or ""]
        while not self._stop.is_set() and self.plugins.get(plugin.driver) is plugin:
            stream = grpc_module.DRAResourceHealthStub(plugin.channel).NodeWatchResources(
                pb.NodeWatchResourcesRequest()
            )
            watcher = threading.Thread(target=self._cancel_on_stop, args=(stream, plugin))
            watcher.start()
            try:
                for message in stream:
                    now = time.monotonic()
                    with self._lock:
                        plugin.health_messages += 1
                        for d in message.devices:
                            timeout = d.health_check_timeout_seconds or DEFAULT_HEALTH_TIMEOUT
                            name = pb.HealthStatus.Name(d.health).capitalize()
                            key = (d.device.pool_name, d.device.device_name)
                            plugin.health[key] = DeviceHealth(name, d.message, now, timeout)
            except grpc.RpcError:
                pass
            with self._lock:
                plugin.health.clear()  # a stream end clears the driver's entries
            watcher.join()
            self._stop.wait(HEALTH_REDIAL)

    def _cancel_on_stop(self, stream: Any, plugin: Plugin) -> None:
        while stream.is_active() and self.plugins.get(plugin.driver) is plugin:
            if self._stop.wait(0.05):
                break
        stream.cancel()

    def device_health(self, driver: str) -> dict[str, str]:
        """Device name → Healthy, Unhealthy or Unknown (a report past its timeout)."""
        with self._lock:
            plugin = self.plugins.get(driver)
            if plugin is None:
                return {}
            now = time.monotonic()
            return {
                device: h.health if now - h.received <= h.timeout else "Unknown"
                for (_, device), h in plugin.health.items()
            }

    # the DRA manager

    def wait_registered(self, driver: str, timeout: float = 10.0) -> Plugin:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if driver in self.plugins:
                    return self.plugins[driver]
            time.sleep(0.02)
        raise TimeoutError(f"driver {driver} did not register: {self.refusals[-3:]}")

    def _plugin(self, driver: str) -> Plugin:
        with self._lock:
            plugin = self.plugins.get(driver)
        if plugin is None:
            raise KubeletError(f"DRA driver {driver} is not registered with kubelet")
        return plugin

    def prepare(self, driver: str, claims: list[tuple[str, str, str]]) -> dict[str, Any]:
        """NodePrepareResources for the claims (namespace, name, UID) not prepared yet by this
        kubelet instance (one read back from the state after a restart is prepared again, as
        `newClaimInfoFromState` in kubernetes `pkg/kubelet/cm/dra/claiminfo.go` marks it
        unprepared); the answer per claim UID (a NodePrepareResourceResponse), prepared ones
        from the state. A claim with an error or without an entry stays unprepared (retried on
        the next sync)."""
        plugin = self._plugin(driver)
        todo = [c for c in claims if c[2] not in self.fresh]
        answers: dict[str, Any] = {}
        if todo:
            request = plugin.pb.NodePrepareResourcesRequest(
                claims=[plugin.pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in todo]
            )
            try:
                response = plugin.stub.NodePrepareResources(request, timeout=CALL_TIMEOUT)
            except grpc.RpcError as exc:
                raise KubeletError(
                    f"NodePrepareResources: {exc.code().name}: {exc.details()}"
                ) from None
            for ns, name, uid in todo:
                if uid not in response.claims:
                    answers[uid] = plugin.pb.NodePrepareResourceResponse(
                        error=f"claim {uid}: skipped by the plugin"
                    )
                    continue
                answer = response.claims[uid]
                answers[uid] = answer
                if not answer.error:
                    self.fresh.add(uid)
                    self.prepared[uid] = {"driver": driver, "namespace": ns, "name": name,
                                          "answer": answer.SerializeToString().hex(),
                                          "version": plugin.version}  # fmt: skip
            self._save()
        for _, _, uid in claims:
            if uid not in answers and uid in self.prepared:
                entry = self.prepared[uid]
                pb = _STUBS[entry["version"]][0]
                answers[uid] = pb.NodePrepareResourceResponse.FromString(
                    bytes.fromhex(entry["answer"])
                )
        return answers

    def unprepare(self, driver: str, claims: list[tuple[str, str, str]]) -> dict[str, str]:
        """NodeUnprepareResources for prepared claims; claim UID → error ("" on success).
        Every claim asked must have an entry in the answer."""
        plugin = self._plugin(driver)
        request = plugin.pb.NodeUnprepareResourcesRequest(
            claims=[plugin.pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        try:
            response = plugin.stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            raise KubeletError(
                f"NodeUnprepareResources: {exc.code().name}: {exc.details()}"
            ) from None
        errors = {}
        for _, _, uid in claims:
            if uid not in response.claims:
                errors[uid] = "no entry in the answer"
            else:
                errors[uid] = response.claims[uid].error
                if not errors[uid]:
                    self.prepared.pop(uid, None)
                    self.fresh.discard(uid)
        self._save()
        return errors

    def _save(self) -> None:
        (self.root / STATE).write_text(json.dumps(self.prepared))

    def cdi_ids(self, uid: str, request: str | None = None) -> list[str]:
        """The CDI ids a container with `resources.claims: [{name: …, request: …}]` gets."""
        entry = self.prepared.get(uid)
        if entry is None:
            return []
        pb = _STUBS[entry["version"]][0]
        answer = pb.NodePrepareResourceResponse.FromString(bytes.fromhex(entry["answer"]))
        return [
            cdi
            for device in answer.devices
            if request is None or not device.request_names or request in device.request_names
            for cdi in device.cdi_device_ids
        ]

    def registered(self) -> Iterator[str]:
        with self._lock:
            yield from sorted(self.plugins)
