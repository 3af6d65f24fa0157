"""Node labels and the GPU annotation, computed from what discovery found. Pure.

GPU Feature Discovery's keys (`nvidia.com/...`, reference 2.8) so that existing selectors and
the webhook keep working, plus gpuwire's own normalised ones (`gpuwire.io/gpu.*`): a model
token that node affinity can match exactly (`a100`, `h100`, `rtx-4090`), memory in GiB, and
per-model keys so a node with two models can be selected for either. GFD's keys hold one
model per node; on a mixed node they describe the model with the most GPUs (ties: the model of
the lowest index), so they are a function of the inventory and never flip between runs.
The annotation `gpuwire.io/gpus` lists every GPU (index, uuid, product, memory, NUMA node,
health) for the webhook, which pins explicit-UUID requests to the node that holds them.

MIG (GFD's `internal/lm/mig-strategy.go`, docs "Generated Labels"): `nvidia.com/mig.capable`
always; with the `single` strategy GFD's GPU keys describe the MIG devices
(`gpu.product=<model>-MIG-<profile>`, count, memory, SMs, slices, engines; a node that breaks
the strategy's rules `<model>-MIG-INVALID` with count, replicas and memory 0); with `mixed`,
the same per profile under `nvidia.com/mig-<profile>.`. gpuwire's own
`gpuwire.io/gpu.mig.<profile>` count the MIG devices of each profile whatever the strategy.
The annotation lists each GPU's MIG devices under it (`gpuwire.nodegpus`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

from deviceplugin.gpus.discovery import Gpu, Mig, NodeGpus
from deviceplugin.plugin.migstrategy import Advertised
from deviceplugin.plugin.resources import Resource
from gpuwire import limits, nodegpus, nvidia, requirements
from gpuwire.devices import Device

NV = nvidia.LABEL_PREFIX
GW = "gpuwire.io/"
GPUS_ANNOTATION = nodegpus.ANNOTATION

# Every GFD key this labeler manages: removed from the node when no longer computed.
GFD_KEYS = tuple(
    NV + k
    for k in (
        "gpu.product",
        "gpu.memory",
        "gpu.count",
        "gpu.family",
        "gpu.compute.major",
        "gpu.compute.minor",
        "gpu.replicas",
        "gpu.sharing-strategy",
        "cuda.driver-version.major",
        "cuda.driver-version.minor",
        "cuda.driver-version.revision",
        "cuda.driver-version.full",
        "cuda.runtime-version.major",
        "cuda.runtime-version.minor",
        "cuda.runtime-version.full",
        "mig.capable",
        "mig.strategy",
        "gpu.multiprocessors",
        "gpu.slices.gi",
        "gpu.slices.ci",
        *(f"gpu.engines.{e}" for e in ("copy", "decoder", "encoder", "jpeg", "ofa")),
    )
)
MIG_PREFIX = NV + "mig-"  # GFD's per-profile keys of the mixed strategy
OWN_PREFIX = GW + "gpu."  # every key under it is ours
ENGINES = ("copy", "decoder", "encoder", "jpeg", "ofa")
# The node runs gpuwire's runtime handler: the RuntimeClass `gpuwire` schedules onto it, so no
# GPU pod lands on a node whose containerd cannot run it yet (deploy/base/runtimeclass.yaml).
RUNTIME_READY = GW + "runtime-ready"
OWNED = (*GFD_KEYS, MIG_PREFIX, OWN_PREFIX, limits.LABEL_PREFIX, RUNTIME_READY)  # the labeler's

_BRANDS = {"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon"}


def model_token(product: str) -> str:
    """`NVIDIA A100-SXM4-80GB` → `a100`, `NVIDIA GeForce RTX 4090` → `rtx-4090`, `Tesla T4` → `t4`,
    `AMD Instinct MI300X` → `mi300x`.

    Brand words dropped, then the words up to the first one with a digit, lower case.
    """
    words = [w for w in re.split(r"[\s\-_/]+", product) if w]
    words = [w for w in words if w.lower() not in _BRANDS] or words
    end = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), len(words) - 1)
    token = "-".join(words[: end + 1]).lower()
    return re.sub(r"[^a-z0-9-]", "", token).strip("-")[:40] or "unknown"


def gib(mib: int) -> int:
    """MiB → GiB, rounded: an 80 GB H100 reports 81559 MiB and is an `80`."""
    return round(mib / 1024)


def primary(gpus: Sequence[Gpu]) -> Gpu:
    """The GPU whose model GFD's single-model keys describe."""
    counts = Counter(g.device.product for g in gpus)
    first = sorted(gpus, key=lambda g: g.device.index)
    return max(first, key=lambda g: (counts[g.device.product], -g.device.index))


