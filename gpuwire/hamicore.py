"""HAMi-core (`libvgpu.so`, Project-HAMi/HAMi-core) where a node names its library: what the
runtime puts into a container so that the library caps it, and the variables it reads.

The container gets the library read-only at `/usr/local/vgpu/libvgpu.so` (HAMi's default
`HOOK_PATH`, where the library's `dlsym` hook looks for itself) and `/etc/ld.so.preload`
naming it, read-only, so every dynamically linked program of the container loads it even if
it clears its environment (static programs are never covered: ld.so's rule), as HAMi's own
device plugin does (`pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go` of
Project-HAMi/HAMi). The limits are the container's variables: `CUDA_DEVICE_MEMORY_LIMIT[_<n>]`
(`<MiB>m`), `CUDA_DEVICE_SM_LIMIT[_<n>]` (percent), `GPU_CORE_UTILIZATION_POLICY`. The
library keeps the container's shared region in its default place, `/tmp/cudevshr.cache`:
the container's own `/tmp`, shared by its processes and by no other container, which is
what the region needs (HAMi mounts a host directory there instead for its monitor, which
gpuwire does not run). The one host file is the preload list, in the node config's
`hami-dir` (the DRA plugin's: its plugin directory). On the container-start path: no
imports but where a preload list is written.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

DEFAULT_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # where HAMi's device plugin installs it
DEFAULT_DIR = "/run/gpuwire/hami"
CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
MEMORY_ENV = "CUDA_DEVICE_MEMORY_LIMIT"
CORES_ENV = "CUDA_DEVICE_SM_LIMIT"
POLICY_ENV = "GPU_CORE_UTILIZATION_POLICY"


def asks(names: Iterable[str]) -> bool:
    """Whether an environment (its variable names) asks HAMi-core for limits."""
    for name in names:
        for limit in (MEMORY_ENV, CORES_ENV):
            if name == limit or (name.startswith(limit + "_") and name[len(limit) + 1 :].isdigit()):
                return True
    return False


def limit_env(memory_mib: int | None, cores: int | None) -> dict[str, str]:
    """The variables that cap a container at `memory_mib` per GPU and `cores` percent of the
    SMs. A cores limit also forces HAMi-core's throttling, whose default policy leaves a GPU
    that one pod uses alone unthrottled (Project-HAMi/HAMi #737)."""
    env: dict[str, str] = {}
    if memory_mib is not None:
        env[MEMORY_ENV] = f"{memory_mib}m"
    if cores is not None:
        env[CORES_ENV] = str(cores)
        env[POLICY_ENV] = "force"
    return env


def mib(text: str) -> int | None:
    """A memory limit in HAMi-core's syntax (`g`, `m`, `k` or bytes) in MiB, rounded down;
    None where HAMi-core reads no limit (0, or not a number)."""
    scale = {"g": 1 << 30, "m": 1 << 20, "k": 1 << 10}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    if not (digits.isascii() and digits.isdigit()) or int(digits) == 0:
        return None
    return int(digits) * scale >> 20


def preload_file(state: str) -> str:
    return f"{state}/ld.so.preload"


PRELOAD = (CONTAINER_LIBRARY + "\n").encode()  # what the preload file holds


def binds(library: str, state: str) -> tuple[tuple[str, str], ...]:
    """(host path, container path) of what a container gets: the library, the preload list."""
    return (library, CONTAINER_LIBRARY), (preload_file(state), CONTAINER_PRELOAD)


def write_preload(state: str) -> None:
    """The preload list in `state`, written once (every HAMi-core container mounts it)."""
    import os

    path = preload_file(state)
    try:
        with open(path, "rb") as f:
            if f.read() == PRELOAD:
                return
    except FileNotFoundError:
        pass
    from gpuwire import atomicfile

    os.makedirs(state, mode=0o755, exist_ok=True)
    atomicfile.replace(path, PRELOAD, 0o644)
