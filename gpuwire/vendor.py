"""The vendor interface: what a GPU vendor's module set gives every component, in one place.

A vendor is a set of sibling modules (NVIDIA: `nvidia`, `driver`, `edits`, `cdi`, `mig`,
`requirements`; AMD: `amd`, `kfd`, `amdedits`) and one `Vendor` that the components go
through, so that nothing else asks which vendor it has. What a vendor provides:

- names: the extended resource, the label prefix, the CDI kind, the env that names a
  container's GPUs and the one for driver capabilities (AMD has none), all request env;
  `baked`: whether images set that env themselves, so that the webhook voids it in a
  container that asked for no GPU even in a cluster without the vendor's nodes;
- `limits`: whether a GPU of it can be shared under an enforced limit profile (MPS and
  HAMi-core are CUDA's: AMD's cannot, a container gets its GPUs whole);
- visibility semantics: `visible_request` (a container's env → `devices.Request`), `select`
  (a request against what discovery found → `Selection`), `capabilities`;
- discovery: `discover(roots, capabilities)` (NVIDIA: procfs and the driver's files, no
  NVML; AMD: KFD's topology and DRM in sysfs) → the found node, whose `devices` are the
  contract's `Device`s and `mig` its MIG devices (none on AMD: a partition is a device);
- edits: `container_edits` (device nodes per GPU or partition, the driver's files per
  capability: none on AMD, ROCm's user space lives in the image) and `cdi_spec`;
- `grant_tag`: what a grant for this vendor's env is signed under, so that one vendor's grant
  never verifies as the other's;
- node labels (its own labeller's: NVIDIA's GPU Feature Discovery, AMD's node labeller):
  `product_label` and `label_product` (how it spells a product there), `memory_label`,
  `label_memory` and `memory_requirement` (how node affinity asks for a memory floor there),
  `labelled_memory` and `labelled_count` (what its labels say of a node's GPUs), which the
  webhook's fleet and placement read.

A node runs one vendor (its config's `vendor`); the webhook learns each node's from its
labels and `gpuwire.io/gpus`. The modules are imported when first used: a start imports only
its own vendor's. On the container-start path: no `typing`, `dataclasses` or `re`.
"""

from __future__ import annotations

from gpuwire import amd, devices, nvidia

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from gpuwire.devices import Device, Request, Selection
    from gpuwire.driver import Driver
    from gpuwire.edits import Edits, Layout
    from gpuwire.kfd import AmdNode
    from gpuwire.roots import Roots

    Found = Driver | AmdNode


class VendorError(ValueError):
    """A vendor's discovery or selection that cannot give a container its GPUs."""


