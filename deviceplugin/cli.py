"""`gpuwire device-plugin serve`, `dra serve`, `node label`, `node advertise`: argparse
shells around `plugin.serve`, `dra.plugin`, `agent.labeler` and `config`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import kubeclient
from deviceplugin import config as settings
from deviceplugin.plugin.resources import resource_name_error
from gpuwire import exits, logs, mig, records
from gpuwire.kfd import KfdError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from deviceplugin.agent import holding


def _typed(
    parse: Callable[[Any], Any], convert: Callable[[str], Any] = str
) -> Callable[[str], Any]:
    """An argparse type from a config parser, so a flag and a file key accept the same."""

    def to_value(text: str) -> Any:
        try:
            return parse(convert(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None

    return to_value


DEFAULTS = settings.Config()


def _default(field: str) -> str:
    """The "(default X)" of a config-backed flag: its argparse default is None, so that a flag
    not given leaves the config file's value, and only the help can say what it is when
    neither sets it."""
    value = getattr(DEFAULTS, field)
    if isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, frozenset):
        text = ",".join(str(v) for v in sorted(value))
    else:
        text = str(value or "none")
    return f"(default {text})"


def _xid_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _number(text: str) -> float | str:
    return text if text == "never" else float(text)


def _add_source_flags(parser: argparse.ArgumentParser) -> None:
    _add_config_flag(parser)
    parser.add_argument("--sim", metavar="DIR", help="use the simulated node under DIR, not NVML")
    _add_vendor_flags(parser)
    parser.add_argument(
        "--resource",
        type=_typed(settings.as_resource),
        help=f"the resource name GPUs get where no rule names them {_default('resource')}",
    )
    parser.add_argument(
        "--replicas",
        type=_typed(settings.as_count, int),
        help=f"time-slicing replicas per GPU {_default('replicas')}",
    )
    parser.add_argument(
        "--rename-by-default",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"advertise shared GPUs as <resource>.shared {_default('rename_by_default')}",
    )
    parser.add_argument(
        "--mig-strategy",
        type=_typed(settings.as_mig_strategy),
        help="NVIDIA's MIG strategy: none (default), single or mixed",
    )
    parser.add_argument(
        "--mig-map",
        type=_typed(settings.as_text),
        metavar="FILE",
        help=f"where the node side learns the MIG devices' names (default {mig.DEFAULT_MAP})",
    )


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file: its settings replace the defaults below, flags replace both",
    )


def _add_vendor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vendor",
        type=_typed(settings.as_vendor),
        help="whose GPUs this node has: nvidia (default; NVML) or amd (sysfs)",
    )
    parser.add_argument(
        "--amd-naming",
        type=_typed(settings.as_amd_naming),
        help="AMD's resource naming: single (default: amd.com/gpu) or mixed (a resource per "
        "partition type, amd.com/cpx_nps4)",
    )


def _add_node_side_flags(parser: argparse.ArgumentParser) -> None:
    """What this node's runtime shares with its agent (the node config says the same), and
    where the agent keeps its state."""
    absolute = _typed(settings.as_path)
    parser.add_argument(
        "--state-dir",
        type=absolute,
        metavar="DIR",
        help=f"where the node agent keeps the GPUs' health across restarts (default "
        f"{settings.STATE_DIR}; the DRA plugin's: its plugin directory)",
    )
    parser.add_argument(
        "--driver-facts",
        type=absolute,
        metavar="FILE",
        help="write what NVML knows for the runtime's NVIDIA_REQUIRE_* checks here "
        "(the node config's driver-facts)",
    )
    parser.add_argument(
        "--mps-root",
        type=absolute,
        metavar="DIR",
        help="run an MPS control daemon per GPU under DIR (the node config's mps-root)",
    )
    parser.add_argument(
        "--hami-library",
        type=absolute,
        metavar="FILE",
        help="HAMi-core's libvgpu.so on this node (the node config's hami-library)",
    )


def _add_plugin_flags(parser: argparse.ArgumentParser, recovered: str) -> None:
    """What the device plugin and the DRA plugin share: how XIDs make a GPU unhealthy (the
    DRA plugin's device taints) and for how long, and the node's labels beside them."""
    parser.add_argument(
        "--ignore-xids",
        dest="ignored_xids",
        type=_typed(settings.as_xids, _xid_list),
        metavar="LIST",
        help=f"XIDs that leave a GPU healthy {_default('ignored_xids')}",
    )
    parser.add_argument(
        "--recover-after",
        type=_typed(settings.as_recovery, _number),
        metavar="SECONDS",
        help=f"quiet seconds after which {recovered}, or never {_default('recover_after')}",
    )
    parser.add_argument(
        "--labels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"also keep this node's GPU labels up to date {_default('labels')}",
    )


def _add_runtime_ready_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime-ready",
        type=_typed(settings.as_path),
        metavar="FILE",
        help="label the node gpuwire.io/runtime-ready=true while FILE (the installer's ready "
        "file) exists: this agent runs with gpuwire's runtime handler, so the node has it; the "
        "RuntimeClass gpuwire schedules GPU pods on the label",
    )


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node",
        dest="node_name",
        metavar="NAME",
        help="Node object to write (default $NODE_NAME, else the hostname)",
    )
    kubeclient.add_kubeconfig_flag(parser)


def _add_holder_flags(parser: argparse.ArgumentParser, host_root: bool = True) -> None:
    """`host_root`: add --host-root (the DRA plugin has its own, the same place)."""
    parser.add_argument(
        "--holders",
        action="store_true",
        help="keep the node's gpuwire.io/holders annotation (who holds which GPU) up to date",
    )
    parser.add_argument(
        "--metrics-port",
        type=_typed(_port, int),
        metavar="PORT",
        help="serve Prometheus metrics (GPUs, health, holders, conflicts) on this port "
        "(default: none served)",
    )
    parser.add_argument(
        "--records-dir",
        default=records.DEFAULT_DIR,
        metavar="DIR",
        help=f"the runtime side's container records (default {records.DEFAULT_DIR})",
    )
    parser.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="the kubelet's pod-resources API (default: the kubelet's own socket)",
    )
    if host_root:
        parser.add_argument(
            "--host-root",
            default="/",
            metavar="DIR",
            help="where the host's files are seen, for runtime state dirs (default /)",
        )
    parser.add_argument(
        "--holders-interval",
        type=_typed(settings.as_seconds, float),
        default=10.0,
        metavar="SECONDS",
        help="how often to read the holders again (default 10)",
    )


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError("expected a port number from 1 to 65535")
    return value


def _holder_settings(args: argparse.Namespace) -> holding.Settings | None:
    """The holders job's settings, or None when neither the annotation nor metrics is asked."""
    if not args.holders and args.metrics_port is None:
        return None
    from deviceplugin.agent import holding

    socket = {"pod_resources": args.pod_resources_socket} if args.pod_resources_socket else {}
    return holding.Settings(
        records_dir=args.records_dir,
        **socket,
        host_root=args.host_root or "/",
        interval=args.holders_interval,
        publish=args.holders,
        metrics_port=args.metrics_port,
    )


def _overrides(args: argparse.Namespace, fields: tuple[str, ...]) -> dict[str, Any]:
    return {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}


def _load(
    parser: argparse.ArgumentParser, args: argparse.Namespace, fields: tuple[str, ...]
) -> settings.Config:
    """The config of file and flags; a bad one, or a --sim directory without a simulated
    node, is exit 3 saying which (before anything starts)."""
    try:
        config = settings.load(args.config, _overrides(args, fields))
    except settings.ConfigError as exc:
        raise exits.CommandError(str(exc)) from None
    if config.sim is not None:
        from deviceplugin import vendors

        vendors.of(config.vendor).check_sim(config.sim)
    return config


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _serve(what: str, run: Callable[[threading.Event], None]) -> int:
    """Run a plugin until SIGTERM or SIGINT; one that cannot (NVML missing, the kubelet's
    directory unwritable, a checkpoint it cannot read) logs why and exits 1 (no cluster to
    talk to: 4, the API server's refusal: 5)."""
    stop = _stop_on_signals()
    try:
        run(stop)
    except Exception as exc:
        logging.getLogger(__name__).error("%s stopped: %s", what, exc)
        return exits.code_of(exc) or exits.NO  # no cluster: 4, as every command says it
    return exits.OK


SERVE_FIELDS = (
    "kubelet_dir",
    "sim",
    "vendor",
    "amd_naming",
    "resource",
    "mig_strategy",
    "mig_map",
    "replicas",
    "fail_requests_greater_than_one",
    "rename_by_default",
    "device_specs",
    "cdi",
    "cdi_kind",
    "dev_root",
    "ignored_xids",
    "recover_after",
    "pre_start_check",
    "allocation_dir",
    "grant_key_dir",
    "sweep_interval",
    "sweep_grace",
    "labels",
    "label_interval",
    "runtime_ready",
    "node_name",
    "kubeconfig",
    "driver_facts",
    "mps_root",
    "hami_library",
    "state_dir",
)


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire device-plugin serve",
        description="Serve the kubelet device plugin API for this node's GPUs.",
    )
    _add_source_flags(parser)
    _add_node_side_flags(parser)
    parser.add_argument(
        "--kubelet-dir", help=f"device plugin directory (default {settings.KUBELET_DIR})"
    )
    parser.add_argument(
        "--fail-requests-greater-than-one",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="refuse a request for more than one shared GPU "
        f"{_default('fail_requests_greater_than_one')}",
    )
    parser.add_argument(
        "--device-specs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"also answer Allocate with DeviceSpecs for /dev/nvidia* {_default('device_specs')}",
    )
    parser.add_argument(
        "--cdi",
        type=_typed(settings.as_cdi),
        help=f"also answer with CDI device names: none, uuid or index {_default('cdi')}",
    )
    parser.add_argument("--cdi-kind", help="CDI kind of those names (default nvidia.com/gpu)")
    parser.add_argument("--dev-root", help="host root of DeviceSpec paths (default: the host root)")
    _add_plugin_flags(parser, recovered="an unhealthy GPU is healthy again")
    _add_runtime_ready_flag(parser)
    parser.add_argument(
        "--pre-start-check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask the kubelet for PreStartContainer; refuse starts on unhealthy GPUs "
        f"{_default('pre_start_check')}",
    )
    parser.add_argument(
        "--allocation-dir",
        help=f"where allocation tokens are written {_default('allocation_dir')}",
    )
    parser.add_argument(
        "--grant-key-dir", help=f"keys that MAC the allocation tokens {_default('grant_key_dir')}"
    )
    seconds = _typed(settings.as_seconds, float)
    parser.add_argument(
        "--sweep-interval", type=seconds, metavar="SECONDS",
        help=f"how often allocation tokens of gone pods are removed {_default('sweep_interval')}",
    )  # fmt: skip
    parser.add_argument(
        "--sweep-grace", type=seconds, metavar="SECONDS",
        help=f"how old an unused token must be to go {_default('sweep_grace')}",
    )  # fmt: skip
    parser.add_argument(
        "--label-interval", type=seconds, metavar="SECONDS",
        help=f"with --labels: how often to look again {_default('label_interval')}",
    )  # fmt: skip
    _add_node_flags(parser)
    _add_holder_flags(parser)
    logs.add_flags(parser)
    args = parser.parse_args(argv)
    logs.from_args("device-plugin", args)
    config = _load(parser, args, SERVE_FIELDS)
    from deviceplugin.plugin import serve

    return _serve(
        "device plugin", lambda stop: serve.run(config, stop, holders=_holder_settings(args))
    )


