"""Whether a container's GPU request is honoured, and why. One decision for every path.

An environment variable is not an authorisation: NVIDIA's CUDA images carry
`NVIDIA_VISIBLE_DEVICES=all`, and any pod author can set it. With `trust = "granted"` (the
default) a request is honoured only when

1. the container is privileged (CAP_SYS_ADMIN in its bounding set: it can reach every
   device anyway), or
2. it carries the device plugin's allocation mounts (`gpuwire.allocation`): a token file
   from the configured allocation directory at `/run/gpuwire/allocations/<token>`, valid
   and claimed by this pod (by its UID where the spec names it, else by its sandbox). The
   devices are the token's, not the env's; or
3. its `GPUWIRE_GRANT` verifies (`gpuwire.grant`) for its CRI namespace and container name,
   its `NVIDIA_VISIBLE_DEVICES` and its `NVIDIA_DRIVER_CAPABILITIES`. A grant for devices
   `plugin` leaves the devices to the device plugin, so it needs an allocation too.

Anything else starts with no GPU, and the log says why. `trust = "any"` honours every
request, as NVIDIA's runtime does by default. `NVIDIA_MIG_CONFIG_DEVICES` and
`NVIDIA_MIG_MONITOR_DEVICES` (`all` only) are honoured for privileged containers alone, and
anywhere else fail the start, as NVIDIA's hook does ("cannot set MIG_CONFIG_DEVICES in non
privileged container").

The pieces: `read_request` (spec → what it asks, pure), `check_tokens` (reads, and for a
real start claims, allocation tokens), `authorise` (pure: the verdict), and `evaluate`, the
shell the shim, the prestart hook and `gpuwire grant verify` all call.
"""

from __future__ import annotations

from gpuwire import allocation, devices, grant, nvidia, requirements
from gpuwire.devices import Device, MigDevice
from runtime_hook.start import spec as ocispec
from runtime_hook.start.config import Config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.driver import Driver
    from runtime_hook.start.spec import Spec

PRIVILEGED_CAPABILITY = "CAP_SYS_ADMIN"
REQUEST_ENV = (
    nvidia.VISIBLE_DEVICES_ENV,
    nvidia.CAPABILITIES_ENV,
    grant.ENV,
    *nvidia.MIG_CONTROL_ENV.values(),
)

# Verdict statuses
NOT_GPU = "not a GPU container"
REFUSED = "refused"
GRANTED = "granted"


