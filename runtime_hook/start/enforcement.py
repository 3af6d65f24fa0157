"""The limits a GPU container asks for, held on this node, or the container does not start.

A container asks through its environment, as the webhook writes it for the enforced limit
profiles: MPS's client variables (`gpuwire.mps.CLIENT_ENV`) and HAMi-core's
(`gpuwire.hamicore`); a shared replica is held to the share its allocation token names
(`gpuwire.allocation.Share`), whatever its environment says. For each, this node must have
the mechanism (`mps-root`, `hami-library` in the node config) and, for MPS, the GPU's
control daemon must be up (its ready marker names a live process); then `join` gives the
container what joins it to the mechanism: its GPU's MPS pipe directory, read-only (a client
connects to the daemon's socket and no more: `gpuwire.mps`), and its GPU's `/dev/shm`, but
not the MPS programs; or HAMi-core's library and the preload list naming it; and a share's
variables (the tighter of the share and the container's own). Anything else fails the start with the
reason: a limit nothing holds would run as an unlimited GPU (an MPS client that finds no
daemon runs without MPS). The prestart hook cannot change a created container's
environment, so there a HAMi-core share must already be in it (the device plugin's
Allocate answer puts it there); a looser value anywhere fails the start. An MPS share needs
no variable: the daemon's defaults are the share, and a client can only lower them.
"""

from __future__ import annotations

import os

from gpuwire import hamicore, mps
from gpuwire.edits import bind_mount, shared_mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from gpuwire.allocation import Share
    from gpuwire.devices import Device, MigDevice
    from gpuwire.edits import Mount
    from runtime_hook.start.config import Config


class EnforcementError(RuntimeError):
    """A limit this node cannot hold for this container; the message says why."""


class Joined:
    """What a container gets from the mechanisms that hold its limits."""

    __slots__ = ("env", "locks", "mechanisms", "mounts", "withheld")

    def __init__(self) -> None:
        self.mechanisms: list[str] = []
        self.mounts: list[Mount] = []
        self.env: dict[str, str] = {}
        self.withheld: tuple[str, ...] = ()  # driver files it is not given (by name)
        self.locks: list[int] = []  # held until the process ends (`gpuwire.mps.lock`)


def join(
    entries: Sequence[tuple[str, str]],
    devices: tuple[Device, ...],
    config: Config,
    share: Share | None = None,
    *,
    sets_env: bool = True,
    mig: tuple[MigDevice, ...] = (),
) -> Joined | None:
    """The mechanisms a container asks for (its env `entries`, in order) or its `share` is
    held by, joined for a container granted `devices` (and `mig`); None when there are none.
    EnforcementError when this node cannot hold them. `sets_env`: whether the caller can
    still set the container's environment (the shim can, the prestart hook cannot)."""
    env = dict(entries)
    held = share.mechanism if share is not None else None
    wants_mps, wants_hami = mps.asks(env) or held == "mps", hamicore.asks(env) or held == "hami"
    if not (wants_mps or wants_hami):
        return None
    joined = Joined()
    if wants_mps:
        _mps(joined, env, devices, config)
    if wants_hami:
        _hami(joined, config)
    if share is not None:
        _alone(share, devices, mig)
        _share(joined, entries, share, sets_env)
    return joined


def _alone(share: Share, devices: tuple[Device, ...], mig: tuple[MigDevice, ...]) -> None:
    """A share holds a container's one GPU: HAMi-core's and MPS's limits name CUDA's device 0,
    and which of several GPUs CUDA numbers 0 is not the runtime's to say."""
    names = [d.uuid for d in devices] + [m.name for m in mig]
    if len(names) != 1:
        raise EnforcementError(
            f"the container holds a replica of a shared GPU, held to {share.memory_mib} MiB and "
            f"{share.cores} % by {share.mechanism}, and {len(names)} GPUs and MIG devices in all "
            f"({', '.join(names)}); a share holds a container's one GPU: give the replica a "
            "container of its own"
        )


def _tightest(limit: int, values: Sequence[str], parse: Callable[[str], int | None]) -> int:
    found = [n for v in values if (n := parse(v)) is not None]
    return min([limit, *found])