class Vendor:
    """One vendor; `NVIDIA` and `AMD` are its two instances, compared by identity."""

    __slots__ = ()
    name: str
    resource: str
    label_prefix: str
    cdi_kind: str
    visible_env: str
    capabilities_env: str | None  # None: the vendor has no driver capabilities
    request_env: tuple[str, ...]  # every env a container's request is read from
    grant_tag: str
    baked: bool  # whether images set `visible_env` themselves (`=all`)
    files: bool  # whether containers get driver files (libraries, binaries) laid out per image
    limits: bool  # whether enforced limit profiles (MPS, HAMi-core) can share its GPUs
    product_label: str  # the node label its labeller names a node's GPU model by
    control_nodes: tuple[str, ...]  # names under /dev every GPU container of it gets

    def gpu_node_names(self, device: Device) -> tuple[str, ...]:
        """A GPU's or partition's own device nodes, as names under /dev."""
        raise NotImplementedError

    memory_label: str  # its labeller's node label of a node's GPU memory

    def label_product(self, name: str) -> str:
        """A product name as `product_label`'s value spells it."""
        raise NotImplementedError

    def label_memory(self, mib: int) -> str:
        """A size in MiB as `memory_label`'s value spells it (what `labelled_memory` reads)."""
        raise NotImplementedError

    def memory_requirement(self, least_mib: int, labelled: Iterable[int]) -> dict[str, Any]:
        """A node selector requirement admitting the nodes whose `memory_label` says at least
        `least_mib`; `labelled`: the sizes (MiB) that label says on the cluster's nodes."""
        raise NotImplementedError

    def labelled_memory(self, labels: Mapping[str, str]) -> int | None:
        """A node's GPU memory in MiB as its labeller's labels say it; None: they do not."""
        raise NotImplementedError

    def labelled_count(self, labels: Mapping[str, str]) -> int | None:
        """How many GPUs a node has as its labeller's labels say it; None: they do not."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<vendor {self.name}>"

    def visible_request(self, env: Mapping[str, str]) -> Request:
        raise NotImplementedError

    def capabilities(self, value: str | None) -> tuple[str, ...]:
        """The driver capabilities a request's value selects (nvidia.CapabilityError)."""
        raise NotImplementedError

    def canonical_capabilities(self, value: str | None) -> str:
        """The form a grant signs."""
        raise NotImplementedError

    def discover(self, roots: Roots, capabilities: tuple[str, ...]) -> Found:
        """What this node has (VendorError: no driver, an unreadable one)."""
        raise NotImplementedError

    def select(self, request: Request, found: Found, mig_map: str = "") -> Selection:
        """The devices `request` names (devices.UnknownDevice: one this node lacks);
        `mig_map`: where NVIDIA's node agent names MIG devices."""
        raise NotImplementedError

    def unchecked(
        self, env: Mapping[str, str], found: Found, chosen: tuple[Device, ...], facts: str
    ) -> list[str]:
        """What the image requires of the driver (NVIDIA_REQUIRE_*) that this node could
        not check (requirements.RequirementError: what does not hold); `facts`: the node
        agent's driver facts."""
        raise NotImplementedError

    def container_edits(
        self,
        found: Found,
        selection: Selection,
        capabilities: tuple[str, ...],
        layout: Layout,
        mig_controls: tuple[str, ...] = (),
        cards: bool = False,
    ) -> Edits:
        raise NotImplementedError

    def cdi_spec(
        self,
        found: Found,
        hook: str,
        ldconfig: str,
        capabilities: tuple[str, ...],
        kind: str,
        cards: bool = False,
        mig_map: str = "",
    ) -> dict[str, Any]:
        """The CDI spec for every device found (`cards`: AMD's card nodes too; `mig_map`:
        where NVIDIA's node agent names MIG devices)."""
        raise NotImplementedError


