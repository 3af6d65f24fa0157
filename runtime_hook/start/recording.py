"""The container record (`gpuwire.records`) of a container the shim or the prestart hook gave
GPUs, and its removal when the runtime deletes the container.

The record is for the inventory, not for the container: one that cannot be written is
logged, and the container starts all the same. The shim imports this module on every runtime
call (to notice `delete`), so what only `keep` needs is imported there.
"""

from __future__ import annotations

from gpuwire import records
from runtime_hook.start import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runtime_hook.start.config import Config
    from runtime_hook.start.plan import Plan
    from runtime_hook.start.spec import Spec

# the record's path by the verdict's basis; every other basis is plugin-less
PATHS = {"allocation": records.PLUGIN, "claim": records.DRA, "allocation+claim": records.DRA}
# runc's global flags that take a value (`runc --root R delete ID`).
_VALUE_FLAGS = ("--root", "--log", "--log-format", "--criu", "--rootless")


def keep(
    program: str,
    settings: Config,
    container: str,
    spec: Spec,
    decided: Plan,
    *,
    pid: int | None = None,
    state: str | None = None,
) -> None:
    """Record that `container` holds the GPUs `decided` gave it."""
    from gpuwire import devices
    from runtime_hook.start import spec as ocispec

    outcome = decided.outcome
    request = outcome.verdict.request
    claims = [c for c in outcome.claims if c.token is not None]
    try:
        record = records.started(
            container,
            ocispec.annotations_of(spec),
            (*(d.uuid for d in outcome.devices), *(m.name for m in outcome.mig)),
            path=PATHS.get(outcome.verdict.basis, records.PLUGIN_LESS),
            whole_node=request is not None and request.kind is devices.Kind.ALL,
            capabilities=outcome.capabilities,
            pid=pid,
            state=state,
            claims=[f"{c.token.namespace}/{c.token.name}" for c in claims if c.token],
            shares=[d.uuid for c in claims for d in c.devices if d.share],
            mps=[d.uuid for d in outcome.devices] if decided.joins("mps") else (),
        )
        records.write(settings.records_dir, record)
    except (OSError, ValueError) as exc:
        log.write(settings.log, program, container, f"container record not written: {exc}")


def deleted(args: list[str]) -> str | None:
    """The container a runtime command line deletes (`delete [--force] ID`), if it does."""
    command, previous = None, ""
    for arg in args:
        if command is None and not arg.startswith("-") and previous not in _VALUE_FLAGS:
            command = arg
        previous = arg
    return args[-1] if command == "delete" and len(args) > 1 else None


def forget(program: str, settings: Config, container: str) -> None:
    try:
        records.remove(settings.records_dir, container)
    except (OSError, ValueError) as exc:
        log.write(settings.log, program, container, f"container record not removed: {exc}")
