"""`gpuwire` command line: a table of subcommands, each imported only when it runs.

The contract package must not depend on the components, and `gpuwire-hook` must start in
milliseconds, so the table names modules as strings and nothing is imported up front.
Each target is `module:function`, called with the remaining arguments, returning an exit code.
No traceback reaches a user: an error that carries an exit code (`gpuwire.exits`) is its
one line and that code; anything else is a bug, said as such (exit 70), with the traceback
only where GPUWIRE_DEBUG is set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

from gpuwire import exits

COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("webhook", "serve"), "webhook.cli:serve", "run the admission webhook over TLS"),
    (("mutate",), "webhook.cli:mutate", "print a pod as the webhook would mutate it"),
    (
        ("grant", "verify"),
        "runtime_hook.setup.cli:grant_verify",
        "explain whether a container spec's grant holds",
    ),
    (("grant",), "gpuwire.grant:main", "print the GPUWIRE_GRANT line for a container"),
    (
        ("cdi", "generate"),
        "runtime_hook.setup.cli:cdi_generate",
        "write a CDI spec for this node's GPUs",
    ),
    (
        ("containerd", "configure"),
        "runtime_hook.setup.cli:containerd_configure",
        "add the gpuwire runtime to containerd",
    ),
    (
        ("containerd", "unconfigure"),
        "runtime_hook.setup.cli:containerd_unconfigure",
        "take gpuwire's drop-in out of containerd's config",
    ),
    (("device-plugin", "serve"), "deviceplugin.cli:serve", "run the kubelet device plugin"),
    (("dra", "serve"), "deviceplugin.cli:dra_serve", "run the kubelet DRA plugin (ResourceSlices)"),
    (
        ("node", "advertise"),
        "deviceplugin.cli:advertise",
        "patch GPU capacity into a node without a plugin",
    ),
    (("node", "label"), "deviceplugin.cli:label", "write GPU labels on this node"),
    (
        ("node", "unlabel"),
        "deviceplugin.cli:unlabel",
        "remove gpuwire's labels and annotations from this node",
    ),
    (
        ("certs", "generate"),
        "certs.cli:generate",
        "write a CA and serving certificate to a directory",
    ),
    (("certs", "ensure"), "certs.cli:ensure", "create or renew the webhook's Secret and caBundle"),
    (("inventory",), "inventory.cli:main", "which pod holds which GPU, on every node"),
    (("sim", "node"), "gpuwire.sim:main", "write a simulated GPU node"),
    (("sim", "fault"), "gpuwire.sim:fault_main", "inject an XID event on a simulated GPU"),
    (("sim", "mig"), "gpuwire.sim:mig_main", "create or destroy MIG devices on a simulated node"),
)


def resolve(target: str) -> Callable[[list[str]], int]:
    module, _, function = target.partition(":")
    func: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
    return func


def version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    from importlib import metadata  # only here: it costs every command ~10 ms to import

    try:
        return metadata.version("gpuwire")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed)"


def usage() -> str:
    width = max(len(" ".join(words)) for words, _, _ in COMMANDS)
    lines = [f"  gpuwire {' '.join(words):<{width}}  {summary}" for words, _, summary in COMMANDS]
    return (
        "usage: gpuwire COMMAND [ARGS]   (gpuwire COMMAND --help: its options; "
        "gpuwire --version)\n\ncommands:\n" + "\n".join(lines) + "\n"
    )


def run(prog: str, command: Callable[[list[str]], int], argv: list[str]) -> int:
    """`command(argv)`, its errors said in one line on stderr with their exit code."""
    try:
        return command(argv)
    except KeyboardInterrupt:
        return 130  # as a shell reports SIGINT
    except Exception as exc:
        code = exits.code_of(exc)
        if code is not None:
            sys.stderr.write(f"{prog}: {exc}\n")
            return code
        if os.environ.get(exits.DEBUG_ENV):
            raise
        sys.stderr.write(
            f"{prog}: internal error: {type(exc).__name__}: {exc}\n"
            f"(a bug in gpuwire {version()}: run again with {exits.DEBUG_ENV}=1 for the "
            "traceback, and report it)\n"
        )
        return exits.INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if args[0] in ("-V", "--version", "version"):
        sys.stdout.write(f"gpuwire {version()}\n")
        return 0
    for words, target, _ in COMMANDS:
        if tuple(args[: len(words)]) == words:
            prog = "gpuwire " + " ".join(words)

            def command(rest: list[str], target: str = target) -> int:
                return resolve(target)(rest)  # imported inside `run`: its failure said too

            return run(prog, command, args[len(words) :])
    sys.stderr.write(f"gpuwire: unknown command {' '.join(args[:2])!r}\n\n{usage()}")
    return exits.USAGE


if __name__ == "__main__":
    sys.exit(main())