class _Nvidia(Vendor):
    __slots__ = ()
    name = nvidia.VENDOR
    resource = nvidia.RESOURCE
    label_prefix = nvidia.LABEL_PREFIX
    cdi_kind = nvidia.CDI_KIND
    visible_env = nvidia.VISIBLE_DEVICES_ENV
    capabilities_env = nvidia.CAPABILITIES_ENV
    request_env = (
        nvidia.VISIBLE_DEVICES_ENV,
        nvidia.CAPABILITIES_ENV,
        *nvidia.MIG_CONTROL_ENV.values(),
    )
    grant_tag = "gpuwire-grant-v1"
    baked = True  # NVIDIA's CUDA images: NVIDIA_VISIBLE_DEVICES=all (NVIDIA/gpu-operator#421)
    files = True
    limits = True
    product_label = nvidia.LABEL_PREFIX + "gpu.product"
    control_nodes = tuple(
        name for name, _, _ in (nvidia.CTL_NODE, *nvidia.UVM_NODES, nvidia.MODESET_NODE)
    )

    def gpu_node_names(self, device: Device) -> tuple[str, ...]:
        return (f"nvidia{device.minor}",)

    memory_label = nvidia.LABEL_PREFIX + "gpu.memory"

    def label_product(self, name: str) -> str:
        return nvidia.gfd_product(name)

    def label_memory(self, mib: int) -> str:
        return str(mib)

    def memory_requirement(self, least_mib: int, labelled: Iterable[int]) -> dict[str, Any]:
        """GFD's label is MiB, a number: Gt."""
        return {"key": self.memory_label, "operator": "Gt", "values": [str(least_mib - 1)]}

    def labelled_memory(self, labels: Mapping[str, str]) -> int | None:
        return _int(labels.get(self.memory_label))

    def labelled_count(self, labels: Mapping[str, str]) -> int | None:
        return _int(labels.get(nvidia.LABEL_PREFIX + "gpu.count"))

    def visible_request(self, env: Mapping[str, str]) -> Request:
        """NVIDIA_VISIBLE_DEVICES, or for a legacy CUDA image that does not set it, every GPU
        (as NVIDIA's toolkit: `CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` not)."""
        from gpuwire import requirements

        visible = env.get(nvidia.VISIBLE_DEVICES_ENV)
        if visible is None and requirements.is_legacy(env):
            return devices.Request(devices.Kind.ALL)
        return devices.parse_request(visible)

    def capabilities(self, value: str | None) -> tuple[str, ...]:
        return nvidia.parse_capabilities(value)

    def canonical_capabilities(self, value: str | None) -> str:
        return nvidia.canonical_capabilities(value)

    def discover(self, roots: Roots, capabilities: tuple[str, ...]) -> Found:
        from gpuwire.driver import DiscoveryError, discover

        try:
            return discover(roots, capabilities)
        except DiscoveryError as exc:
            raise VendorError(str(exc)) from None

    def select(self, request: Request, found: Found, mig_map: str = "") -> Selection:
        from gpuwire.driver import Driver

        assert isinstance(found, Driver)
        problem = ""
        if found.mig and mig_map and any(devices.is_mig_entry(e) for e in request.entries):
            from gpuwire import mig  # procfs does not name MIG devices: the node agent's map

            try:
                found.mig = mig.identify(found.mig, mig.read_map(mig_map))
            except mig.MigError as exc:
                problem = f" ({exc})"
        try:
            return devices.select(request, found.devices, found.mig)
        except devices.UnknownDevice as exc:
            raise devices.UnknownDevice(f"{exc}{problem}") from None

    def unchecked(
        self, env: Mapping[str, str], found: Found, chosen: tuple[Device, ...], facts: str
    ) -> list[str]:
        from gpuwire import requirements

        if not requirements.requirements(env):  # the facts file only where something needs it
            return []
        known = requirements.read_facts(facts, found.version)
        return requirements.check(env, found.version, known, chosen)

    def container_edits(
        self,
        found: Found,
        selection: Selection,
        capabilities: tuple[str, ...],
        layout: Layout,
        mig_controls: tuple[str, ...] = (),
        cards: bool = False,
    ) -> Edits:
        from gpuwire.driver import Driver
        from gpuwire.edits import container_edits

        assert isinstance(found, Driver)
        return container_edits(
            found, selection.gpus, capabilities, layout, selection.mig, mig_controls
        )

    def cdi_spec(
        self,
        found: Found,
        hook: str,
        ldconfig: str,
        capabilities: tuple[str, ...],
        kind: str,
        cards: bool = False,
        mig_map: str = "",
    ) -> dict[str, Any]:
        from gpuwire import cdi, mig
        from gpuwire.driver import Driver

        assert isinstance(found, Driver)
        if found.mig and mig_map:
            found.mig = mig.identify(found.mig, mig.read_map(mig_map))
        return cdi.generate(found, hook, ldconfig, capabilities, kind)