def _share(
    joined: Joined, entries: Sequence[tuple[str, str]], share: Share, sets_env: bool
) -> None:
    """A replica's share as its mechanism's variables: the share, or the container's own
    where tighter; set (the shim) or required to be in effect already (the prestart hook)."""
    env = dict(entries)
    if share.mechanism == "mps":
        memory = _tightest(share.memory_mib, [env.get(mps.MEMORY_ENV, "")], _mps_mib)
        threads = _tightest(share.cores, [env.get(mps.THREADS_ENV, "")], _percent)
        if sets_env:  # else the daemon's defaults hold it all the same
            joined.env.update(mps.limit_env(memory, threads))
        return
    memory_keys = (hamicore.MEMORY_ENV, hamicore.MEMORY_ENV + "_0")
    cores_keys = (hamicore.CORES_ENV, hamicore.CORES_ENV + "_0")
    memory = _tightest(share.memory_mib, [env[k] for k in memory_keys if k in env], hamicore.mib)
    cores = _tightest(share.cores, [env[k] for k in cores_keys if k in env], _percent)
    wanted = hamicore.limit_env(memory, cores)
    wanted |= {memory_keys[1]: wanted[memory_keys[0]], cores_keys[1]: wanted[cores_keys[0]]}
    if sets_env:
        joined.env.update(wanted)
        return
    for key in (hamicore.MEMORY_ENV, hamicore.CORES_ENV, hamicore.POLICY_ENV):
        values = [v for k, v in entries if k == key]
        if not values or any(v != wanted[key] for v in values):
            raise EnforcementError(
                f"the container is a replica held to {share.memory_mib} MiB and {share.cores} % "
                f"of its GPU by HAMi-core, and its environment has {key}="
                f"{','.join(values) or '(unset)'} where {wanted[key]} is needed; the prestart "
                "hook cannot change a created container's environment"
            )
    for key in (memory_keys[1], cores_keys[1]):
        if any(v != wanted[key] for k, v in entries if k == key):
            raise EnforcementError(
                f"the container is a replica held to its share of its GPU by HAMi-core, and "
                f"{key} in its environment would lift it; the prestart hook cannot change a "
                "created container's environment"
            )


def _percent(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) <= 100 else None


def _mps_mib(text: str) -> int | None:
    """Ordinal 0's limit in `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=20480M`, `0=20G`), MiB."""
    for item in text.split(","):
        ordinal, _, value = item.partition("=")
        if ordinal.strip() == "0" and value[:-1].isdigit() and value[-1:] in ("M", "G"):
            return int(value[:-1]) * (1024 if value[-1] == "G" else 1)
    return None


def _asked(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    return ", ".join(f"{n}={env[n]}" for n in names if n in env)


def _mps(
    joined: Joined, env: Mapping[str, str], devices: tuple[Device, ...], config: Config
) -> None:
    asked = _asked(env, mps.CLIENT_ENV)
    root = config.mps_root
    if root is None:
        raise EnforcementError(
            f"the container asks for MPS limits ({asked}) and this node runs no MPS control "
            f"daemons (no mps-root in {config.source})"
        )
    if len(devices) != 1:
        raise EnforcementError(
            f"the container asks for MPS limits ({asked}) and has {len(devices)} GPUs; an MPS "
            "client joins one GPU's control daemon"
        )
    (gpu,) = devices
    pipe = env.get(mps.PIPE_ENV)
    if pipe not in (None, mps.CONTAINER_PIPE_DIR):
        raise EnforcementError(
            f"the container asks for MPS limits ({asked}) and sets {mps.PIPE_ENV}={pipe}, "
            f"which would lead its client away from GPU {gpu.index}'s control daemon "
            f"(it is at {mps.CONTAINER_PIPE_DIR})"
        )
    try:  # held until this start is recorded: the agent empties no daemon it joins
        lock = mps.lock(root, gpu.uuid)
    except FileNotFoundError:
        lock = None  # no directory: no daemon either
    if lock is not None:
        joined.locks.append(lock)
    if mps.ready(root, gpu.uuid) is None:
        raise EnforcementError(
            f"the container asks for MPS limits ({asked}) and GPU {gpu.index} ({gpu.uuid}) has "
            f"no MPS control daemon running (no live daemon in {mps.gpu_dir(root, gpu.uuid)}/"
            f"{mps.READY}); without one its client would run unlimited"
        )
    joined.mechanisms.append("mps")
    joined.mounts += [  # the daemon's socket to connect to, its GPU's /dev/shm
        bind_mount(mps.pipe_dir(root, gpu.uuid), mps.CONTAINER_PIPE_DIR, mps.PIPE_OPTIONS),
        shared_mount(mps.shm_dir(root, gpu.uuid), mps.CONTAINER_SHM),
    ]
    joined.withheld += mps.PROGRAMS
    joined.env[mps.PIPE_ENV] = mps.CONTAINER_PIPE_DIR


def _hami(joined: Joined, config: Config) -> None:
    library = config.hami_library
    if library is None:
        raise EnforcementError(
            "the container asks for HAMi-core limits and this node names no HAMi-core "
            f"library (no hami-library in {config.source})"
        )
    if not os.path.isfile(library):
        raise EnforcementError(
            f"the container asks for HAMi-core limits and {library} (hami-library in "
            f"{config.source}) is not there"
        )
    joined.mechanisms.append("hami")
    joined.mounts += [bind_mount(*b) for b in hamicore.binds(library, config.hami_dir)]


def prepare(joined: Joined, config: Config) -> None:
    """The host files the mounts need: HAMi-core's preload list, written once."""
    if "hami" in joined.mechanisms:
        hamicore.write_preload(config.hami_dir)
