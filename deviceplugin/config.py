"""The plugin's settings: defaults, a YAML config file, then command-line flags on top.

The file mirrors NVIDIA's where the idea is the same (`version: v1`, `resources` with
`pattern`/`name`, `sharing.timeSlicing.{replicas,failRequestsGreaterThanOne,renameByDefault}`,
`sharing.mps.replicas`), and adds what holds a replica to its share (`sharing.timeSlicing.
limits: hami`, MPS's own daemons) and the node's mechanisms (`mps.root`, `hami.library`).
A bad key or value is refused with the key, the value and what is accepted; nothing starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.gpus.health import DEFAULT_IGNORED_XIDS, DEFAULT_RECOVER_AFTER
from deviceplugin.plugin import amdresources
from deviceplugin.plugin.allocate import CDI_NAMES
from deviceplugin.plugin.migstrategy import STRATEGIES
from deviceplugin.plugin.resources import Rule, Sharing, resource_name_error
from gpuwire import allocation, grant, mig, nvidia, quantity
from gpuwire.vendor import VENDORS

KUBELET_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_ROOT = "/var/lib/kubelet"
DEFAULT_HOOK = "/opt/gpuwire/current/libexec/gpuwire-hook"  # the node installer's launcher
STATE_DIR = "/var/lib/gpuwire/node"  # the node agent's state where a role has no place of its own
MAX_REPLICAS = 1000  # keeps `<uuid>::<n>` within the kubelet's 63-character ID limit


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it, its value and what is accepted."""


@dataclass(frozen=True)
class Config:
    kubelet_dir: str = KUBELET_DIR
    sim: str | None = None  # simulated node root; None: NVML
    resource: str = nvidia.RESOURCE
    rules: tuple[Rule, ...] = ()  # per-model resource names, first match wins
    replicas: int = 1
    fail_requests_greater_than_one: bool = False
    rename_by_default: bool = False  # shared GPUs advertised as <resource>.shared
    mig_strategy: str = "none"  # none, single, mixed (NVIDIA's)
    mig_map: str = mig.DEFAULT_MAP  # where the node side learns the names of MIG devices
    device_specs: bool = False
    cdi: str = "none"
    cdi_kind: str = nvidia.CDI_KIND
    dev_root: str | None = None  # where DeviceSpec host paths live; None: the host root
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recover_after: float | None = DEFAULT_RECOVER_AFTER
    pre_start_check: bool = False
    allocation_dir: str = allocation.DEFAULT_DIR
    grant_key_dir: str = grant.DEFAULT_KEY_DIR
    sweep_interval: float = 60.0
    sweep_grace: float = 300.0
    labels: bool = False
    label_interval: float = 60.0
    # the installer's ready file: while it exists, and this agent runs under gpuwire's
    # runtime handler, the node may take GPU pods (labels.RUNTIME_READY)
    runtime_ready: str | None = None
    node_name: str | None = None
    kubeconfig: str | None = None
    share_limits: str = "none"  # what holds each time-sliced replica to its share
    mps_replicas: int | None = None  # GPUs shared through MPS: replicas per GPU
    replica_memory: tuple[int | None, int | None] = (None, None)  # (MiB, percent) per replica
    replica_cores: int | None = None  # percent per replica
    mps_root: str | None = None  # the node agent runs an MPS control daemon per GPU there
    hami_library: str | None = None  # HAMi-core's libvgpu.so on this node
    driver_facts: str | None = None  # where to write what NVML knows for NVIDIA_REQUIRE_*
    state_dir: str | None = None  # the node agent's state (health.json); None: `node_state`
    vendor: str = "nvidia"  # whose GPUs this node has (gpuwire.vendor): nvidia or amd
    amd_naming: str = "single"  # AMD's resource naming: single or mixed (amdresources)

    # the DRA plugin's (gpuwire dra serve)
    kubelet_root: str = KUBELET_ROOT
    cdi_dir: str = "/var/run/cdi"
    shared_gpus: tuple[str, ...] = ()  # GPU UUIDs or product globs published as shared
    host_root: str = "/"  # where the plugin sees the host's root (CDI specs name host paths)
    driver_root: str | None = None  # the driver's files; None: the simulated node or host root
    hook: str = DEFAULT_HOOK  # gpuwire-hook as the host runs it, for the claims' ld-cache hook
    ldconfig: str = "/sbin/ldconfig"  # the host's static ldconfig, the hook's fallback

    def node_state(self, role_default: str = STATE_DIR) -> str:
        """Where the node agent keeps its state: as set, else the role's place (the DRA
        plugin's: its plugin directory), under the simulated node's root on one (each its
        own, as on a real node)."""
        if self.state_dir is not None:
            return self.state_dir
        if self.sim is not None and role_default == STATE_DIR:
            return str(Path(self.sim) / STATE_DIR.lstrip("/"))
        return role_default

    @property
    def sharing(self) -> Sharing:
        """How replicas share a GPU: MPS when `sharing.mps.replicas` is set."""
        limits = "mps" if self.mps_replicas else self.share_limits
        mib, percent = self.replica_memory
        return Sharing(limits, mib, percent, self.replica_cores)

    @property
    def shared_replicas(self) -> int:
        return self.mps_replicas or self.replicas

    @property
    def default_resource(self) -> str:
        """The name GPUs get when no rule matches them."""
        if self.rename_by_default and self.shared_replicas > 1:
            return f"{self.resource}.shared"
        return self.resource