def _version(prefix: str, version: str, parts: Sequence[str]) -> dict[str, str]:
    out = {f"{prefix}.full": version}
    for name, value in zip(parts, version.split("."), strict=False):
        out[f"{prefix}.{name}"] = value
    return out


def labels(
    node: NodeGpus,
    resources: Sequence[Resource],
    renamed: bool = False,
    mig_strategy: str = "none",
    advertised: Advertised | None = None,
    enforced: Collection[str] = (),
) -> dict[str, str]:
    """The labels a node with these GPUs and resources carries (empty: no GPUs); MIG's as
    the strategy made of the node (`advertised`); the limit profiles this node enforces
    (`gpuwire.io/limits.<profile>`)."""
    if not node.gpus:
        return {}
    top = primary(node.gpus)
    shared = next((r for r in resources if top.device in r.gpus and r.shared), None)
    major, minor = top.compute_capability
    product = nvidia.gfd_product(top.device.product)
    out = {
        NV + "gpu.product": product + ("-SHARED" if shared and not renamed else ""),
        NV + "gpu.memory": str(top.device.memory_mib),
        NV + "gpu.count": str(len(node.gpus)),
        NV + "gpu.family": nvidia.gfd_family(major, minor),
        NV + "gpu.compute.major": str(major),
        NV + "gpu.compute.minor": str(minor),
        NV + "gpu.replicas": str(shared.replicas if shared else 1),
        NV + "gpu.sharing-strategy": _strategy(shared),
        **_version(NV + "cuda.driver-version", node.driver_version, ("major", "minor", "revision")),
        **_version(NV + "cuda.runtime-version", node.cuda_version, ("major", "minor")),
    }
    out.update(own_labels(node.devices, "nvlink"))
    out.update(mig_labels(node, product, resources, mig_strategy, advertised or Advertised()))
    for profile in sorted(enforced):
        out[limits.enforcement_label(profile)] = "true"
    return out


def own_labels(devices: Sequence[Device], links: str) -> dict[str, str]:
    """gpuwire's own keys, the same for every vendor: presence, count, model token, memory
    in GiB, per-model count and memory, and whether the devices have fast peer links
    (`links`: `nvlink` on NVIDIA's, `xgmi` on AMD's)."""
    models = Counter(model_token(d.product) for d in devices)
    out = {
        GW + "gpu.present": "true",
        GW + "gpu.count": str(len(devices)),
        GW + "gpu.model": next(iter(models)) if len(models) == 1 else "mixed",
        GW + "gpu.memory": str(min(gib(d.memory_mib) for d in devices)),
        f"{GW}gpu.{links}": str(any(d.nvlinks for d in devices)).lower(),
    }
    for model, count in sorted(models.items()):
        memory = min(gib(d.memory_mib) for d in devices if model_token(d.product) == model)
        out[f"{GW}gpu.model.{model}"] = str(count)
        out[f"{GW}gpu.model.{model}.memory"] = str(memory)
    return out


def _attributes(prefix: str, m: Mig) -> dict[str, str]:
    """GFD's keys of one kind of MIG device."""
    out = {
        f"{prefix}memory": str(m.device.memory_mib),
        f"{prefix}multiprocessors": str(m.multiprocessors),
        f"{prefix}slices.gi": str(m.device.slices),
        f"{prefix}slices.ci": str(m.ci_slices),
    }
    out.update({f"{prefix}engines.{e}": str(n) for e, n in zip(ENGINES, m.engines, strict=True)})
    return out


