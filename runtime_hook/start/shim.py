"""`gpuwire-runtime`: an OCI runtime in front of runc, for containerd's `BinaryName`.

On `create` (and `run`, create and start in one) it makes the links and the ld cache in the
container root (`runtime_hook.injection.inject.prepare`, confined as the hook does it) and
edits `<bundle>/config.json` (devices with cgroup allow rules, read-only mounts, the final
env); then, as for every other subcommand, it execs the real runtime (`runtime` in the
config, runc by default) with the arguments it was given, untouched. Parsing follows
NVIDIA's runtime (NVIDIA/nvidia-container-toolkit `internal/oci/args.go`): `create` (or
`run`) anywhere in the arguments except as the value of `--bundle`/`-b`; the bundle from
`--bundle`, `-bundle` or `-b`, with `=` or a space, else the current directory. A GPU
container's record (`runtime_hook.start.recording`) is kept at create and forgotten at
`delete`. The launcher (`runtime_hook.setup.launcher`) parses the arguments the same way,
and starts Python only for a create that may ask for a GPU or the delete of a container that
has a record.

A request that prepared DRA claims prove has been given its devices by the engine (their CDI
specs): the shim writes the same edits into `config.json` again, which adds nothing but
`NVIDIA_VISIBLE_DEVICES` naming exactly the devices the container holds, keeps its record,
and makes the links and ld cache each spec's ld-cache hook would make, then removes those
hooks: runc runs none (docs/dra.md, "The CDI path's cost").

A request that is refused is written back with `NVIDIA_VISIBLE_DEVICES=void`, so nothing
downstream injects what gpuwire refused and the process sees what it got. A request that
cannot be met fails `create`: the message goes to stderr and, as runc's own errors do, to
the runtime's `--log` file, which is where containerd looks for why a create failed.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.edits import Edits
    from runtime_hook.start.config import Config

BUNDLE_FLAGS = ("--bundle", "-bundle", "-b")
CREATING = ("create", "run")


def flag_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first flag in `names`, written `--flag value` or `--flag=value`."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else None
    return None


def is_create(args: list[str]) -> bool:
    previous = ""
    for arg in args:
        if arg in CREATING and previous not in BUNDLE_FLAGS:
            return True
        previous = arg
    return False


def report_failure(args: list[str], message: str) -> None:
    """Tell containerd why: stderr, and the runtime log in runc's format."""
    sys.stderr.write(f"gpuwire-runtime: {message}\n")
    log_file = flag_value(args, ("--log", "-log"))
    if not log_file:
        return
    import time

    from gpuwire import lightjson

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if flag_value(args, ("--log-format", "-log-format")) == "json":
        entry = lightjson.dumps({"level": "error", "msg": f"gpuwire: {message}", "time": stamp})
    else:
        entry = f'time="{stamp}" level=error msg="gpuwire: {message}"'
    try:
        with open(log_file, "a") as f:
            f.write(entry + "\n")
    except OSError:
        pass


def edit_bundle(bundle: str, container: str, settings: Config) -> None:
    """Decide on the bundle's spec and write its edits (or its refusal) into config.json."""
    from runtime_hook.start import spec as ocispec

    spec = ocispec.load(bundle)
    if not ocispec.asks_for_gpu(spec):
        return
    from gpuwire import edits, records
    from runtime_hook.start import log, plan, recording
    from runtime_hook.start.trust import REFUSED

    decided = plan.make(spec, bundle, settings)
    message = plan.summary(decided)
    if message:
        log.write(settings.log, "gpuwire-runtime", container, message)
    if decided.outcome.error is not None:
        raise RuntimeError(decided.outcome.error)
    if decided.edits is not None:
        from runtime_hook.injection import inject

        hooked = ocispec.ldcache_hooks(spec) if decided.by_engine else []
        try:
            inject.refuse_links(decided.rootfs, ocispec.passed_through(spec, decided.held))
            for links in _links_and_caches(decided.edits, decided.by_engine, hooked):
                inject.prepare(decided.rootfs, links, settings.ldconfig)
        except inject.InjectionError as exc:
            log.write(settings.log, "gpuwire-runtime", container, f"injection failed: {exc}")
            raise
        if hooked:
            spec = ocispec.without_ldcache_hooks(spec)
        ocispec.save(bundle, ocispec.apply(spec, decided.edits))
        state = records.runtime_state(sys.argv[1:], container)
        recording.keep("gpuwire-runtime", settings, container, spec, decided, state=state)
    elif decided.outcome.verdict.status == REFUSED:
        void = edits.Edits({"NVIDIA_VISIBLE_DEVICES": "void"}, [], [], [], [], [])
        ocispec.save(bundle, ocispec.apply(spec, void))


def _links_and_caches(edits: Edits, by_engine: bool, hooked: list[list[str]]) -> list[Edits]:
    """What `inject.prepare` makes before runc: the plan's links and ld cache; for edits the
    engine applied from claims' CDI specs, what each spec's ld-cache hook would make, so that
    runc runs no hook (a hook costs runc a process and the resident a second call)."""
    from gpuwire.edits import Edits, parse_ldcache_args

    if not by_engine:
        return [edits]
    made = []
    for args in hooked:
        _, folders, links, entries = parse_ldcache_args(args)
        made.append(Edits({}, [], edits.mounts, links, folders, entries))
    return made


def runtime_path(runtime: str) -> str:
    """The low-level runtime's executable; never this shim itself (that would loop)."""
    candidates = (
        [runtime]
        if "/" in runtime
        else [os.path.join(d, runtime) for d in os.environ.get("PATH", os.defpath).split(":") if d]
    )
    own = os.path.realpath(sys.argv[0]) if "/" in sys.argv[0] else None
    for path in candidates:
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            if os.path.realpath(path) == own or os.path.basename(path) == "gpuwire-runtime":
                raise RuntimeError(f"runtime {runtime!r} is gpuwire-runtime itself")
            return path
    raise RuntimeError(f"runtime {runtime!r} not found (PATH={os.environ.get('PATH', '')})")


def decide(args: list[str]) -> tuple[int, str | None]:
    """Everything but the exec: (0, the runtime to exec with `args`), or (status, None)."""
    from runtime_hook.start import recording
    from runtime_hook.start.config import ConfigError, load

    create = is_create(args)
    runtime = "runc"
    try:
        settings = load()
        runtime = settings.runtime
        if create:
            bundle = flag_value(args, BUNDLE_FLAGS) or os.getcwd()
            edit_bundle(bundle, args[-1] if args else "?", settings)
        elif (gone := recording.deleted(args)) is not None:
            recording.forget("gpuwire-runtime", settings, gone)
    except (ConfigError, OSError, ValueError, RuntimeError) as exc:
        if create:
            report_failure(args, str(exc))
            return 1, None
        # delete, kill, state ... must keep working with a broken config
        sys.stderr.write(f"gpuwire-runtime: {exc}; using runc\n")
    try:
        return 0, runtime_path(runtime)
    except RuntimeError as exc:
        report_failure(args, str(exc))
    return 127, None


def main() -> int:
    args = sys.argv[1:]
    status, path = decide(args)
    if path is None:
        return status
    try:
        os.execv(path, [path, *args])  # noqa: S606 - the configured runtime, argv untouched
    except OSError as exc:
        report_failure(args, str(exc))
    return 127
