"""The limits a GPU container asks for, held on this node, or the container does not start.

A container asks through its environment, as the webhook writes it for the enforced limit
profiles: MPS's client variables (`gpuwire.mps.CLIENT_ENV`) and HAMi-core's
(`gpuwire.hamicore`). For each, this node must have the mechanism (`mps-root`,
`hami-library` in the node config) and, for MPS, the GPU's control daemon must be up (its
ready marker names a live process); then `join` gives the container what joins it to the
mechanism: MPS's pipe directory of its GPU and the shared `/dev/shm`, or HAMi-core's
library and the preload list naming it. Anything else fails the start with the reason: a
limit nothing holds would run as an unlimited GPU (an MPS client that finds no daemon runs
without MPS).
"""

from __future__ import annotations

import os

from gpuwire import hamicore, mps
from gpuwire.edits import bind_mount, shared_mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpuwire.devices import Device
    from gpuwire.edits import Mount
    from runtime_hook.start.config import Config


class EnforcementError(RuntimeError):
    """A limit this node cannot hold for this container; the message says why."""


class Joined:
    """What a container gets from the mechanisms that hold its limits."""

    __slots__ = ("env", "mechanisms", "mounts")

    def __init__(self) -> None:
        self.mechanisms: list[str] = []
        self.mounts: list[Mount] = []
        self.env: dict[str, str] = {}


def join(env: Mapping[str, str], devices: tuple[Device, ...], config: Config) -> Joined | None:
    """The mechanisms `env` asks for, joined for a container granted `devices`; None when it
    asks for none. EnforcementError when this node cannot hold them."""
    wants_mps, wants_hami = mps.asks(env), hamicore.asks(env)
    if not (wants_mps or wants_hami):
        return None
    joined = Joined()
    if wants_mps:
        _mps(joined, env, devices, config)
    if wants_hami:
        _hami(joined, config)
    return joined


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
    if mps.ready(root, gpu.uuid) is None:
        raise EnforcementError(
            f"the container asks for MPS limits ({asked}) and GPU {gpu.index} ({gpu.uuid}) has "
            f"no MPS control daemon running (no live daemon in {mps.gpu_dir(root, gpu.uuid)}/"
            f"{mps.READY}); without one its client would run unlimited"
        )
    joined.mechanisms.append("mps")
    joined.mounts += [
        shared_mount(mps.pipe_dir(root, gpu.uuid), mps.CONTAINER_PIPE_DIR),
        shared_mount(mps.shm_dir(root), mps.CONTAINER_SHM),
    ]
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
    joined.mounts += [
        bind_mount(library, hamicore.CONTAINER_LIBRARY),
        bind_mount(hamicore.preload_file(config.hami_dir), hamicore.CONTAINER_PRELOAD),
    ]


def prepare(joined: Joined, config: Config) -> None:
    """The host files the mounts need: HAMi-core's preload list, written once."""
    if "hami" not in joined.mechanisms:
        return
    path = hamicore.preload_file(config.hami_dir)
    try:
        with open(path, "rb") as f:
            if f.read() == hamicore.PRELOAD:
                return
    except FileNotFoundError:
        pass
    from gpuwire import atomicfile

    os.makedirs(config.hami_dir, mode=0o755, exist_ok=True)
    atomicfile.replace(path, hamicore.PRELOAD, 0o644)
