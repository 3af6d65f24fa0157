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
   the DRA plugin's claim mounts (`gpuwire.claimtoken`), one per device of a prepared claim
   the engine applied the CDI spec of: `/run/gpuwire/allocations/claims/<UID>/<device>` from
   `<allocation dir>/claims/<UID>`, valid and binding this container (the claim's owner pod by
   its UID, or the claim's namespace, from the runtime's CRI annotations). The devices are
   those mounted; `NVIDIA_VISIBLE_DEVICES` may name none beyond the claims'. A claim that
   does not hold fails the start: the engine has already given the container its devices; or
3. its `GPUWIRE_GRANT` verifies (`gpuwire.grant`) for its CRI namespace and container name,
   its pod (the admission the webhook wrote into it, `gpuwire.io/grant-pod`), its
   `NVIDIA_VISIBLE_DEVICES`, its `NVIDIA_DRIVER_CAPABILITIES` and its limit variables. A
   grant for devices `plugin` leaves the devices to the device plugin, so it needs an
   allocation too.

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

from gpuwire import allocation, claimtoken, devices, grant, nvidia, requirements
from gpuwire.devices import Device, MigDevice
from gpuwire.vendor import NVIDIA, VENDORS, Vendor, VendorError
from runtime_hook.start import spec as ocispec
from runtime_hook.start.config import Config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.vendor import Found
    from runtime_hook.start.spec import Spec

PRIVILEGED_CAPABILITY = "CAP_SYS_ADMIN"
REQUEST_ENV = (*(name for v in VENDORS for name in v.request_env), grant.ENV)

# Verdict statuses
NOT_GPU = "not a GPU container"
REFUSED = "refused"
GRANTED = "granted"


class ContainerRequest:
    """What a container spec asks for and carries, read without judging it."""

    __slots__ = (
        "claims",
        "conflicts",
        "env",
        "names",
        "owner",
        "pod",
        "privileged",
        "stray_claims",
        "stray_tokens",
        "tokens",
        "vendor",
    )

    def __init__(
        self,
        env: dict[str, str],
        names: tuple[str, str] | None,
        owner: allocation.Owner | None,
        privileged: bool,
        tokens: tuple[str, ...] = (),
        stray_tokens: tuple[str, ...] = (),
        conflicts: dict[str, list[str]] | None = None,
        claims: tuple[tuple[str, str], ...] = (),
        stray_claims: tuple[tuple[str, str], ...] = (),
        vendor: Vendor = NVIDIA,
        pod: str = "",
    ) -> None:
        self.env = env  # the whole environment, last values
        self.names = names  # (namespace, container name) from the CRI annotations
        self.owner = owner  # the pod: its sandbox id and, where the runtime names it, UID
        self.privileged = privileged
        self.tokens = tokens  # allocation tokens mounted from the allocation dir
        self.stray_tokens = stray_tokens  # allocation-looking mounts from anywhere else
        self.conflicts = conflicts or {}  # request keys set more than once, differently
        self.claims = claims  # (claim UID, device) of claim mounts from the allocation dir
        self.stray_claims = stray_claims  # claim-looking mounts from anywhere else
        self.vendor = vendor  # whose request env is read: the node's vendor
        self.pod = pod  # the admission its pod came from (gpuwire.grant.POD_ANNOTATION)

    @property
    def visible(self) -> str | None:
        return self.env.get(self.vendor.visible_env)

    @property
    def capabilities(self) -> str | None:
        name = self.vendor.capabilities_env
        return self.env.get(name) if name else None

    @property
    def grant(self) -> str | None:
        return self.env.get(grant.ENV)

    @property
    def mig_controls(self) -> dict[str, str]:
        """config, monitor → the NVIDIA_MIG_*_DEVICES value that asks for it."""
        env, own = self.env, self.vendor.request_env
        return {
            c: env[name]
            for c, name in nvidia.MIG_CONTROL_ENV.items()
            if name in own and env.get(name)
        }

    @property
    def device_request(self) -> devices.Request:
        return self.vendor.visible_request(self.env)

    def describe(self) -> str:
        caps = self.vendor.capabilities_env
        return f"{self.vendor.visible_env}={self.visible or ''}" + (
            f" {caps}={self.capabilities or ''}" if caps else ""
        )


