"""What a claim's share of a shared GPU limits, as the container's environment.

A shared GPU's allocation says what each claim consumed (`consumedCapacity`: `memory`, and
`cores` in percent). The claim's `limitProfile` (its opaque config; gpuwire.limits) writes
that as the variables its enforcer reads (HAMi-core by default), and `hold` joins the
claim's containers to that enforcer: HAMi-core's library and the preload list naming it
(`gpuwire.hamicore`), where the plugin config names the library. An enforced profile that
nothing here holds fails the prepare, naming what is held: the share would run unlimited.
MPS is not joined on this path (its daemon's defaults are one share for every client, and
claims' shares differ), so `limitProfile: mps` fails too. The informational profiles are
written and held by nothing but the framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deviceplugin.dra.claims import ClaimError, Result
from gpuwire import hamicore, limits
from gpuwire.edits import bind_mount
from gpuwire.quantity import MIB, QuantityError, api_value

if TYPE_CHECKING:
    from gpuwire.edits import Mount


@dataclass(frozen=True)
class Holders:
    """What holds a claim to its share on this node: HAMi-core where the node has its
    library (`hami.library`), its preload list in the plugin's directory `state`."""

    hami_library: str | None = None
    state: str = ""

    @property
    def enforced(self) -> tuple[str, ...]:
        return ("hami",) if self.hami_library else ()


NOTHING = Holders()  # a node that holds no share


def _whole(text: str, what: str) -> int:
    """A consumed quantity, rounded down: a limit never grants more than was allocated."""
    try:
        numerator, denominator = api_value(text)
    except QuantityError as exc:
        raise ClaimError(f"consumed {what} {text!r}: {exc}") from None
    return numerator // denominator


def _shares(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.device.shared and r.consumed]


def limits_env(results: Sequence[Result]) -> dict[str, str]:
    """The env that holds the claim's containers to what its shares consumed; empty when it
    holds no share of a shared GPU. One limit for all its GPUs: the smallest share's."""
    shares = _shares(results)
    if not shares:
        return {}
    memory = [
        _whole(r.consumed["memory"], "memory") // MIB for r in shares if "memory" in r.consumed
    ]
    cores = [_whole(r.consumed["cores"], "cores") for r in shares if "cores" in r.consumed]
    smallest = min(memory) if memory else None
    gpu_mib = min(r.device.gpu.memory_mib for r in shares)
    fraction = smallest / gpu_mib if smallest is not None and gpu_mib else None
    wanted = limits.Limits(
        memory_mib=smallest,
        memory_fraction=fraction,
        cores_percent=min(cores) if cores and min(cores) > 0 else None,
        devices=len(results),
    )
    profile = shares[0].config.limit_profile
    try:
        return limits.render(profile, wanted, {})
    except limits.LimitError as exc:
        raise ClaimError(f"limitProfile {profile}: {exc}") from None


def hold(results: Sequence[Result], holders: Holders) -> tuple[dict[str, str], list[Mount]]:
    """The claim's limits env and the mounts that join its containers to what holds it;
    ClaimError where its profile is enforced and nothing on this node holds it."""
    env = limits_env(results)
    if not env:
        return env, []
    profile = _shares(results)[0].config.limit_profile
    if profile in limits.ADVISORY:
        return env, []
    if profile != "hami" or holders.hami_library is None:
        held = ", ".join(holders.enforced) or "none"
        raise ClaimError(
            f"limitProfile {profile}: nothing on this node holds a claim to its share with "
            f"{profile} (held here: {held}; informational, not held: "
            f"{', '.join(limits.ADVISORY)}); the share would run unlimited"
        )
    return env, [bind_mount(*b) for b in hamicore.binds(holders.hami_library, holders.state)]
