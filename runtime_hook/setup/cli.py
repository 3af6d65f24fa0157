"""`gpuwire` subcommands of the node side (see gpuwire/cli.py for the table).

`grant verify` is the admin's first troubleshooting step: given a container spec it runs
the same decision as the shim and the prestart hook (`runtime_hook.start.trust.evaluate`),
without claiming allocation tokens, and says what the container would get and why.
`containerd configure` and `cdi generate` set a node up for the shim, the hook or CDI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuwire import allocation, cdi, claimtoken, exits
from runtime_hook.setup import containerd_config
from runtime_hook.start import config, trust


def explain(outcome: trust.Outcome, settings: config.Config) -> list[str]:
    """The verdict and every fact it rests on, one `label  text` line each."""
    request = outcome.request
    who = "/".join(request.names) if request.names else "(no CRI namespace/name annotations)"
    owner = request.owner
    pod = f"pod {owner.pod}, " if owner and owner.pod else ""
    sandbox = f" ({pod}sandbox {owner.sandbox[:12]})" if owner else ""
    lines = [
        f"container   {who}{sandbox}",
        f"request     {request.describe()}",
        f"grant       {outcome.grant_explanation}",
    ]
    allocations = [
        f"{t.token}: {t.error}"
        if t.error or t.allocation is None
        else f"{t.token}: valid, GPUs {', '.join(t.allocation.devices)}{_binding(t.owner)}"
        for t in outcome.tokens
    ]
    lines += [f"allocation  {a}" for a in allocations or ["none"]]
    lines += [f"claim       {_claim(c)}" for c in outcome.claims]
    lines.append(f"privileged  {'yes (CAP_SYS_ADMIN)' if request.privileged else 'no'}")
    lines.append(f"trust       {settings.trust} (config: {settings.source})")
    for key, values in request.conflicts.items():
        lines.append(
            f"note        {key} is set {len(values)} times ({', '.join(values)}): "
            "the last value counts"
        )
    for token in request.stray_tokens:
        lines.append(
            f"note        allocation mount {token} ignored: its source is not in "
            f"{settings.allocation_dir}"
        )
    for uid, device in request.stray_claims:
        lines.append(
            f"note        claim mount {uid}/{device} ignored: its source is not "
            f"{claimtoken.path(settings.allocation_dir, uid)}"
        )
    verdict = outcome.verdict
    if outcome.error is not None:
        decision = f"cannot start: {outcome.error}"
    elif verdict.status == trust.GRANTED:
        gpus = ", ".join(f"{d.index} ({d.uuid})" for d in outcome.devices) or "none"
        decision = (
            f"honoured ({verdict.basis}): GPUs {gpus}; "
            f"capabilities {','.join(outcome.capabilities)}"
        )
    else:
        decision = f"{verdict.status}: {verdict.reason}"
    lines.append(f"decision    {decision}")
    return lines


def _claim(check: trust.ClaimCheck) -> str:
    """A claim the container's mounts name: valid for whom, with which devices, or why not."""
    token = check.token
    if check.error or token is None:
        return f"{check.uid}: {check.error}"
    devices = ", ".join(
        f"{d.name} ({d.uuid}{', a share' if d.share else ''})" for d in check.devices
    )
    whom = f"pod{'s' if len(token.pods) > 1 else ''} {', '.join(token.pods) or '(none)'}"
    return f"{token.namespace}/{token.name} ({check.uid}): valid, {devices}; for {whom}"


def _binding(owner: allocation.Owner | None) -> str:
    """Whom a valid token is bound to: by pod UID where the spec names it, else by sandbox."""
    if owner is None:
        return ""
    if owner.pod:
        return f"; for pod {owner.pod}, in any of its sandboxes"
    return f"; for sandbox {owner.sandbox[:12]} only (the spec names no pod UID)"