DRA_FIELDS = (
    "sim",
    "vendor",
    "amd_naming",
    "kubelet_root",
    "cdi_dir",
    "shared_gpus",
    "host_root",
    "driver_root",
    "hook",
    "ldconfig",
    "allocation_dir",
    "grant_key_dir",
    "ignored_xids",
    "recover_after",
    "labels",
    "label_interval",
    "runtime_ready",
    "node_name",
    "kubeconfig",
    "mig_map",
    "mig_strategy",
    "driver_facts",
    "mps_root",
    "hami_library",
    "state_dir",
)


def _gpu_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def dra_serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire dra serve",
        description="Serve the kubelet DRA plugin for this node's GPUs: ResourceSlices, "
        "claims prepared as CDI specs, health as device taints (docs/dra.md).",
    )
    _add_config_flag(parser)
    parser.add_argument("--sim", metavar="DIR", help="use the simulated node under DIR, not NVML")
    _add_vendor_flags(parser)
    path = _typed(settings.as_path)
    parser.add_argument(
        "--kubelet-root",
        type=path,
        help=f"the kubelet's directory (default {settings.KUBELET_ROOT})",
    )
    parser.add_argument(
        "--cdi-dir", type=path, help=f"where claims' CDI specs go {_default('cdi_dir')}"
    )
    parser.add_argument(
        "--shared-gpus",
        type=_typed(settings.as_gpus, _gpu_list),
        metavar="LIST",
        help="GPUs published as shared (consumable capacity): UUIDs or product globs "
        "(default: none, every GPU is published whole)",
    )
    parser.add_argument(
        "--host-root",
        type=path,
        help=f"where the host's / is seen (CDI specs name host paths) {_default('host_root')}",
    )
    parser.add_argument("--driver-root", type=path, help="the driver's files (default: host root)")
    parser.add_argument(
        "--hook",
        type=path,
        help=f"gpuwire-hook as the host runs it (default {settings.DEFAULT_HOOK})",
    )
    parser.add_argument(
        "--ldconfig", type=path, help=f"the host's static ldconfig {_default('ldconfig')}"
    )
    parser.add_argument(
        "--allocation-dir",
        type=path,
        help=f"where claim tokens go, under claims/ (as the node's) {_default('allocation_dir')}",
    )
    parser.add_argument(
        "--grant-key-dir",
        type=path,
        help=f"keys that MAC the claim tokens {_default('grant_key_dir')}",
    )
    parser.add_argument(
        "--mig-map",
        type=_typed(settings.as_text),
        metavar="FILE",
        help=f"where the node side learns the MIG devices' names (default {mig.DEFAULT_MAP})",
    )
    parser.add_argument(
        "--mig-strategy",
        type=_typed(settings.as_mig_strategy),
        help="NVIDIA's MIG strategy the labels follow: none (default), single or mixed",
    )
    _add_plugin_flags(parser, recovered="a tainted GPU is clean again")
    _add_node_side_flags(parser)
    _add_node_flags(parser)
    _add_runtime_ready_flag(parser)
    _add_holder_flags(parser, host_root=False)
    logs.add_flags(parser)
    args = parser.parse_args(argv)
    logs.from_args("dra-plugin", args)
    config = _load(parser, args, DRA_FIELDS)
    from deviceplugin.dra.plugin import DraPlugin

    holders = _holder_settings(args)
    return _serve("DRA plugin", lambda stop: DraPlugin(config, holders=holders).run(stop))


