"""`gpuwire containerd configure` / `unconfigure`, `cdi generate` and `grant verify` for a host
mounted at ROOT, from a Python that is not the host's.

The host has no Python of gpuwire's (docs/runtime.md, "No Python on the host"): the node
installer runs these in the gpuwire-node DaemonSet's container, from the image, with the
host's root mounted at /host. They name, read, write and run what the host has at the paths
the host gives them (containerd's config and every file it imports, the driver's files as
discovery finds them through /proc/self/fd, `containerd` and `ctr`), so they must run with
the host's root as their own: everything a command imports is imported here first, then
this process chroots into ROOT and imports nothing more (nothing of the host's is loaded,
and the image's files are no longer there to load).

    python -I -m runtime_hook.setup.onhost ROOT containerd configure ARGS...
    python -I -m runtime_hook.setup.onhost ROOT containerd unconfigure ARGS...
    python -I -m runtime_hook.setup.onhost ROOT cdi generate ARGS...
    python -I -m runtime_hook.setup.onhost ROOT grant verify ARGS...
"""

from __future__ import annotations

import importlib
import os
import sys

from gpuwire import cli, exits
from runtime_hook.start import MODULES, STDLIB

# The commands that run this way, and what each imports only as it runs (in a function),
# besides the start path's modules (`grant verify` and discovery run them, mig's codec
# included) and what a bug's report imports.
COMMANDS = {
    ("containerd", "configure"): (),
    ("containerd", "unconfigure"): (),
    ("cdi", "generate"): ("gpuwire.driver", "gpuwire.mig", "gpuwire.nvidia", "json", "yaml"),
    ("grant", "verify"): (),
}
ALWAYS = (*STDLIB, *MODULES, "importlib.metadata")
USAGE = "usage: python -m runtime_hook.setup.onhost ROOT {}\n".format(
    " | ".join(" ".join(words) + " ..." for words in COMMANDS)
)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    words = tuple(args[1:3])
    if len(args) < 3 or words not in COMMANDS or not args[0].startswith("/"):
        sys.stderr.write(USAGE)
        return exits.USAGE
    root, rest = args[0], args[3:]
    prog = "gpuwire " + " ".join(words)
    (target,) = [t for w, t, _ in cli.COMMANDS if w == words]
    command = cli.resolve(target)
    for name in (*ALWAYS, *COMMANDS[words]):
        importlib.import_module(name)
    try:
        os.chroot(root)
    except OSError as exc:
        sys.stderr.write(f"{prog}: cannot run on the host at {root}: {exc.strerror}\n")
        return exits.INPUT
    os.chdir("/")
    sys.path.clear()
    sys.path_importer_cache.clear()
    return cli.run(prog, command, rest)


if __name__ == "__main__":
    sys.exit(main())
