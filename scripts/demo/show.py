"""The demo's printing: the node, each scenario as a short story, the summary, the commands.

Functions take what the cluster and the scenarios returned and give lines of text, at most
`WIDTH` columns; `Style` adds colour only when asked to (a terminal, NO_COLOR unset).
"""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deviceplugin.agent.labels import GPUS_ANNOTATION
from gpuwire import grant
from gpuwire.devices import Device
from gpuwire.dra import DRIVER
from gpuwire.holders import ANNOTATION
from scripts.demo.amd import NODE as AMD_NODE
from scripts.demo.amd import RESOURCE as AMD_RESOURCE
from scripts.demo.amd import AmdNode
from scripts.demo.base import BIN, ROOT, Step
from scripts.demo.cluster import NODE, RESOURCE, Cluster
from scripts.demo.dra import NODE as DRA_NODE
from scripts.demo.dra import DraNode
from scripts.demo.holders import Inventory
from scripts.demo.kubelet import Allocation, Started
from scripts.demo.scenarios import Outcome, Scenario, Verdict, capabilities, variables

WIDTH = 100
LABEL = 12  # the left column
# GPU UUIDs and allocation tokens, shortened to their first 8 digits
_LONG_IDS = re.compile(
    r"\b(GPU-[0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b([0-9a-f]{8})[0-9a-f]{24}\b"
)


@dataclass(frozen=True)
class Style:
    colour: bool

    def _sgr(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def title(self, text: str) -> str:
        return self._sgr("1", text)

    def dim(self, text: str) -> str:
        return self._sgr("2", text)

    def mark(self, ok: bool | None) -> str:
        if ok is None:
            return self._sgr("33", "-")
        return self._sgr("32", "✓") if ok else self._sgr("31", "✗")


def rows(label: str, values: Iterable[str], paint: Callable[[str], str] = str) -> list[str]:
    """`label` in the left column and `values` beside it, one per line, long ones wrapped;
    `paint` styles each line's text."""
    out = []
    for value in values:
        wrapped = textwrap.wrap(brief(value), WIDTH - 2 - LABEL, subsequent_indent="  ",
                                break_on_hyphens=False)  # fmt: skip
        for part in wrapped:
            out.append(f"  {label:<{LABEL}}{paint(part)}")
            label = ""
    return out


def keyed(key: str, values: Sequence[str]) -> list[str]:
    """`key first value`, the others aligned under the first."""
    pad = " " * (len(key) + 1)
    return [f"{key} {values[0]}", *(pad + v for v in values[1:])] if values else []


def brief(text: str) -> str:
    """Long ids cut short: the lines stay readable, the ids still tell apart."""
    return _LONG_IDS.sub(lambda m: (m[1] or m[2]) + "…", text)


def _gpu(devices: Sequence[Device], device_id: str) -> str:
    return next((f"GPU {d.index}" for d in devices if d.uuid == device_id), device_id)


# --- the node


def node(cluster: Cluster, style: Style) -> list[str]:
    devices = cluster.devices
    pairs = sorted({tuple(sorted((d.index, peer))) for d in devices for peer, _ in d.nvlinks})
    meta: dict[str, Any] = cluster.node()["metadata"]
    written = [
        f"{key}={meta['labels'][key]}"
        for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "gpuwire.io/gpu.model")
    ]
    allocatable = cluster.node()["status"]["allocatable"][RESOURCE]
    lines = [style.title("The cluster"), ""]
    lines += rows(
        NODE,
        [
            f"{len(devices)} × {devices[0].product}, NVLink between "
            + " and ".join(f"{a}-{b}" for a, b in pairs),
        ],
    )
    lines += rows(
        "", ["a simulated node: /dev/nvidia*, procfs, driver files, nvidia-smi"], style.dim
    )
    lines += rows("API server", [f"stand-in at {cluster.api.url}: the Node, RuntimeClass gpuwire"])
    lines += rows(
        "plugin",
        [
            f"registered {RESOURCE} with the kubelet stand-in: {allocatable} allocatable",
            *keyed("labelled the node", written),
            f"annotated it: {GPUS_ANNOTATION} (each GPU's index, UUID, memory, health)",
        ],
    )
    lines += rows(
        "webhook",
        [f"{cluster.webhook_url}, TLS from a fresh CA, policy examples/policy.yaml"],
    )
    files = [f"$DEMO = {cluster.workdir}"]
    if cluster.containerd is None:
        lines += rows("containerd", [f"not started: {cluster.no_containers}"], style.dim)
    else:
        handler = cluster.handlers[cluster.default_handler]
        lines += rows(
            "containerd",
            [
                f"{cluster.containerd.generation.describe()}, private; the kubelet",
                "stand-in runs pods through its CRI plugin (RunPodSandbox, CreateContainer)",
                "configured by `gpuwire containerd configure --set-default`:",
                f"handler {handler.name!r} runs {handler.binary}",
                "and is the default runtime, as nvidia's often is on GPU nodes",
            ],
        )
        files.append(f"$CTD = {cluster.containerd.home}")
    return lines + rows("files", files) + rows("", ["removed when the demo ends"], style.dim)


