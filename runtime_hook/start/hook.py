"""`gpuwire-hook`: the OCI hooks gpuwire runs. The OCI state JSON arrives on stdin.

- `gpuwire-hook prestart`: the whole injection into a created container, for runtimes
  configured with a prestart hook (containerd's `base_runtime_spec`, an OCI hooks dir).
  Exit status 1 fails the container start; the reason goes to stderr (runc shows it) and
  to the log.
- `gpuwire-hook poststop`: removes the container's record (`gpuwire.records`) when the
  runtime deletes it.
- `gpuwire-hook ldcache --ldconfig P [--folder D]... [--link T::L]... [--entry F::P]...`:
  the links and ld cache for a container whose devices and mounts the runtime already made
  (a CDI spec's hook). As a `createRuntime` hook (gpuwire's CDI specs) it runs in the
  runtime's namespaces and enters the container's mount namespace, as the prestart hook
  does, so the resident can serve it; as a `createContainer` hook it already runs there,
  before pivot_root. gpuwire-call does the same in C first (runtime_hook/setup/ldcache.c)
  and hands on only what it declines: this is the one that names what is wrong.

Both must start fast: they run on container start, so imports here are only what the path
taken needs.
"""

from __future__ import annotations

import sys

from gpuwire import lightjson

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runtime_hook.start.spec import Spec

USAGE = (
    "usage: gpuwire-hook prestart | gpuwire-hook poststop"
    " | gpuwire-hook ldcache --ldconfig PATH [--folder DIR]... [--link T::L]..."
    " [--entry F::P]...\n"
)


def read_state() -> dict[str, object]:
    try:
        state = lightjson.loads(sys.stdin.buffer.read())
    except ValueError as exc:
        raise ValueError(f"the OCI state on stdin is not JSON: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str):
        raise ValueError("the OCI state on stdin has no bundle")
    return state


def prestart() -> int:
    from runtime_hook.start import spec as ocispec

    try:
        state = read_state()
        bundle = str(state["bundle"])
        spec = ocispec.load(bundle)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"gpuwire-hook: {exc}\n")
        return 1
    if not ocispec.asks_for_gpu(spec):
        return 0
    return inject_into(state, bundle, spec)


def inject_into(state: dict[str, object], bundle: str, spec: Spec) -> int:
    """Decide, log, and apply the edits to the created container `state` describes."""
    from runtime_hook.injection import inject
    from runtime_hook.start import config, log, plan, recording
    from runtime_hook.start import spec as ocispec

    try:
        settings = config.load()
    except config.ConfigError as exc:
        sys.stderr.write(f"gpuwire-hook: {exc}\n")
        return 1
    container = str(state.get("id", "?"))
    try:
        decided = plan.make(spec, bundle, settings, sets_env=False)
        message = plan.summary(decided)
        if message:
            log.write(settings.log, "gpuwire-hook", container, message)
        if decided.outcome.error is not None:
            sys.stderr.write(f"gpuwire-hook: {decided.outcome.error}\n")
            return 1
        if decided.edits is not None:
            pid = state.get("pid")
            if not isinstance(pid, int):
                raise ValueError("the OCI state on stdin has no container pid")
            # what holds its limits, the engine's mounts included, onto no link, or no start
            inject.refuse_links(decided.rootfs, ocispec.passed_through(spec, decided.held))
            if not decided.by_engine:  # prepared claims alone: the engine applied it all
                edits = ocispec.missing(spec, decided.edits)  # else what the engine did not
                inject.apply(pid, decided.rootfs, edits, settings.ldconfig)
            recording.keep("gpuwire-hook", settings, container, spec, decided, pid=pid)
    except (OSError, ValueError, RuntimeError) as exc:
        log.write(settings.log, "gpuwire-hook", container, f"injection failed: {exc}")
        sys.stderr.write(f"gpuwire-hook: {exc}\n")
        return 1
    return 0


def poststop() -> int:
    """The container is deleted: forget its container record."""
    from runtime_hook.start import config, recording

    try:
        settings = config.load()
        recording.forget("gpuwire-hook", settings, str(read_state().get("id", "")))
    except (config.ConfigError, ValueError) as exc:
        sys.stderr.write(f"gpuwire-hook poststop: {exc}\n")
        return 1
    return 0


def ldcache(args: list[str]) -> int:
    from gpuwire import resolve
    from gpuwire.edits import parse_ldcache_args
    from runtime_hook.injection import inroot
    from runtime_hook.injection import ldcache as cache
    from runtime_hook.start import spec as ocispec

    journal = inroot.Journal()
    try:
        ldconfig, folders, links, entries = parse_ldcache_args(args)
        state = read_state()
        bundle = str(state["bundle"])
        rootfs = ocispec.rootfs(ocispec.load(bundle), bundle)
        ldconfig_fd = journal.keep(cache.open_ldconfig(ldconfig))  # the host's
        pid = state.get("pid")
        if isinstance(pid, int):
            _enter_mount_namespace_of(pid)
        dirs = inroot.Dirs(journal.keep(resolve.open_root(rootfs)), journal)
        if not cache.make(dirs, links, folders, entries):
            cache.update(rootfs, folders, ldconfig_fd)
    except (OSError, ValueError, RuntimeError) as exc:
        journal.undo()
        sys.stderr.write(f"gpuwire-hook ldcache: {exc}\n")
        return 1
    finally:
        journal.close()
    return 0


def _enter_mount_namespace_of(pid: int) -> None:
    """Join the container's mount namespace, unless this runs there already (a
    `createContainer` hook). This process, served call or Python launcher alike, ends with
    the hook, so it enters itself rather than through a forked child."""
    import os

    here, there = os.stat("/proc/self/ns/mnt"), os.stat(f"/proc/{pid}/ns/mnt")
    if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
        return
    from gpuwire import syscalls

    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.setns(fd, syscalls.CLONE_NEWNS)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["prestart"] and len(args) == 1:
        return prestart()
    if args[:1] == ["poststop"] and len(args) == 1:
        return poststop()
    if args[:1] == ["ldcache"]:
        return ldcache(args[1:])
    sys.stderr.write(USAGE)
    return 2
