"""What a claim's share of a shared GPU limits, as the container's environment.

A shared GPU's allocation says what each claim consumed (`consumedCapacity`: `memory`, and
`cores` in percent). The claim's `limitProfile` (its opaque config; gpuwire.limits) writes
that as the variables its enforcer reads (HAMi-core by default). This is the one place the
limits env of a prepared claim is made; enforcement (MPS daemons, HAMi-core injected by
gpuwire) extends it here.
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.dra.claims import ClaimError, Result
from gpuwire import limits
from gpuwire.quantity import MIB, QuantityError, api_value


def _whole(text: str, what: str) -> int:
    """A consumed quantity, rounded down: a limit never grants more than was allocated."""
    try:
        numerator, denominator = api_value(text)
    except QuantityError as exc:
        raise ClaimError(f"consumed {what} {text!r}: {exc}") from None
    return numerator // denominator


def limits_env(results: Sequence[Result]) -> dict[str, str]:
    """The env that holds the claim's containers to what its shares consumed; empty when it
    holds no share of a shared GPU. One limit for all its GPUs: the smallest share's."""
    shares = [r for r in results if r.device.shared and r.consumed]
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