# --- a scenario


def _env(name: str, value: str) -> str:
    return f"{name}={value[: value.index(':') + 5]}…" if name == grant.ENV else f"{name}={value}"


def patch_lines(pod: Mapping[str, Any], op: Mapping[str, Any]) -> list[str]:
    """One JSONPatch operation in words."""
    path, value = op["path"], op.get("value")
    if "/env" in path:  # /spec/<containers>/<i>/env[/<j> or /-]
        parts = path.split("/")
        container = pod["spec"][parts[2]][int(parts[3])]
        if op["op"] == "remove":
            return [f"- env {container['name']}: {container['env'][int(parts[-1])]['name']}"]
        mark = "~" if op["op"] == "replace" else "+"
        entries: list[Any] = value if isinstance(value, list) else [value]
        name = container["name"]
        return [f"{mark} env {name}: {_env(e['name'], e['value'])}" for e in entries]
    return [f"+ {path.removeprefix('/spec/')}: {json.dumps(value)}"]


def allocation_lines(allocation: Allocation, devices: Sequence[Device]) -> list[str]:
    """The kubelet's calls to the device plugin, and what came back."""
    lines = []
    if allocation.preferred:
        asked = f"{allocation.resource}: {len(allocation.devices)}"
        chosen = [d for d in devices if d.uuid in allocation.preferred]
        indices = {d.index for d in chosen}
        links = sum(n for d in chosen for peer, n in d.nvlinks if peer in indices) // 2
        joined = f", joined by {links} NVLinks" if links else ""
        if links and allocation.resource != RESOURCE:  # AMD's: XGMI peers
            joined = ", of one XGMI hive"
        preferred = ", ".join(f"GPU {d.index}" for d in chosen)
        lines.append(f"GetPreferredAllocation({asked}) → {preferred}{joined}")
    gpus = ", ".join(_gpu(devices, d) for d in allocation.devices)
    lines.append(f"Allocate({gpus}) →")
    lines += [f"  env {k}={v}" for k, v in allocation.envs.items()]
    lines += [
        f"  mount the allocation token {m.source.name}, read-only, at {m.destination}"
        for m in allocation.mounts
    ]
    return lines