def as_text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def as_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def as_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"expected a whole number from 1 to {MAX_REPLICAS}")
    return value


def as_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError("expected a number of seconds, 0 or more")
    return float(value)


def as_recovery(value: Any) -> float | None:
    """Seconds above 0 (0 would mean a GPU is never seen unhealthy), or `never`."""
    if value == "never":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError("expected a number of seconds above 0, or never")
    return float(value)


def as_xids(value: Any) -> frozenset[int]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise ValueError("expected a list of XID numbers, e.g. [13, 31, 43]")
    return frozenset(value)


def as_path(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError("expected an absolute path")
    return value


def as_percent(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise ValueError("expected a percentage, a whole number from 1 to 100")
    return value


def as_replica_memory(value: Any) -> tuple[int | None, int | None]:
    """A size (`20Gi`) or a share of the GPU (`25%`)."""
    text = str(value).strip() if isinstance(value, str) else ""
    if text.endswith("%") and text[:-1].isdigit():
        return None, as_percent(int(text[:-1]))
    try:
        return quantity.mib_at_most(text), None
    except quantity.QuantityError:
        raise ValueError(f"expected {quantity.ACCEPTED}, or a percentage (25%)") from None


def as_share_limits(value: Any) -> str:
    if value not in ("none", "hami"):
        raise ValueError("expected none (nothing holds a replica to its share) or hami")
    return str(value)


def as_gpus(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise ValueError("expected GPU UUIDs or product-name patterns, e.g. [GPU-…, '*A100*']")
    return tuple(items)


def as_resource(value: Any) -> str:
    name = as_text(value)
    error = resource_name_error(name)
    if error:
        raise ValueError(error)
    return name


def as_cdi(value: Any) -> str:
    if value not in CDI_NAMES:
        raise ValueError(f"expected one of {', '.join(CDI_NAMES)}")
    return str(value)


def as_mig_strategy(value: Any) -> str:
    if value not in STRATEGIES:
        raise ValueError(f"expected one of {', '.join(STRATEGIES)}")
    return str(value)


def as_vendor(value: Any) -> str:
    names = [v.name for v in VENDORS]
    if value not in names:
        raise ValueError(f"expected one of {', '.join(names)}")
    return str(value)


def as_amd_naming(value: Any) -> str:
    if value not in amdresources.NAMINGS:
        raise ValueError(f"expected one of {', '.join(amdresources.NAMINGS)}")
    return str(value)


def as_rules(value: Any) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise ValueError("expected a list of {pattern, name[, replicas]}")
    rules = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not {"pattern", "name"} <= set(item):
            raise ValueError(f"entry {i}: expected {{pattern, name[, replicas]}}")
        unknown = set(item) - {"pattern", "name", "replicas"}
        if unknown:
            raise ValueError(f"entry {i}: unknown key {sorted(unknown)[0]!r}")
        replicas = as_count(item["replicas"]) if "replicas" in item else None
        rules.append(Rule(as_text(item["pattern"]), as_resource(item["name"]), replicas))
    return tuple(rules)


# config file key (dotted path) → (Config field, parser)
FILE_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "kubeletDir": ("kubelet_dir", as_text),
    "resourceName": ("resource", as_resource),
    "resources": ("rules", as_rules),
    "sharing.timeSlicing.replicas": ("replicas", as_count),
    "sharing.timeSlicing.failRequestsGreaterThanOne": ("fail_requests_greater_than_one", as_flag),
    "sharing.timeSlicing.renameByDefault": ("rename_by_default", as_flag),
    "sharing.timeSlicing.limits": ("share_limits", as_share_limits),
    "sharing.mps.replicas": ("mps_replicas", as_count),
    "sharing.perReplica.memory": ("replica_memory", as_replica_memory),
    "sharing.perReplica.cores": ("replica_cores", as_percent),
    "mps.root": ("mps_root", as_path),
    "hami.library": ("hami_library", as_path),
    "driverFacts": ("driver_facts", as_path),
    "stateDir": ("state_dir", as_path),
    "migStrategy": ("mig_strategy", as_mig_strategy),
    "vendor": ("vendor", as_vendor),
    "amd.resourceNaming": ("amd_naming", as_amd_naming),
    "migMap": ("mig_map", as_text),
    "allocate.deviceSpecs": ("device_specs", as_flag),
    "allocate.cdi": ("cdi", as_cdi),
    "allocate.cdiKind": ("cdi_kind", as_text),
    "allocate.devRoot": ("dev_root", as_text),
    "allocate.allocationDir": ("allocation_dir", as_text),
    "allocate.grantKeyDir": ("grant_key_dir", as_text),
    "allocate.preStartCheck": ("pre_start_check", as_flag),
    "health.ignoreXids": ("ignored_xids", as_xids),
    "health.recoverAfter": ("recover_after", as_recovery),
    "sweep.interval": ("sweep_interval", as_seconds),
    "sweep.grace": ("sweep_grace", as_seconds),
    "labels.enabled": ("labels", as_flag),
    "labels.interval": ("label_interval", as_seconds),
    "labels.runtimeReady": ("runtime_ready", as_path),
    "dra.kubeletRoot": ("kubelet_root", as_path),
    "dra.cdiDir": ("cdi_dir", as_path),
    "dra.sharedGpus": ("shared_gpus", as_gpus),
    "dra.hostRoot": ("host_root", as_path),
    "dra.driverRoot": ("driver_root", as_path),
    "dra.hook": ("hook", as_path),
    "dra.ldconfig": ("ldconfig", as_path),
}


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in FILE_KEYS:
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def parse(text: str, source: str = "config") -> dict[str, Any]:
    """Config fields from a YAML document; ConfigError names the bad key and value."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    version = raw.pop("version", "v1")
    if version != "v1":
        raise ConfigError(f"{source}: version {version!r} is not supported: expected v1")
    fields = {}
    for key, value in _flatten(raw).items():
        if key not in FILE_KEYS:
            known = ", ".join(["version", *FILE_KEYS])
            raise ConfigError(f"{source}: unknown key {key!r}; known keys: {known}")
        name, convert = FILE_KEYS[key]
        try:
            fields[name] = convert(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {key}: {value!r}: {exc}") from None
    return fields


def load(path: str | None, overrides: Mapping[str, Any]) -> Config:
    """Defaults, then the file at `path` (if any), then `overrides` (flags that were given)."""
    fields: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        fields = parse(text, path)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    config = dataclasses.replace(Config(), **fields)
    if config.rename_by_default and config.shared_replicas > 1:
        error = resource_name_error(config.default_resource)
        if error:
            raise ConfigError(f"renameByDefault: {error}")
    _check_sharing(config)
    return config


def _check_sharing(config: Config) -> None:
    """What holds a share must be there: MPS sharing needs the agent's daemons, HAMi-core
    its library, both gpuwire's runtime (not a CDI device); and a GPU is time-sliced or
    shared through MPS, not both (as NVIDIA's)."""
    if config.mps_replicas and config.replicas > 1:
        raise ConfigError(
            "sharing.mps.replicas and sharing.timeSlicing.replicas: a GPU is shared one way; "
            "accepted: one of them"
        )
    if config.mps_replicas and config.mps_root is None:
        raise ConfigError(
            "sharing.mps.replicas needs mps.root: the node agent runs the MPS control daemons "
            "that hold each replica to its share"
        )
    if config.share_limits == "hami" and config.hami_library is None:
        raise ConfigError(
            "sharing.timeSlicing.limits: hami needs hami.library: HAMi-core holds each replica "
            "to its share"
        )
    if config.sharing.limits != "none" and config.cdi != "none":
        raise ConfigError(
            f"allocate.cdi: {config.cdi} with replicas held to their share: containerd applies "
            "a CDI device without gpuwire's runtime, which joins a replica to what holds its "
            "share; accepted: allocate.cdi: none, or replicas without limits"
        )
