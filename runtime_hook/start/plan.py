"""From a container spec to what the container gets: the front half of shim and hook.

`make(spec, bundle, config)` decides (`runtime_hook.start.trust`), and for a granted request
discovers the driver, probes the rootfs's distro, computes the edits and joins the limits it
asks for to this node's mechanisms (`runtime_hook.start.enforcement`), writing the host files
they need. `summary` is the one log line that says what was decided and why.

A request that prepared DRA claims prove came with their CDI specs, which the engine has
applied already (devices, mounts, env, and what holds a share's limits: `deviceplugin.dra`):
its edits are laid out as a CDI spec lays them out (`gpuwire.edits.host_layout`), so that
writing them into `config.json` again adds nothing the engine wrote. Where the claims are
the only proof, no limit is joined again and `by_engine` tells the shim and the prestart hook
to inject nothing else; what holds the claims' shares is checked all the same (`held`: the
spec's mounts at HAMi-core's paths, onto no link of the image's or a volume's). A container
that also holds a device-plugin allocation has GPUs no engine gave it: those are injected
(what the spec lacks: `runtime_hook.start.spec.missing`) and joined to what holds their
limits, as any allocation's are.
"""

from __future__ import annotations

import os

from gpuwire import hamicore
from gpuwire.devices import Selection
from gpuwire.edits import Edits, Layout, host_layout
from runtime_hook.start import enforcement, trust
from runtime_hook.start import spec as ocispec
from runtime_hook.start.config import Config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.edits import Mount
    from runtime_hook.start.spec import Spec


# Where a prepared claim's CDI spec mounts what holds its share (`deviceplugin.dra.shares`:
# HAMi-core, the one mechanism on that path).
CLAIM_HELD = (hamicore.CONTAINER_LIBRARY, hamicore.CONTAINER_PRELOAD)


class Plan:
    __slots__ = ("by_engine", "claim_held", "edits", "joined", "outcome", "rootfs")

    def __init__(
        self,
        outcome: trust.Outcome,
        rootfs: str,
        edits: Edits | None,
        joined: enforcement.Joined | None = None,
        by_engine: bool = False,
        claim_held: tuple[str, ...] = (),
    ) -> None:
        self.outcome = outcome
        self.rootfs = rootfs
        self.edits = edits  # None: nothing to inject
        self.joined = joined  # the mechanisms that hold its limits, if it asked for any
        self.by_engine = by_engine  # the engine applied them (prepared claims' CDI specs)
        self.claim_held = claim_held  # where the engine mounted what holds claims' shares

    def joins(self, mechanism: str) -> bool:
        """Whether the container is joined to `mechanism` (`mps`, `hami`)."""
        return self.joined is not None and mechanism in self.joined.mechanisms

    @property
    def held(self) -> list[str]:
        """Where the mounts that hold its limits go in the container: gpuwire's, the engine's."""
        joined = [m["containerPath"] for m in self.joined.mounts] if self.joined else []
        return list(dict.fromkeys([*joined, *self.claim_held]))


def is_debian(rootfs: str) -> bool:
    """Whether the image is Debian-family (`/etc/debian_version`, resolved inside it)."""
    from gpuwire import resolve  # loads _ctypes: only for a container that gets a GPU
    from runtime_hook.injection import inroot

    root_fd = resolve.open_root(rootfs)
    try:
        return inroot.exists(root_fd, "/etc/debian_version")
    finally:
        os.close(root_fd)


def make(spec: Spec, bundle: str, config: Config, *, sets_env: bool = True) -> Plan:
    """Decide on `spec` and compute its edits; claims allocation tokens (a real start).
    `sets_env`: whether the edits' environment reaches the process (not from a prestart
    hook: the process is made)."""
    outcome = trust.evaluate(spec, config, claim=True)
    rootfs = ocispec.rootfs(spec, bundle)
    if not outcome.inject or outcome.driver is None:
        return Plan(outcome, rootfs, None)
    basis = outcome.verdict.basis
    by_engine = basis == "claim"  # the engine applied all of it: the claims' CDI specs
    claimed = by_engine or basis == "allocation+claim"
    vendor = config.vendor
    if not vendor.files:
        layout = Layout.of(debian=True)  # no files to lay out: the image's distro is no matter
    elif claimed:
        layout = host_layout(outcome.driver)  # type: ignore[arg-type]  # files: NVIDIA's Driver
    else:
        layout = Layout.of(debian=is_debian(rootfs))
    edits = vendor.container_edits(
        outcome.driver,
        Selection(outcome.devices, outcome.mig),
        outcome.capabilities,
        layout,
        outcome.mig_controls,
        config.amd_cards,
    )
    claim_held = _claim_held(spec) if claimed else ()
    if by_engine:
        return Plan(outcome, rootfs, edits, by_engine=True, claim_held=claim_held)
    try:
        entries = ocispec.env_entries(spec)
        share = outcome.verdict.share
        joined = enforcement.join(
            entries, outcome.devices, config, share, sets_env=sets_env, mig=outcome.mig
        )
        if joined is not None:
            enforcement.prepare(joined, config)
    except (enforcement.EnforcementError, OSError) as exc:
        outcome.error = str(exc)
        return Plan(outcome, rootfs, None)
    if joined is not None:
        edits.mounts = [m for m in edits.mounts if _name(m) not in joined.withheld]
        edits.mounts += joined.mounts
        edits.env.update(joined.env)
    return Plan(outcome, rootfs, edits, joined, claim_held=claim_held)


def _claim_held(spec: Spec) -> tuple[str, ...]:
    """Those of CLAIM_HELD the spec mounts (a claim's share held by HAMi-core)."""
    mounted = {ocispec.destination(m) for m in ocispec.mounts(spec)}
    return tuple(p for p in CLAIM_HELD if p in mounted)


def _name(mount: Mount) -> str:
    return mount["containerPath"].rpartition("/")[2]


def summary(plan: Plan) -> str | None:
    """The log line for `plan`, or None for a container that asked for no GPU."""
    outcome = plan.outcome
    names = outcome.request.names
    who = f"{names[0]}/{names[1]}: " if names else ""
    verdict = outcome.verdict
    if outcome.error is not None:
        return f"{who}cannot start: {outcome.error}"
    if verdict.status == trust.REFUSED:
        return f"{who}no GPU: {verdict.reason}"
    if verdict.status != trust.GRANTED:
        return None
    gpus = ", ".join(f"{d.index} ({d.uuid})" for d in outcome.devices) or "none"
    mig = "".join(f", MIG {m.place} ({m.name})" for m in outcome.mig)
    controls = "".join(f", MIG {c}" for c in outcome.mig_controls)
    caps = f", capabilities {','.join(outcome.capabilities)}" if outcome.capabilities else ""
    held = f", limits held by {' and '.join(plan.joined.mechanisms)}" if plan.joined else ""
    unchecked = f" (not checked here: {'; '.join(outcome.unchecked)})" if outcome.unchecked else ""
    return f"{who}GPUs {gpus}{mig}{controls}{caps}{held}: {verdict.basis}{unchecked}"