def container_lines(started: Started, devices: Sequence[Device], style: Style) -> list[str]:
    kubelet = [line for a in started.allocations for line in allocation_lines(a, devices)]
    if started.cdi_ids:
        kubelet += keyed("NodePrepareResources → CDI", list(started.cdi_ids))
    if started.handler is not None:
        kubelet.append(f"runtime handler {started.handler.name!r}: {started.handler.binary}")
    lines = rows("kubelet", kubelet)
    if started.runtime_log:
        lines += rows("runtime", started.runtime_log)
    elif started.handler is not None:
        lines += rows("runtime", ["nothing to decide: the container asks for no GPU"], style.dim)
    seen = started.seen
    if seen is None:
        return lines + rows("container", [started.error or "did not run"], style.dim)
    if "dri" in seen:  # an AMD container (testbed.view's AMD_VIEW_SCRIPT)
        kfd = "opened: allowed" if "open /dev/kfd" in seen else "absent"
        amd_lines = [*keyed("/dev/dri:", seen["dri"]), f"/dev/kfd: {kfd}",
                     f"env: AMD_VISIBLE_DEVICES={seen['env'][0]}"]  # fmt: skip
        return lines + rows("container", amd_lines)
    env = [_env(k, v) for k, v in variables(seen).items()]
    caps = ", ".join(capabilities(seen)) or "none"
    seen_lines = [
        *keyed("/dev:", seen["devices"]),
        *keyed("nvidia-smi -L:", seen.get("smi", [])),
        *keyed("env:", env or ["(no GPU variables)"]),
        f"driver libraries: {caps}",
    ]
    return lines + rows("container", seen_lines)


def scenario(
    number: int, item: Scenario, outcome: Outcome, devices: Sequence[Device], style: Style
) -> list[str]:
    admission = outcome.admission
    pod = admission.pod
    where = f"{admission.namespace}/{pod['metadata']['name']}"
    lines = ["", style.title(f"{number}. {item.title}")]
    lines += rows("", [f"{item.pod.relative_to(ROOT)}: pod {where}"], style.dim)
    lines += rows("asks", [f"{k}: {v}" for k, v in admission.asked.items()] or ["nothing"])
    if not admission.allowed:
        return lines + rows("webhook", [f"denied ({admission.code}): {admission.message}"])
    changes = [line for op in admission.patch for line in patch_lines(pod, op)]
    lines += rows("webhook", changes or ["admitted, unchanged"])
    lines += rows("", [f"warning: {w}" for w in admission.warnings], style.dim)
    lines += rows("", _templates(admission.patch), style.dim)
    claims = [claim_line(c, devices) for c in outcome.claims]
    if outcome.pending:
        return lines + rows("scheduler", [*claims, f"Pending: {outcome.pending}"])
    assert outcome.pod is not None
    lines += rows("scheduler", [*claims, f"bound to {outcome.pod['spec']['nodeName']}"])
    for started in outcome.containers:
        lines += container_lines(started, devices, style)
    return lines