class ContainerRequest:
    """What a container spec asks for and carries, read without judging it."""

    __slots__ = (
        "capabilities",
        "conflicts",
        "env",
        "grant",
        "mig_controls",
        "names",
        "owner",
        "privileged",
        "stray_tokens",
        "tokens",
        "visible",
    )

    def __init__(
        self,
        visible: str | None,
        capabilities: str | None,
        grant: str | None,
        names: tuple[str, str] | None,
        owner: allocation.Owner | None,
        privileged: bool,
        tokens: tuple[str, ...] = (),
        stray_tokens: tuple[str, ...] = (),
        conflicts: dict[str, list[str]] | None = None,
        mig_controls: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.visible = visible  # NVIDIA_VISIBLE_DEVICES (last value)
        self.capabilities = capabilities  # NVIDIA_DRIVER_CAPABILITIES
        self.grant = grant  # GPUWIRE_GRANT
        self.names = names  # (namespace, container name) from the CRI annotations
        self.owner = owner  # the pod: its sandbox id and, where the runtime names it, UID
        self.privileged = privileged
        self.tokens = tokens  # allocation tokens mounted from the allocation dir
        self.stray_tokens = stray_tokens  # allocation-looking mounts from anywhere else
        self.conflicts = conflicts or {}  # request keys set more than once, differently
        self.mig_controls = mig_controls or {}  # config, monitor → NVIDIA_MIG_*_DEVICES
        self.env = env if env is not None else {}  # the whole environment, last values

    @property
    def device_request(self) -> devices.Request:
        return ocispec.visible_request(self.env)

    def describe(self) -> str:
        return (
            f"{nvidia.VISIBLE_DEVICES_ENV}={self.visible or ''} "
            f"{nvidia.CAPABILITIES_ENV}={self.capabilities or ''}"
        )


def read_request(spec: Spec, allocation_dir: str) -> ContainerRequest:
    env = ocispec.env(spec)
    notes = ocispec.annotations_of(spec)
    tokens, strays = [], []
    for mount in ocispec.mounts(spec):
        token = allocation.token_of(str(mount.get("destination", "")))
        if token is None:
            continue
        source = str(mount.get("source", ""))
        if _inside(source, allocation_dir, token):
            tokens.append(token)
        else:
            strays.append(token)
    return ContainerRequest(
        visible=env.get(nvidia.VISIBLE_DEVICES_ENV),
        capabilities=env.get(nvidia.CAPABILITIES_ENV),
        grant=env.get(grant.ENV),
        names=grant.subject_names(notes),
        owner=allocation.owner_of(notes),
        privileged=PRIVILEGED_CAPABILITY in ocispec.bounding_capabilities(spec),
        tokens=tuple(dict.fromkeys(tokens)),
        stray_tokens=tuple(strays),
        conflicts=ocispec.conflicting_env(spec, REQUEST_ENV),
        env=env,
        mig_controls={
            control: env[name] for control, name in nvidia.MIG_CONTROL_ENV.items() if env.get(name)
        },
    )


def _inside(source: str, directory: str, token: str) -> bool:
    """A mount source that is exactly `<directory>/<token>` (no `..`, no other place)."""
    return source.rstrip("/") == f"{directory.rstrip('/')}/{token}"


class TokenCheck:
    """One allocation token: the allocation it proves, or why it proves nothing."""

    __slots__ = ("allocation", "error", "owner", "token")

    def __init__(
        self,
        token: str,
        allocation: allocation.Allocation | None,
        error: str | None,
        owner: allocation.Owner | None = None,
    ) -> None:
        self.token = token
        self.allocation = allocation
        self.error = error
        self.owner = owner  # whom the token is (or on this start would be) bound to


def check_tokens(
    request: ContainerRequest, directory: str, keys: grant.KeyRing, *, claim: bool
) -> tuple[TokenCheck, ...]:
    """Read every token; with `claim`, bind it to this pod (a real container start).

    Without `claim` (troubleshooting) an existing claim is only compared, nothing written.
    """
    checks = []
    for token in request.tokens:
        try:
            found = allocation.read(directory, token, keys)
            if request.owner is None:
                raise allocation.AllocationError(
                    f"allocation {token}: the spec names no pod sandbox to bind it to"
                )
            owner = request.owner
            owner = allocation.claim(directory, token, owner.sandbox, owner.pod, write=claim)
            checks.append(TokenCheck(token, found, None, owner))
        except allocation.AllocationError as exc:
            checks.append(TokenCheck(token, None, str(exc)))
    return tuple(checks)


class Verdict:
    """The decision: status, the basis it rests on, why, and what to select if granted."""

    __slots__ = ("basis", "capabilities", "reason", "request", "share", "status")

    def __init__(
        self,
        status: str,
        reason: str,
        basis: str = "",
        request: devices.Request | None = None,
        capabilities: str | None = None,
        share: allocation.Share | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.basis = basis  # privileged, allocation, grant, trust=any
        self.request = request
        self.capabilities = capabilities
        self.share = share  # a shared replica's, from its allocation token


def grant_holds(request: ContainerRequest, keys: grant.KeyRing | None) -> tuple[bool, str]:
    """Whether the request's GPUWIRE_GRANT verifies, and the explanation."""
    if request.grant is None:
        return False, f"no {grant.ENV}"
    if request.names is None:
        return False, "the spec has no CRI namespace and container-name annotations to check it"
    try:
        subject = grant.Subject.of(*request.names, request.visible, request.capabilities)
    except nvidia.CapabilityError as exc:
        return False, f"invalid: {exc}"
    ring = keys or grant.KeyRing({})
    return ring.verify(request.grant, subject), ring.explain(request.grant, subject)


def authorise(
    request: ContainerRequest,
    trust: str,
    grant_check: tuple[bool, str],
    tokens: tuple[TokenCheck, ...] = (),
) -> Verdict:
    """The verdict on `request` under `trust`, given `grant_holds` and the checked tokens."""
    wanted = request.device_request
    if wanted.kind is devices.Kind.VOID and not request.tokens:
        return Verdict(NOT_GPU, f"{nvidia.VISIBLE_DEVICES_ENV} is unset, empty or void")
    caps = request.capabilities
    if request.privileged and wanted.kind is not devices.Kind.VOID:
        return Verdict(GRANTED, "the container is privileged", "privileged", wanted, caps)
    if request.tokens:
        errors = [t.error for t in tokens if t.error]
        if errors or len(tokens) != len(request.tokens):
            return Verdict(REFUSED, "; ".join(errors) or "allocation not checked")
        uuids = tuple(sorted({u for t in tokens if t.allocation for u in t.allocation.devices}))
        shares = [t.allocation.share for t in tokens if t.allocation and t.allocation.share]
        return Verdict(
            GRANTED,
            f"device-plugin allocation {', '.join(request.tokens)}",
            "allocation",
            devices.Request(devices.Kind.LIST, uuids),
            caps,
            shares[0] if shares else None,
        )
    holds, explanation = grant_check
    if holds and request.visible == grant.PLUGIN_DEVICES:
        return Verdict(
            REFUSED,
            f"{grant.ENV} leaves the devices to the device plugin, but the spec carries no "
            "device-plugin allocation",
        )
    if holds:
        return Verdict(GRANTED, f"{grant.ENV} {explanation}", "grant", wanted, caps)
    if trust == "any":
        return Verdict(GRANTED, 'trust = "any" honours every request', "trust=any", wanted, caps)
    why = (
        f"{grant.ENV} is not valid ({explanation})"
        if request.grant is not None
        else f"no {grant.ENV}, no device-plugin allocation, and the container is not privileged"
    )
    return Verdict(REFUSED, f'{request.describe()} not honoured: {why} (trust = "{trust}")')


class Outcome:
    """Everything `evaluate` learnt, for the caller to act on or to explain."""

    __slots__ = (
        "capabilities",
        "devices",
        "driver",
        "error",
        "grant_explanation",
        "mig",
        "mig_controls",
        "request",
        "tokens",
        "unchecked",
        "verdict",
    )

    def __init__(
        self,
        request: ContainerRequest,
        tokens: tuple[TokenCheck, ...],
        grant_explanation: str,
        verdict: Verdict,
    ) -> None:
        self.request = request
        self.tokens = tokens
        self.grant_explanation = grant_explanation
        self.verdict = verdict
        self.driver: Driver | None = None
        self.devices: tuple[Device, ...] = ()  # whole GPUs
        self.mig: tuple[MigDevice, ...] = ()  # MIG devices selected on their own
        self.mig_controls: tuple[str, ...] = ()  # config, monitor
        self.capabilities: tuple[str, ...] = ()
        self.unchecked: list[str] = []  # NVIDIA_REQUIRE_* terms on facts this node lacks
        # A granted request this node cannot satisfy (unknown device, bad capability,
        # no driver): the container start must fail with this message.
        self.error: str | None = None

    @property
    def inject(self) -> bool:
        return self.verdict.status == GRANTED and self.error is None


def evaluate(spec: Spec, config: Config, *, claim: bool) -> Outcome:
    """Decide on `spec` under `config`; when granted, discover and select the devices."""
    request = read_request(spec, config.allocation_dir)
    keys = None
    if request.grant is not None or request.tokens:
        keys = grant.KeyRing.load(config.grant_key_dir)
    tokens = (
        check_tokens(request, config.allocation_dir, keys, claim=claim)
        if keys is not None and request.tokens
        else ()
    )
    grant_check = grant_holds(request, keys)
    verdict = authorise(request, config.trust, grant_check, tokens)
    outcome = Outcome(request, tokens, grant_check[1], verdict)
    if verdict.status != GRANTED or verdict.request is None:
        return outcome
    env = request.env
    caps = verdict.capabilities
    if caps is None and requirements.is_legacy(env):
        caps = "all"  # a legacy CUDA image naming none gets every capability, as the toolkit
    from gpuwire.driver import DiscoveryError, discover  # _ctypes, ELF: when granted

    try:
        outcome.mig_controls = mig_controls(request)
        outcome.capabilities = nvidia.parse_capabilities(caps)
        driver = outcome.driver = discover(config.roots, outcome.capabilities)
        problem = ""
        if driver.mig:
            from gpuwire import mig

            try:
                driver.mig = mig.identify(driver.mig, mig.read_map(config.mig_map))
            except mig.MigError as exc:
                problem = f" ({exc})"
        try:
            chosen = devices.select(verdict.request, driver.devices, driver.mig)
        except devices.UnknownDevice as exc:
            raise devices.UnknownDevice(f"{exc}{problem}") from None
        outcome.devices, outcome.mig = chosen.gpus, chosen.mig
        facts = requirements.read_facts(config.driver_facts, driver.version)
        outcome.unchecked = requirements.check(env, driver.version, facts, outcome.devices)
    except (
        nvidia.CapabilityError,
        DiscoveryError,
        devices.UnknownDevice,
        MigControlError,
        requirements.RequirementError,
    ) as exc:
        outcome.error = str(exc)
    return outcome


class MigControlError(ValueError):
    """A MIG control variable the container may not have."""


def mig_controls(request: ContainerRequest) -> tuple[str, ...]:
    """The MIG capabilities a granted container asks for; MigControlError where it may not
    have them (only `all`, only privileged)."""
    for control, value in request.mig_controls.items():
        name = nvidia.MIG_CONTROL_ENV[control]
        if value != "all":
            raise MigControlError(f"{name}={value!r}: only 'all' devices are supported")
        if not request.privileged:
            raise MigControlError(
                f"{name}={value}: MIG {control} access is for privileged containers only "
                f"({PRIVILEGED_CAPABILITY}), as NVIDIA's toolkit: "
                f"cannot set MIG_{control.upper()}_DEVICES in non privileged container"
            )
    return tuple(request.mig_controls)
