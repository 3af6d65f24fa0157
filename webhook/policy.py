"""The cluster's GPU policy: who may ask for what, and the defaults (a YAML file, a ConfigMap).

```yaml
excludedNamespaces: [kube-system]   # pods here pass untouched
devicePlugin: true                  # a numeric gpu-count becomes limits: nvidia.com/gpu
allocation: devicePlugin            # how GPUs are given: devicePlugin | dra | auto
dra:                                # the DRA path (allocation dra, or auto where it fits)
  nvlink: preferred                 # several GPUs on one NVLink island: preferred | required
  gpuResources: claim               # nvidia.com/gpu: N becomes a claim (claim) or stays (keep)
unknownModel: deny                  # deny | allow (admit without the unresolvable constraint)
unknownAnnotations: deny            # deny | warn: a gpuwire.io/ key it does not know, a typo
                                    # (of a HAMi resource name too)
defaults:
  capabilities: compute,utility
  limitProfile: hami                # or a list: [mps, pytorch]
  runtimeClassName: gpuwire         # set on GPU pods that name none
  gpuCount: 1                       # what a GPU container gets when gpu-count is unset
  voidUnrequested: true             # NVIDIA_VISIBLE_DEVICES=void where nothing was asked
namespaces:                         # first match wins; unmatched namespaces may not ask
  - match: [gpu-operator]
    trustVisibleDevices: true       # hand-written NVIDIA_VISIBLE_DEVICES kept (and granted)
    cdiAnnotations: allow           # cdi.k8s.io/* pod annotations kept (strip | deny | allow)
  - match: [media]
    allGpus: true                   # may take every GPU of a node without the device plugin
    explicitDevices: true           # may name GPUs (gpuwire.io/gpu-uuid)
  - match: ["team-*"]
    allocation: dra                 # this namespace's pods get ResourceClaims
    maxGpus: 4
    capabilities: [compute, utility]
  - match: ["*"]
```
With no file: every namespace but kube-system may ask by annotation for GPUs the device
plugin hands out (one unless it says how many), none may take a node's every GPU without
it or name GPUs, no namespace's hand-written NVIDIA_VISIBLE_DEVICES or `cdi.k8s.io/*`
annotations are trusted, and a `gpuwire.io/` annotation it does not know is denied.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from gpuwire import limits, nvidia
from gpuwire.annotations import Count

Allocation = Literal["devicePlugin", "dra", "auto"]
ALLOCATIONS = ("devicePlugin", "dra", "auto")


class PolicyError(ValueError):
    """A policy file that does not say something the webhook can enforce."""


@dataclass(frozen=True)
class Rule:
    match: tuple[str, ...] = ("*",)
    annotations: bool = True  # may ask for GPUs by annotation
    max_gpus: int | Literal["all"] = "all"  # per container
    # May take every GPU of its node without the device plugin (gpu-count: all, which the
    # device plugin does not see), or name GPUs (gpuwire.io/gpu-uuid): only where an admin
    # says so, since either can hand out GPUs the device plugin gives others too.
    all_gpus: bool = False
    explicit_devices: bool = False
    capabilities: tuple[str, ...] = tuple(sorted(nvidia.CAPABILITIES))  # the most it may ask for
    trust_visible_devices: bool = False
    # What becomes of `cdi.k8s.io/*` pod annotations, which name CDI devices for containerd
    # and CRI-O to inject: removed with a warning, the pod denied, or kept.
    cdi_annotations: Literal["strip", "deny", "allow"] = "strip"
    allocation: Allocation | None = None  # None: the policy's

    def matches(self, namespace: str) -> bool:
        return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in self.match)


@dataclass(frozen=True)
class Policy:
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    device_plugin: bool = True
    # How GPU containers get GPUs: the device plugin's resource or named GPUs (today's
    # way), a ResourceClaim the scheduler allocates (DRA), or DRA where the cluster's
    # ResourceSlices can give what is asked and the device-plugin way elsewhere.
    allocation: Allocation = "devicePlugin"
    nvlink: Literal["required", "preferred"] = "preferred"  # several GPUs, on the DRA path
    claim_gpu_resources: bool = True  # nvidia.com/gpu: N becomes a claim on the DRA path
    unknown_model: Literal["deny", "allow"] = "deny"
    # A gpuwire.io/ key it does not know (or a near miss of one of its or HAMi's): most
    # likely a typo that would drop what it asks for, so the pod is denied with "did you
    # mean"; `warn` admits it with the warning (logged and counted) instead.
    unknown_annotations: Literal["deny", "warn"] = "deny"
    capabilities: str = "compute,utility"  # canonical
    limit_profiles: tuple[str, ...] = (limits.DEFAULT_PROFILE,)
    runtime_class: str | None = None
    gpu_count: Count = 1
    void_unrequested: bool = True
    rules: tuple[Rule, ...] = field(default=(Rule(),))
    # namespace → (excluded, rule): a cluster has few namespaces, and every admission asks
    _seen: dict[str, tuple[bool, Rule | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _lookup(self, namespace: str) -> tuple[bool, Rule | None]:
        found = self._seen.get(namespace)
        if found is None:
            excluded = any(fnmatch.fnmatchcase(namespace, p) for p in self.excluded_namespaces)
            rule = next((r for r in self.rules if r.matches(namespace)), None)
            found = self._seen[namespace] = (excluded, rule)
        return found

    def excluded(self, namespace: str) -> bool:
        return self._lookup(namespace)[0]

    def rule(self, namespace: str) -> Rule | None:
        return self._lookup(namespace)[1]

    def allocation_for(self, namespace: str) -> Allocation:
        rule = self.rule(namespace)
        return rule.allocation if rule is not None and rule.allocation else self.allocation


# --- reading the file: each key has one reader, which names the key, the value and what it takes


def _fail(where: str, value: object, accepted: str) -> PolicyError:
    return PolicyError(f"policy {where}: {value!r} is not accepted; accepted: {accepted}")


def _bool(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, value, "true or false")
    return value


def _names(where: str, value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        raise _fail(where, value, "a name or a list of names (shell patterns like team-*)")
    return tuple(items)


def _count(where: str, value: object) -> int | Literal["all"]:
    if value == "all":
        return "all"
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise _fail(where, value, "all or a positive integer")


def _gpu_count(where: str, value: object) -> Count:
    return "none" if value == "none" else _count(where, value)


def _capabilities(where: str, value: object) -> tuple[str, ...]:
    text = ",".join(value) if isinstance(value, list) else value
    if not isinstance(text, str) or not text.strip():
        raise _fail(where, value, f"all or a list of {', '.join(nvidia.CAPABILITIES)}")
    try:
        return nvidia.parse_capabilities(text)
    except nvidia.CapabilityError as exc:
        raise _fail(where, value, f"all or a list of {', '.join(nvidia.CAPABILITIES)}") from exc


def _profiles(where: str, value: object) -> tuple[str, ...]:
    names = _names(where, value)
    if not all(n in limits.PROFILES for n in names):
        raise _fail(where, value, ", ".join(limits.PROFILES))
    return names


def _choice(*options: str) -> Callable[[str, object], str]:
    def read(where: str, value: object) -> str:
        if value not in options:
            raise _fail(where, value, " or ".join(options))
        return str(value)

    return read


def _optional_name(where: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise _fail(where, value, "a RuntimeClass name, or null for none")


Reader = Callable[[str, object], Any]


def _read(where: str, raw: object, readers: Mapping[str, tuple[str, Reader]]) -> dict[str, Any]:
    """`raw` (a mapping) read key by key; unknown keys are errors, so typos do not pass."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail(where or "file", raw, "a mapping")
    unknown = sorted(set(raw) - set(readers))
    if unknown:
        raise PolicyError(
            f"policy {where or 'file'}: unknown key {', '.join(map(str, unknown))}; "
            f"accepted: {', '.join(readers)}"
        )
    prefix = f"{where}." if where else ""
    return {
        attr: read(prefix + key, raw[key]) for key, (attr, read) in readers.items() if key in raw
    }