def mig_labels(
    node: NodeGpus,
    product: str,
    resources: Sequence[Resource],
    strategy: str,
    advertised: Advertised,
) -> dict[str, str]:
    """MIG's labels; `product` is GFD's product of the node's GPUs."""
    out = {NV + "mig.capable": str(any(g.mig_enabled is not None for g in node.gpus)).lower()}
    for profile, count in sorted(Counter(m.device.profile for m in node.mig).items()):
        out[f"{GW}gpu.mig.{profile.replace('+', '.')}"] = str(count)
    if strategy == "none":
        return out
    out[NV + "mig.strategy"] = strategy
    replicas = {r.name: r.replicas for r in resources}
    if strategy == "single" and advertised.invalid:
        out |= {NV + "gpu.product": f"{product}-MIG-INVALID"}
        out |= {NV + k: "0" for k in ("gpu.count", "gpu.replicas", "gpu.memory")}
    elif strategy == "single" and node.mig:
        out[NV + "gpu.product"] = f"{product}-MIG-{node.mig[0].device.profile}"
        out[NV + "gpu.count"] = str(len(node.mig))
        out.update(_attributes(NV + "gpu.", node.mig[0]))
    elif strategy == "mixed":
        for name, devices in advertised.mig.items():
            uuids = {d.uuid for d in devices}
            kind = next((m for m in node.mig if m.device.uuid in uuids), None)
            if kind is None:
                continue
            prefix = f"{name}."
            out[prefix + "count"] = str(len(devices))
            out[prefix + "product"] = f"{product}-MIG-{kind.device.profile}"
            out[prefix + "replicas"] = str(replicas.get(name, 1))
            out[prefix + "sharing-strategy"] = (
                "time-slicing" if replicas.get(name, 1) > 1 else "none"
            )
            out.update(_attributes(prefix, kind))
    return out


def driver_facts(node: NodeGpus) -> requirements.Facts:
    """What the runtime checks `NVIDIA_REQUIRE_*` against, beyond what procfs says."""
    return requirements.Facts(
        node.driver_version,
        node.cuda_version,
        tuple(
            (
                g.device.uuid,
                f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                nvidia.toolkit_brand(g.brand),
            )
            for g in node.gpus
        ),
    )


def _strategy(shared: Resource | None) -> str:
    if shared is None:
        return "none"
    return "mps" if shared.sharing.limits == "mps" else "time-slicing"


def gpus_annotation(
    node: NodeGpus, resources: Sequence[Resource] = (), unhealthy: Collection[str] = ()
) -> str:
    """`gpuwire.io/gpus` for this node: every GPU, with its health, its MIG devices, and the
    resource (and how many devices of it) it is advertised as, so the webhook can ask for the
    model a pod names; "" for a GPU not advertised whole (its MIG devices are)."""
    unlisted = Resource("", ())
    advertised = {g.uuid: r for r in resources for g in r.gpus}
    return nodegpus.encode(
        nodegpus.described(
            g.device,
            healthy=g.device.uuid not in unhealthy,
            resource=(r := advertised.get(g.device.uuid, unlisted)).name,
            replicas=r.replicas,
            mig=None
            if not g.mig_enabled
            else tuple(
                nodegpus.NodeMig(
                    uuid=m.device.uuid,
                    profile=m.device.profile,
                    gi=m.device.gi,
                    ci=m.device.ci,
                    memory_mib=m.device.memory_mib,
                    healthy=m.device.uuid not in unhealthy,
                )
                for m in node.mig_of(g.device.uuid)
            ),
        )
        for g in node.gpus
    )


def changes(
    current: dict[str, str], wanted: dict[str, str], owned: Collection[str]
) -> dict[str, str | None]:
    """A merge patch for a labels (or annotations) map: what differs, and None for keys we
    own that are no longer wanted. `owned`: exact keys and prefixes ending in '.' or '-'."""

    def ours(key: str) -> bool:
        return key in owned or any(p.endswith((".", "-")) and key.startswith(p) for p in owned)

    patch: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    patch.update({k: None for k in current if ours(k) and k not in wanted})
    return patch