def grant_verify(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire grant verify",
        description="Explain whether this node would honour a container's GPU request, and why. "
        "Exit status: 0 honoured or no GPU asked for, 1 refused or cannot start, 2 a bad flag, "
        "3 a spec or config that cannot be read.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bundle", help="an OCI bundle directory (reads its config.json)")
    source.add_argument("--spec", help="an OCI runtime spec (config.json)")
    parser.add_argument(
        "--config", help=f"node configuration (default: ${config.ENV}, else {config.DEFAULT_PATH})"
    )
    args = parser.parse_args(argv)
    path = args.spec or os.path.join(args.bundle, "config.json")
    try:
        settings = config.load(args.config)
        with open(path, "rb") as f:
            spec = json.load(f)
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
    except config.ConfigError as exc:
        raise exits.CommandError(str(exc)) from None
    except OSError as exc:
        raise exits.CommandError(f"cannot read spec {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise exits.CommandError(f"cannot read spec {path}: {exc}") from None
    outcome = trust.evaluate(spec, settings, claim=False)
    print("\n".join(explain(outcome, settings)))
    refused = outcome.error is not None or outcome.verdict.status == trust.REFUSED
    return 1 if refused else 0


def _program(name: str, given: str | None) -> str:
    """An absolute path to one of gpuwire's programs: as given, else the one installed with
    this gpuwire (beside its Python as the interpreter was named, links not resolved), else
    the one on PATH. A console script names its version's own Python, so where versions are
    switched by a link the installer names the path through the link itself."""
    if given is None:
        beside = Path(sys.executable).parent / name
        found = str(beside) if os.access(beside, os.X_OK) else shutil.which(name) or str(beside)
        given = str(Path(found).absolute())
    if not Path(given).is_absolute() or not shutil.which(given):
        raise containerd_config.ContainerdConfigError(
            f"{name} {given!r}: not an executable at an absolute path"
        )
    return given


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise containerd_config.ContainerdConfigError(
            f"`{' '.join(argv)}`: {exc.strerror}"
        ) from None
    if out.returncode != 0:
        raise containerd_config.ContainerdConfigError(
            f"`{' '.join(argv)}` failed: {out.stderr.strip()}"
        )
    return out.stdout


def _containerd_version(binary: str) -> tuple[int, ...] | None:
    """`containerd --version` as numbers (`containerd github.com/... 1.6.20~ds1 ...`)."""
    try:
        words = _run([binary, "--version"]).split()
    except containerd_config.ContainerdConfigError:
        return None
    digits = words[2].split("~")[0].split("-")[0].lstrip("v").split(".") if len(words) > 2 else []
    return tuple(int(d) for d in digits) if all(d.isdigit() for d in digits) else None


def _containerd_files(parser: argparse.ArgumentParser, created: str) -> None:
    """--config and --drop-in, as configure and unconfigure both name them."""
    parser.add_argument(
        "--config",
        type=Path,
        default=containerd_config.DEFAULT_CONFIG,
        help=f"containerd's main config (default %(default)s{created})",
    )
    parser.add_argument(
        "--drop-in",
        type=Path,
        help=f"gpuwire's drop-in, which carries the handler (default {containerd_config.DROP_IN} "
        "beside --config)",
    )


def containerd_unconfigure(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire containerd unconfigure",
        description="Take gpuwire's drop-in out of containerd's main config (its imports), the "
        "rest as written; the uninstaller's step where it cannot give the file back byte for "
        "byte. Restart containerd afterwards.",
    )
    _containerd_files(parser, "")
    args = parser.parse_args(argv)
    main = args.config.absolute()
    drop_in = (args.drop_in or main.parent / containerd_config.DROP_IN).absolute()
    try:
        text = containerd_config.Disk().read(main)
        if text is None:
            print(f"no change: {main} does not exist")
            return 0
        new = containerd_config.without_import(main, text, drop_in)
    except containerd_config.ContainerdConfigError as exc:
        raise exits.CommandError(str(exc)) from None
    if new == text:
        print(f"no change: {main} does not import {drop_in}")
        return 0
    containerd_config.write([containerd_config.Change(main, text, new)])
    print(f"wrote {main}")
    return 0


def containerd_configure(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuwire containerd configure",
        description="Add the gpuwire runtime handler to containerd's config, as a drop-in the "
        "main config imports. Restart containerd afterwards.",
    )
    _containerd_files(parser, "; created if missing")
    parser.add_argument(
        "--config-source",
        choices=("file", "command"),
        default="file",
        help="take the CRI section from the config files, or from `containerd config dump` "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--containerd", default="containerd",
        help="the containerd binary, for --config-source command (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--runtime-name", default="gpuwire",
        help="handler (RuntimeClass) name (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--runtime-path", help="absolute path of gpuwire-runtime (default: found on PATH)"
    )
    parser.add_argument(
        "--set-default", action="store_true", help="make it containerd's default runtime"
    )
    parser.add_argument(
        "--cdi", action="store_true", help="enable CDI (containerd >= 1.7): enable_cdi, spec dirs"
    )
    parser.add_argument(
        "--prestart-hook",
        action="store_true",
        help="keep runc and inject with gpuwire-hook, from a base runtime spec",
    )
    parser.add_argument("--hook-path", help="absolute path of gpuwire-hook (default: on PATH)")
    parser.add_argument(
        "--base-spec",
        type=Path,
        default=containerd_config.BASE_SPEC,
        help="base runtime spec to write for --prestart-hook (default %(default)s)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print a unified diff, write nothing"
    )
    args = parser.parse_args(argv)
    main = args.config.absolute()
    drop_in = (args.drop_in or main.parent / containerd_config.DROP_IN).absolute()
    try:  # the flags' values: exit 2
        runtime = containerd_config.Runtime(
            name=args.runtime_name,
            shim="" if args.prestart_hook else _program("gpuwire-runtime", args.runtime_path),
            hook=_program("gpuwire-hook", args.hook_path) if args.prestart_hook else None,
            base_spec=str(args.base_spec.absolute()),
            set_default=args.set_default,
            cdi=args.cdi,
        )
    except containerd_config.ContainerdConfigError as exc:
        raise exits.CommandError(str(exc), exits.USAGE) from None
    try:  # the files and containerd they name: exit 3
        dump = None
        if args.config_source == "command":
            text = _run([args.containerd, "--config", str(main), "config", "dump"])
            dump = containerd_config.Source(main, containerd_config.parse(main, text).unwrap())

        def default_spec() -> dict[str, Any]:
            spec: dict[str, Any] = json.loads(_run(["ctr", "oci", "spec"]))
            return spec

        plan = containerd_config.plan(
            main, drop_in, runtime, containerd_config.Disk(), dump, default_spec
        )
    except containerd_config.ContainerdConfigError as exc:
        raise exits.CommandError(str(exc)) from None
    for warning in plan.warnings:
        sys.stderr.write(f"gpuwire containerd configure: warning: {warning}\n")
    version = _containerd_version(args.containerd) if args.cdi else None
    if version is not None and version < (1, 7):
        sys.stderr.write(
            "gpuwire containerd configure: warning: containerd "
            f"{'.'.join(map(str, version))} has no CDI support (needs 1.7): it ignores enable_cdi\n"
        )
    if not plan.changes:
        print(f"no change: {main} already runs {runtime.name!r} as asked")
    elif args.dry_run:
        sys.stdout.write(containerd_config.diff(plan.changes))
    else:
        containerd_config.write(plan.changes)
        for change in plan.changes:
            print(f"wrote {change.path}")
        print("restart containerd to apply it (systemctl restart containerd)")
    return 0


# The spec file extensions CDI engines load.
EXTENSIONS = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def output_format(path: str) -> str:
    """json or yaml, from the file name, as CDI engines load only these extensions."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in EXTENSIONS:
        raise cdi.CdiError(
            f"--output {path}: extension {extension or '(none)'!r} is not one CDI engines "
            f"load: accepted are {', '.join(EXTENSIONS)} (or say --format for a file that "
            "will be renamed)"
        )
    return EXTENSIONS[extension]


def render(spec: cdi.Spec, fmt: str) -> str:
    if fmt == "json":
        import json

        return json.dumps(spec, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))


def cdi_generate(argv: list[str]) -> int:
    from gpuwire import mig, nvidia
    from gpuwire.roots import Roots
    from gpuwire.vendor import VENDORS, VendorError, of

    parser = argparse.ArgumentParser(
        prog="gpuwire cdi generate",
        description="Write a CDI spec for this node's GPUs (devices by index and UUID, MIG "
        "devices as <gpu>:<gi>:<ci> and by UUID, AMD partitions as devices, and 'all'). "
        "Vendor, roots, hook, ldconfig and the MIG map default to the gpuwire config "
        f"(${config.ENV}, else {config.DEFAULT_PATH}).",
    )
    parser.add_argument(
        "--vendor", choices=[v.name for v in VENDORS], help="whose GPUs (default: the config's)"
    )
    parser.add_argument(
        "--root",
        help="host root: sets the driver, dev, proc and sys roots (default: the config's root, "
        "else /)",
    )
    for name, holds in (
        ("driver", "the driver's libraries and binaries are"),
        ("dev", "dev/nvidia* (dev/kfd, dev/dri) are"),
        ("proc", "proc/driver/nvidia is"),
        ("sys", "sys/class/kfd and sys/class/drm are"),
    ):
        parser.add_argument(
            f"--{name}-root",
            help=f"where {holds} (default: --root, else the config's {name}-root, else its root)",
        )
    parser.add_argument(
        "--output", help="spec file, .json or .yaml (e.g. /var/run/cdi/nvidia.yaml); default stdout"
    )
    parser.add_argument(
        "--format",
        choices=("json", "yaml"),
        help="instead of the --output extension (default yaml on stdout)",
    )
    parser.add_argument(
        "--kind", help="vendor/class (default the vendor's: nvidia.com/gpu, amd.com/gpu)"
    )
    parser.add_argument(
        "--capabilities",
        default="all",
        help="NVIDIA: driver capabilities whose files every device brings (default all, as "
        "CDI has no per-container capability request)",
    )
    args = parser.parse_args(argv)
    try:
        settings = config.load()
        vendor = of(args.vendor) if args.vendor else settings.vendor
        fmt = args.format or (output_format(args.output) if args.output else "yaml")
        roots = Roots(args.root) if args.root else settings.roots
        roots = Roots(
            driver=args.driver_root or roots.driver,
            dev=args.dev_root or roots.dev,
            proc=args.proc_root or roots.proc,
            sys=args.sys_root or roots.sys,
        )
        if vendor.files and (
            not os.path.isabs(settings.hook) or not os.access(settings.hook, os.X_OK)
        ):
            raise config.ConfigError(
                f"hook {settings.hook!r} (from {settings.source}) is not an executable "
                "gpuwire-hook: the spec's ld-cache hook would fail every container"
            )
        capabilities = vendor.capabilities(args.capabilities)
        found = vendor.discover(roots, capabilities)
        hook = cdi.hook_program(settings.hook)
        spec = vendor.cdi_spec(
            found,
            hook,
            settings.ldconfig,
            capabilities,
            args.kind or vendor.cdi_kind,
            settings.amd_cards,
            settings.mig_map,
        )
    except (cdi.CdiError, nvidia.CapabilityError) as exc:  # a flag's value
        raise exits.CommandError(str(exc), exits.USAGE) from None
    except (config.ConfigError, VendorError, mig.MigError, OSError) as exc:
        raise exits.CommandError(str(exc)) from None  # the config, the driver, the MIG map
    text = render(spec, fmt)
    if not args.output:
        sys.stdout.write(text)
        return 0
    path = Path(args.output).absolute()
    names = ", ".join(d["name"] for d in spec["devices"])
    if path.exists() and path.read_text() == text:
        print(f"no change: {path} already holds this spec (devices {names})")
        return 0
    containerd_config.write([containerd_config.Change(path, None, text)])
    print(f"wrote {path}: cdiVersion {spec['cdiVersion']}, kind {spec['kind']}, devices {names}")
    return 0