RULE_KEYS: dict[str, tuple[str, Reader]] = {
    "match": ("match", _names),
    "annotations": ("annotations", _bool),
    "maxGpus": ("max_gpus", _count),
    "allGpus": ("all_gpus", _bool),
    "explicitDevices": ("explicit_devices", _bool),
    "capabilities": ("capabilities", _capabilities),
    "trustVisibleDevices": ("trust_visible_devices", _bool),
    "cdiAnnotations": ("cdi_annotations", _choice("strip", "deny", "allow")),
    "allocation": ("allocation", _choice(*ALLOCATIONS)),
}
DEFAULT_KEYS: dict[str, tuple[str, Reader]] = {
    "capabilities": (
        "capabilities",
        lambda w, v: nvidia.canonical_capabilities(",".join(_capabilities(w, v))),
    ),
    "limitProfile": ("limit_profiles", _profiles),
    "runtimeClassName": ("runtime_class", _optional_name),
    "gpuCount": ("gpu_count", _gpu_count),
    "voidUnrequested": ("void_unrequested", _bool),
}


DRA_KEYS: dict[str, tuple[str, Reader]] = {
    "nvlink": ("nvlink", _choice("required", "preferred")),
    "gpuResources": ("claim_gpu_resources", lambda w, v: _choice("claim", "keep")(w, v) == "claim"),
}


def _rules(where: str, value: object) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise _fail(where, value, "a list of rules (match: …)")
    rules = []
    for i, raw in enumerate(value):
        fields = _read(f"{where}[{i}]", raw, RULE_KEYS)
        if "match" not in fields:
            raise PolicyError(f"policy {where}[{i}]: a rule needs match: (namespace patterns)")
        rules.append(Rule(**fields))
    return tuple(rules)


TOP_KEYS: dict[str, tuple[str, Reader]] = {
    "excludedNamespaces": ("excluded_namespaces", lambda w, v: () if v == [] else _names(w, v)),
    "devicePlugin": ("device_plugin", _bool),
    "allocation": ("allocation", _choice(*ALLOCATIONS)),
    "dra": ("dra", lambda w, v: _read(w, v, DRA_KEYS)),
    "unknownModel": ("unknown_model", _choice("deny", "allow")),
    "unknownAnnotations": ("unknown_annotations", _choice("deny", "warn")),
    "defaults": ("defaults", lambda w, v: _read(w, v, DEFAULT_KEYS)),
    "namespaces": ("rules", _rules),
}


def parse(text: str, source: str = "policy") -> Policy:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not YAML: {exc}") from exc
    fields = _read("", raw, TOP_KEYS)
    defaults = fields.pop("defaults", {})
    dra = fields.pop("dra", {})
    return Policy(**fields, **defaults, **dra)


def load(path: str | Path | None) -> Policy:
    """The policy in `path`, or the built-in default when there is no file."""
    if path is None:
        return Policy()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"policy {path}: {exc.strerror}") from exc
    return parse(text, str(path))