def read_request(spec: Spec, allocation_dir: str, vendor: Vendor = NVIDIA) -> ContainerRequest:
    env = ocispec.env(spec)
    notes = ocispec.annotations_of(spec)
    tokens: list[str] = []
    strays: list[str] = []
    claims: list[tuple[str, str]] = []
    stray_claims: list[tuple[str, str]] = []
    for mount in ocispec.mounts(spec):
        destination, source = str(mount.get("destination", "")), str(mount.get("source", ""))
        token = allocation.token_of(destination)
        if token is not None:
            (tokens if _inside(source, allocation_dir, token) else strays).append(token)
        elif (claim := claimtoken.mount_of(destination)) is not None:
            own = source.rstrip("/") == claimtoken.path(allocation_dir, claim[0])
            (claims if own else stray_claims).append(claim)
    return ContainerRequest(
        env=env,
        names=grant.subject_names(notes),
        owner=allocation.owner_of(notes),
        privileged=PRIVILEGED_CAPABILITY in ocispec.bounding_capabilities(spec),
        tokens=tuple(dict.fromkeys(tokens)),
        stray_tokens=tuple(strays),
        conflicts=ocispec.conflicting_env(spec, REQUEST_ENV),
        claims=tuple(dict.fromkeys(claims)),
        stray_claims=tuple(stray_claims),
        vendor=vendor,
        pod=grant.pod_of(notes),
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


class ClaimCheck:
    """One claim a container's mounts name: its token and the devices mounted, or why it
    proves nothing."""

    __slots__ = ("devices", "error", "token", "uid")

    def __init__(
        self,
        uid: str,
        token: claimtoken.ClaimToken | None,
        devices: tuple[claimtoken.ClaimDevice, ...],
        error: str | None,
    ) -> None:
        self.uid = uid
        self.token = token
        self.devices = devices  # those of its devices this container's mounts name
        self.error = error


def check_claims(
    request: ContainerRequest, allocation_dir: str, keys: grant.KeyRing
) -> tuple[ClaimCheck, ...]:
    """Read each claim's token once and check that it binds this container and holds every
    device mounted. Nothing is written: a claim is bound when it is prepared."""
    mounted: dict[str, list[str]] = {}
    for uid, device in request.claims:
        mounted.setdefault(uid, []).append(device)
    namespace = request.names[0] if request.names else None
    pod = request.owner.pod if request.owner else None
    checks = []
    for uid, names in mounted.items():
        try:
            token = claimtoken.read(allocation_dir, uid, keys)
            refusal = token.refusal(namespace, pod)
            if refusal:
                raise claimtoken.ClaimTokenError(refusal)
            found = {n: token.device(n) for n in names}
            missing = [n for n, d in found.items() if d is None]
            if missing:
                raise claimtoken.ClaimTokenError(f"{token} has no device {', '.join(missing)}")
            checks.append(ClaimCheck(uid, token, tuple(d for d in found.values() if d), None))
        except claimtoken.ClaimTokenError as exc:
            checks.append(ClaimCheck(uid, None, (), str(exc)))
    return tuple(checks)


def _beyond(wanted: devices.Request, proved: set[str]) -> str:
    """What of a request (NVIDIA_VISIBLE_DEVICES, AMD_VISIBLE_DEVICES) the proved devices do
    not cover."""
    if wanted.kind is devices.Kind.ALL:
        return "all"
    if wanted.kind is devices.Kind.LIST:
        return ",".join(i for i in wanted.entries if i not in proved)
    return ""


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
        self.basis = basis  # privileged, allocation, claim, allocation+claim, grant, trust=any
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
        subject = grant.Subject.of(
            *request.names,
            request.visible,
            request.capabilities,
            request.vendor,
            pod=request.pod,
            env=request.env,
        )
    except nvidia.CapabilityError as exc:
        return False, f"invalid: {exc}"
    ring = keys or grant.KeyRing({})
    return ring.verify(request.grant, subject), ring.explain(request.grant, subject)


def authorise(
    request: ContainerRequest,
    trust: str,
    grant_check: tuple[bool, str],
    tokens: tuple[TokenCheck, ...] = (),
    claims: tuple[ClaimCheck, ...] = (),
) -> Verdict:
    """The verdict on `request` under `trust`, given `grant_holds` and the checked tokens
    and claims."""
    wanted = request.device_request
    if wanted.kind is devices.Kind.VOID and not request.tokens and not request.claims:
        return Verdict(NOT_GPU, f"{request.vendor.visible_env} is unset, empty or void")
    caps = request.capabilities
    if request.privileged and wanted.kind is not devices.Kind.VOID:
        return Verdict(GRANTED, "the container is privileged", "privileged", wanted, caps)
    if request.tokens or request.claims:
        errors = [t.error for t in tokens if t.error] + [c.error for c in claims if c.error]
        uids = {uid for uid, _ in request.claims}
        if errors or len(tokens) != len(request.tokens) or len(claims) != len(uids):
            return Verdict(REFUSED, "; ".join(errors) or "allocation not checked")
        proved = sorted({u for t in tokens if t.allocation for u in t.allocation.devices})
        proved += [d.uuid for c in claims for d in c.devices]  # as mounted: as the spec's env
        # the env may name any device of its claims (their specs' env names them all: a
        # container of one request of a claim sees the others there), none beyond them
        named = {*proved, *(d.uuid for c in claims if c.token for d in c.token.devices)}
        beyond = _beyond(wanted, named) if request.claims else ""
        if beyond:
            return Verdict(
                REFUSED,
                f"{request.vendor.visible_env}={request.visible} reaches beyond the devices "
                f"of {', '.join(str(c.token) for c in claims)}: {beyond}",
            )
        proofs = [f"device-plugin allocation {', '.join(request.tokens)}"] if tokens else []
        proofs += [f"DRA {c.token} ({', '.join(d.name for d in c.devices)})" for c in claims]
        shares = [t.allocation.share for t in tokens if t.allocation and t.allocation.share]
        basis = "+".join(kind for kind, used in (("allocation", tokens), ("claim", claims)) if used)
        return Verdict(
            GRANTED,
            "; ".join(proofs),
            basis,
            devices.Request(devices.Kind.LIST, tuple(dict.fromkeys(proved))),
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
        "claims",
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
        claims: tuple[ClaimCheck, ...] = (),
    ) -> None:
        self.request = request
        self.tokens = tokens
        self.claims = claims
        self.grant_explanation = grant_explanation
        self.verdict = verdict
        self.driver: Found | None = None  # what the vendor's discovery found
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
    vendor = config.vendor
    request = read_request(spec, config.allocation_dir, vendor)
    keys = None
    if request.grant is not None or request.tokens or request.claims:
        keys = grant.KeyRing.load(config.grant_key_dir)
    tokens = (
        check_tokens(request, config.allocation_dir, keys, claim=claim)
        if keys is not None and request.tokens
        else ()
    )
    claims = (
        check_claims(request, config.allocation_dir, keys)
        if keys is not None and request.claims
        else ()
    )
    grant_check = grant_holds(request, keys)
    verdict = authorise(request, config.trust, grant_check, tokens, claims)
    outcome = Outcome(request, tokens, grant_check[1], verdict, claims)
    if verdict.status == REFUSED and request.claims:
        outcome.error = (
            f"{verdict.reason} (the engine has applied the claim's CDI devices: the start "
            "fails rather than run with GPUs gpuwire refuses)"
        )
    if verdict.status != GRANTED or verdict.request is None:
        return outcome
    env = request.env
    caps = verdict.capabilities
    if caps is None and requirements.is_legacy(env):
        caps = "all"  # a legacy CUDA image naming none gets every capability, as the toolkit
    try:
        outcome.mig_controls = mig_controls(request)
        outcome.capabilities = vendor.capabilities(caps)
        found = outcome.driver = vendor.discover(config.roots, outcome.capabilities)
        chosen = vendor.select(verdict.request, found, config.mig_map)
        outcome.devices, outcome.mig = chosen.gpus, chosen.mig
        outcome.unchecked = vendor.unchecked(env, found, outcome.devices, config.driver_facts)
    except (
        nvidia.CapabilityError,
        VendorError,
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
    asked = request.mig_controls
    for control, value in asked.items():
        name = nvidia.MIG_CONTROL_ENV[control]
        if value != "all":
            raise MigControlError(f"{name}={value!r}: only 'all' devices are supported")
        if not request.privileged:
            raise MigControlError(
                f"{name}={value}: MIG {control} access is for privileged containers only "
                f"({PRIVILEGED_CAPABILITY}), as NVIDIA's toolkit: "
                f"cannot set MIG_{control.upper()}_DEVICES in non privileged container"
            )
    return tuple(asked)