def _templates(patch: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ResourceClaimTemplates the pod's claim entries name (the webhook made them)."""
    entries = []
    for op in patch:
        if op["path"].startswith("/spec/resourceClaims"):
            value = op["value"]
            entries += value if isinstance(value, list) else [value]
    return [
        f"ResourceClaimTemplate {e['resourceClaimTemplateName']} made at admission "
        "(pods asking alike share it)"
        for e in entries
    ]


def claim_line(claim: Mapping[str, Any], devices: Sequence[Device]) -> str:
    """A claim as the resourceclaim controller made it and the scheduler allocated it."""
    name = claim["metadata"]["name"]
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return f"claim {name}: not allocated"
    parts = []
    for r in allocation["devices"]["results"]:
        part = f"{r['pool']}/{r['device']}"
        consumed = r.get("consumedCapacity") or {}
        if consumed:
            part += " (" + ", ".join(f"{k} {v}" for k, v in sorted(consumed.items())) + ")"
        parts.append(part)
    return f"claim {name}: allocated {', '.join(parts)}"


# --- the DRA node


def dra_node(node: DraNode, style: Style) -> list[str]:
    devices = node.devices
    pairs = sorted({tuple(sorted((d.index, peer))) for d in devices for peer, _ in d.nvlinks})
    lines = ["", style.title("A second node joins: its GPUs published for DRA"), ""]
    lines += rows(
        "node",
        [
            f"{DRA_NODE}: {len(devices)} × {devices[0].product}, NVLink between "
            + " and ".join(f"{a}-{b}" for a, b in pairs),
            f"GPU {node.shared.index} shared: its memory and cores handed out in shares",
        ],
    )
    lines += rows(
        "DRA plugin",
        [
            "`gpuwire dra serve`, registered with the kubelet DRA stand-in; published the GPUs",
            f"as ResourceSlices of driver {DRIVER}; HAMi-core holds the shares",
            "DeviceClasses gpu, shared.gpu and mig.gpu.gpuwire.io in the API server",
        ],
    )
    lines += rows("webhook", ["its watch has the slices; namespace ml-dra goes the DRA way "
                              "(examples/policy.yaml: allocation: dra)"])  # fmt: skip
    if node.containerd is None:
        return lines + rows("containerd", [f"not started: {node.no_containers}"], style.dim)
    return lines + rows(
        "containerd",
        [
            f"{node.containerd.generation.describe()}, private, CDI from CRI on",
            "(`gpuwire containerd configure --cdi`: the DRA pods' RuntimeClass names gpuwire's",
            "handler, runc stays the default); claims' CDI specs in",
            f"$DRA_CTD/cdi, $DRA_CTD = {node.containerd.home}",
        ],
    )


def amd_node(node: AmdNode, style: Style) -> list[str]:
    devices = node.devices
    hives = sorted({tuple(sorted((d.index, peer))) for d in devices for peer, _ in d.nvlinks})
    lines = ["", style.title("A third node joins: AMD GPUs, the same annotations"), ""]
    lines += rows(
        "node",
        [
            f"{AMD_NODE}: {len(devices)} × {devices[0].product} (SPX, NPS1), XGMI hives "
            + " and ".join(f"{a}-{b}" for a, b in hives),
            "a simulated node: KFD topology, DRM and amdgpu's sysfs, /dev/kfd, /dev/dri/*",
        ],
    )
    lines += rows(
        "plugin",
        [
            f"`gpuwire device-plugin serve --vendor amd`: registered {AMD_RESOURCE} with its",
            "kubelet stand-in; labelled the node with AMD's labeller's keys and",
            f"annotated it: {GPUS_ANNOTATION}; the webhook's watch reads it as an AMD node",
        ],
    )
    if node.containerd is None:
        return lines + rows("containerd", ["not started: no containers run here"], style.dim)
    return lines + rows(
        "containerd",
        [
            f"{node.containerd.generation.describe()}, private, gpuwire's handler the default,",
            'started with the node\'s gpuwire config (vendor = "amd"),',
            f"$AMD_CTD = {node.containerd.home}",
        ],
    )


# --- the end


def inventory(number: int, taken: Inventory, cluster: Cluster, style: Style) -> list[str]:
    """The node agent's holders, then `gpuwire inventory` as it printed."""
    index = {d.uuid: d.index for d in cluster.devices}
    published = taken.published.holders
    width = max((len(h.name) for h in published), default=0)
    agent = []
    for h in published:
        gpus = ", ".join(str(i) for i in sorted(index[u] for u in h.gpus))
        agent.append(f"{h.name:<{width}}  {h.path:<11}  GPU {gpus}" + (" (all)" * h.whole_node))
    lines = ["", style.title(f"{number}. Who holds which GPU: gpuwire inventory")]
    lines += rows("agent", [f"the plugin's holders job published {ANNOTATION} on {NODE}:"])
    lines += rows("", agent or ["(no holders)"])
    if taken.conflicts:
        why = (
            "The scheduler counts only the device plugin's GPUs: a pod granted every GPU by "
            "annotation shares them, unseen, with the pods the plugin placed. The inventory "
            "flags it."
        )
        lines += rows("", [why], style.dim)
    if taken.dra_expected:
        lines += rows("claims", [f"on {DRA_NODE} the holders are its ResourceClaims' "
                                 "allocations, and the pods they are reserved for"])  # fmt: skip
    lines += ["", f"  $ {' '.join(command(taken.step.argv, _places(cluster))).strip()}"]
    return lines + [f"  {line}" for line in taken.table.rstrip().splitlines()]


def summary(
    results: Sequence[tuple[str, str, Verdict]],
    cluster: Cluster,
    style: Style,
    node: DraNode | None = None,
) -> list[str]:
    """One line per scenario (name, what it should show, what it showed, ✓ ✗ or - for not
    checked), then the count."""
    key = max(len(k) for k, _, _ in results)
    expected = max(len(e) for _, e, _ in results)
    room = WIDTH - 2 - key - 2 - expected - 2
    lines = ["", style.title("Summary"), ""]
    lines.append(style.dim(f"  {'scenario':<{key}}  {'expected':<{expected}}  seen"))
    for name, wanted, verdict in results:
        seen = textwrap.wrap(brief(verdict.seen), room, break_on_hyphens=False) or [""]
        lines.append(f"{style.mark(verdict.ok)} {name:<{key}}  {wanted:<{expected}}  {seen[0]}")
        lines += [" " * (WIDTH - room) + part for part in seen[1:]]
    good = sum(v.ok is True for _, _, v in results)
    unchecked = sum(v.ok is None for _, _, v in results)
    tail = [f"{good} of {len(results)} as expected"]
    if unchecked:
        tail += [f"{unchecked} not checked: no containers ran ({cluster.no_containers})"]
    if cluster.containerd is not None:
        ran = cluster.containerd.generation.describe()
        tail += [f"pods ran on {ran}, through its CRI plugin"]
    if node is not None and node.containerd is not None:
        ran = node.containerd.generation.describe()
        tail += textwrap.wrap(f"DRA pods ran on {ran}, through its CRI plugin with CDI", WIDTH)
    return [*lines, "", *tail]


def command(argv: Sequence[str], places: Mapping[str, str]) -> list[str]:
    """A shell command line, its paths named, wrapped with backslashes between arguments
    (a flag stays with its value)."""
    words: list[str] = []
    for word in argv:
        for path, name in places.items():
            word = word.replace(path, name)
        quoted = word if "$" in word else shlex.quote(word)  # $DEMO stays a variable
        flag = words[-1] if words else ""
        if flag.startswith("-") and " " not in flag and not word.startswith("-"):
            words[-1] += " " + quoted
        else:
            words.append(quoted)
    lines = [f"  {words[0]}"]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) > WIDTH - 2:
            lines[-1] += " \\"
            lines.append(f"      {word}")
        else:
            lines[-1] += f" {word}"
    return lines


def _places(cluster: Cluster) -> dict[str, str]:
    """Paths as the by-hand commands name them."""
    places = {f"{BIN}/": "", str(cluster.workdir): "$DEMO"}
    if cluster.containerd is not None:
        places[str(cluster.containerd.home)] = "$CTD"
    places |= cluster.places
    places[f"{ROOT}/"] = ""
    return places


def by_hand(cluster: Cluster, more: Sequence[Step], style: Style) -> list[str]:
    """The commands the demo ran (`more`: those the scenes ran), and one to check a pod
    offline."""
    lines = ["", style.title("By hand"), ""]
    lines += ["  The commands the demo ran, from the top of the repository ($DEMO: see above)"]
    offline = Step(
        "the H100 pod against examples/nodes.yaml, a cluster that has H100s, offline",
        ("gpuwire", "mutate", "scripts/demo/pods/h100.yaml",
         "--policy", "examples/policy.yaml", "--nodes", "examples/nodes.yaml"),
    )  # fmt: skip
    for step in [*cluster.steps, *more, offline]:
        lines += ["", style.dim(f"  # {step.what}"), *command(step.argv, _places(cluster))]
    return lines