def label(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire node label", description="Write this node's GPU labels and GPU annotation."
    )
    _add_source_flags(parser)
    _add_node_side_flags(parser)
    _add_node_flags(parser)
    _add_runtime_ready_flag(parser)
    parser.add_argument("--watch", action="store_true", help="keep them up to date")
    parser.add_argument(
        "--interval",
        dest="label_interval",
        type=_typed(settings.as_seconds, float),
        metavar="SECONDS",
        help=f"with --watch: how often to look again {_default('label_interval')}",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the labels, write nothing")
    _add_holder_flags(parser)
    logs.add_flags(parser, None, "info with --watch, else warning")
    args = parser.parse_args(argv)
    if args.metrics_port is not None and not args.watch:
        parser.error("--metrics-port needs --watch (an endpoint for a one-off run is gone at once)")
    config = _load(
        parser,
        args,
        (
            "sim",
            "vendor",
            "amd_naming",
            "resource",
            "mig_strategy",
            "mig_map",
            "replicas",
            "rename_by_default",
            "node_name",
            "kubeconfig",
            "label_interval",
            "runtime_ready",
            "driver_facts",
            "mps_root",
            "hami_library",
            "state_dir",
            "ignored_xids",
            "recover_after",
        ),
    )
    args.log_level = args.log_level or ("info" if args.watch else "warning")
    logs.from_args("node-agent", args)
    from deviceplugin import vendors
    from deviceplugin.agent import holding, labeler
    from gpuwire.holders import ANNOTATION

    holder_settings = _holder_settings(args)
    if args.watch and not args.dry_run:
        return _serve("node agent", lambda stop: _watch(config, holder_settings, stop))
    try:
        discovery = vendors.of(config.vendor).discovery(config.sim)
    except Exception as exc:  # NVML: no library (no driver), no GPU, a driver it cannot read
        raise exits.CommandError(
            f"cannot read this node's GPUs through NVML: {exc}; run it on a GPU node with the "
            "NVIDIA driver installed, or on a simulated one (--sim DIR)"
        ) from None

    def unreachable() -> frozenset[str]:
        """Without the plugin's health state: the GPUs the driver no longer reaches."""
        return frozenset(d.uuid for d in node.devices if not discovery.alive(d.uuid))

    try:
        try:
            node = discovery.discover()
        except KfdError as exc:  # AMD's: no amdgpu, no KFD topology
            raise exits.CommandError(f"cannot read this node's AMD GPUs: {exc}") from None
        if config.driver_facts is not None and not args.dry_run:
            from deviceplugin.agent.labels import driver_facts
            from gpuwire import requirements

            requirements.write_facts(config.driver_facts, driver_facts(node))
        if args.dry_run:
            wanted = labeler.wanted(config, node) | labeler.node_annotations(config, node)
            print(json.dumps(wanted, indent=2, sort_keys=True))
            return 0
        name = labeler.node_name(config.node_name)
        api = labeler.core_api(config.kubeconfig)
        with kubeclient.talking(api):
            patch = labeler.label_once(api, name, config, node, unreachable())
            print(f"node {name}: " + ("labels up to date" if patch is None else json.dumps(patch)))
            if holder_settings is not None:
                node_agent = holding.of_node(holder_settings, name, lambda: node, unreachable, api)
                held = node_agent.step(time.time()).holders.holders
                print(f"node {name}: {ANNOTATION}: {len(held)} container(s) hold GPUs")
        return 0
    finally:
        discovery.close()


def unlabel(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire node unlabel",
        description="Remove every label and annotation gpuwire's node agent writes from a node "
        "(uninstall).",
    )
    _add_node_flags(parser)
    args = parser.parse_args(argv)
    from deviceplugin.agent import labeler

    name = labeler.node_name(args.node_name)
    api = labeler.core_api(args.kubeconfig)
    with kubeclient.talking(api):
        patch = labeler.unlabel(api, name)
    print(f"node {name}: " + ("no gpuwire labels" if patch is None else json.dumps(patch)))
    return 0


def _watch(
    config: settings.Config, holders: holding.Settings | None, stop: threading.Event
) -> None:
    """The node agent with no plugin (plugin-less): labels, health, holders, MPS daemons."""
    import dataclasses

    from deviceplugin import vendors
    from deviceplugin.agent.node import NodeAgent

    labelled = dataclasses.replace(config, labels=True)
    discovery = vendors.of(config.vendor).discovery(config.sim)
    agent = NodeAgent(labelled, discovery, config.node_state(), holders=holders)
    agent.run(stop, _until, plugin=False)


def _until(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        pass


def advertise(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire node advertise",
        description="Patch an extended resource's capacity into a node's status "
        "(for clusters that do not run the device plugin).",
    )
    parser.add_argument(
        "--resource", default="nvidia.com/gpu",
        help="the extended resource to advertise (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--count", type=int, required=True, help="how many of it the node has")
    _add_node_flags(parser)
    args = parser.parse_args(argv)
    error = resource_name_error(args.resource)
    if error:
        parser.exit(2, f"{parser.prog}: --resource {error}\n")
    if args.count < 0:
        parser.exit(2, f"{parser.prog}: --count {args.count}: expected 0 or more\n")
    from deviceplugin.agent import labeler

    name = labeler.node_name(args.node_name)
    api = labeler.core_api(args.kubeconfig)
    with kubeclient.talking(api):
        ops = labeler.advertise(api, name, args.resource, args.count)
    status = "already advertised" if ops is None else json.dumps(ops)
    print(f"node {name}: {args.resource}={args.count}: {status}")
    return 0