class _Amd(Vendor):
    __slots__ = ()
    name = amd.VENDOR
    resource = amd.RESOURCE
    label_prefix = amd.LABEL_PREFIX
    cdi_kind = amd.CDI_KIND
    visible_env = amd.VISIBLE_DEVICES_ENV
    capabilities_env = None
    request_env = (amd.VISIBLE_DEVICES_ENV,)
    grant_tag = "gpuwire-grant-v1-amd"
    baked = False
    files = False  # ROCm's user space lives in the image
    limits = False  # MPS and HAMi-core are CUDA's
    product_label = amd.LABEL_PREFIX + "gpu.product-name"
    control_nodes = (amd.KFD_NODE,)

    def gpu_node_names(self, device: Device) -> tuple[str, ...]:
        return (f"dri/renderD{device.minor}",)

    memory_label = amd.LABEL_PREFIX + "gpu.vram"  # GiB with a `G`: `192G`

    def label_product(self, name: str) -> str:
        return amd.label_value(name)

    def label_memory(self, mib: int) -> str:
        return f"{mib // 1024}G"

    def memory_requirement(self, least_mib: int, labelled: Iterable[int]) -> dict[str, Any]:
        """`192G` is no number node affinity compares (Gt takes an integer): the values
        present that are at least the floor, In. A node of a new size joining later is no
        candidate, as a model that joins later is not."""
        values = sorted({self.label_memory(m) for m in labelled if m >= least_mib})
        return {"key": self.memory_label, "operator": "In", "values": values}

    def labelled_memory(self, labels: Mapping[str, str]) -> int | None:
        gib = _int(labels.get(self.memory_label, "").removesuffix("G"))
        return None if gib is None else gib * 1024

    def labelled_count(self, labels: Mapping[str, str]) -> int | None:
        """AMD's labeller counts none; gpuwire's labeler does (`gpuwire.io/gpu.count`)."""
        return _int(labels.get("gpuwire.io/gpu.count"))

    def visible_request(self, env: Mapping[str, str]) -> Request:
        return amd.parse_request(env.get(amd.VISIBLE_DEVICES_ENV))

    def capabilities(self, value: str | None) -> tuple[str, ...]:
        return ()

    def canonical_capabilities(self, value: str | None) -> str:
        return ""

    def discover(self, roots: Roots, capabilities: tuple[str, ...]) -> Found:
        from gpuwire import kfd

        try:
            found = kfd.discover(roots)
        except kfd.KfdError as exc:
            raise VendorError(str(exc)) from None
        if found.kfd is None:
            raise VendorError(
                f"no AMD GPU driver: {roots.dev}/dev/{amd.KFD_NODE}, or the kfd major in "
                f"{roots.proc}/proc/devices, is missing (is the amdgpu module loaded?)"
            )
        return found

    def select(self, request: Request, found: Found, mig_map: str = "") -> Selection:
        from gpuwire.kfd import AmdNode

        assert isinstance(found, AmdNode)
        chosen = amd.select(request, found.devices)
        unusable = [
            f"{d.index} ({d.uuid}): {found.gpu(d).problem}"
            for d in chosen.gpus
            if found.gpu(d).device.minor < amd.RENDER_MINOR_BASE
        ]
        if unusable:
            raise VendorError(f"no render node to give: {'; '.join(unusable)}")
        return chosen

    def unchecked(
        self, env: Mapping[str, str], found: Found, chosen: tuple[Device, ...], facts: str
    ) -> list[str]:
        return []  # ROCm images state no driver requirement gpuwire could check

    def container_edits(
        self,
        found: Found,
        selection: Selection,
        capabilities: tuple[str, ...],
        layout: Layout,
        mig_controls: tuple[str, ...] = (),
        cards: bool = False,
    ) -> Edits:
        from gpuwire import amdedits
        from gpuwire.kfd import AmdNode

        assert isinstance(found, AmdNode)
        return amdedits.container_edits(found, selection.gpus, cards)

    def cdi_spec(
        self,
        found: Found,
        hook: str,
        ldconfig: str,
        capabilities: tuple[str, ...],
        kind: str,
        cards: bool = False,
        mig_map: str = "",
    ) -> dict[str, Any]:
        from gpuwire import amdedits
        from gpuwire.kfd import AmdNode

        assert isinstance(found, AmdNode)
        return amdedits.generate(found, kind, cards)


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


NVIDIA: Vendor = _Nvidia()
AMD: Vendor = _Amd()
VENDORS = (NVIDIA, AMD)


def of_resource(resource: str) -> Vendor:
    """The vendor whose device plugin lists `resource` (`amd.com/cpx_nps4` is AMD's)."""
    return next((v for v in VENDORS if resource.startswith(v.label_prefix)), NVIDIA)


def of(name: str) -> Vendor:
    """The vendor named `name`; ValueError naming what is accepted."""
    for vendor in VENDORS:
        if vendor.name == name:
            return vendor
    raise ValueError(f"unknown vendor {name!r}: accepted are {', '.join(v.name for v in VENDORS)}")
