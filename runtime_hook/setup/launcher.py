"""Launchers for gpuwire-runtime and gpuwire-hook that start fast.

containerd calls the runtime binary four times per container (create, start, delete twice)
and a kubelet waits for the first two. pip's console scripts start Python with `site`
(~4 ms: site-packages scanned, `.pth` files run) on every one of them. The launchers:

- `gpuwire-runtime` is a POSIX shell script (`gpuwire-runtime.sh` beside this module). Python
  (`runtime_hook.start.shim`) starts only for `create`/`run` of a bundle whose `config.json`
  may ask for a GPU, and for `delete` of a container that has a record
  (`runtime_hook.start.recording`); every other call execs the runtime named in the gpuwire
  config directly, with its arguments untouched. It parses the arguments as the shim does
  (`shim.is_create`, `shim.flag_value`; any `delete` and the last argument, of which
  `recording.deleted` is a special case), reads the config only in its
  plain form (`key = "value"` lines of known keys with valid values, comments, blank lines)
  and leaves everything else (any other TOML, a bad value, a runtime it cannot find, a
  container id the records refuse) to Python, which answers as before. A container may ask
  for a GPU only if its config.json names `NVIDIA_VISIBLE_DEVICES` or an allocation mount;
  one `grep` finds either, or a JSON escape that could spell them.
- `gpuwire-hook` is a shell script (`gpuwire-hook.sh`) that runs Python at once (it has
  work to do whenever it is called).

An install with no Python where the launchers run (`python` None, `--resident-only`: the
image's, whose resident runs from the image's own Python, docs/runtime.md, "No Python on the
host") writes them with none: every Python part goes to the resident, and gpuwire-call waits
up to `RESIDENT_WAIT` for one that serves it, then fails the call (a create, a hook); a call
that is no create runs the runtime itself where no resident answers.

Both scripts are package data, written out with the Python, its code and gpuwire-call filled
into their first assignment line; every word they share with the shim and the config is
spelled out in them, and tests hold those words to the Python's. Where a C compiler can
build it, `gpuwire-call` (runtime_hook/setup/call.c) goes beside them and both hand their
Python part to the resident gpuwire (runtime_hook.start.resident), which has it loaded
already; the Python command line is what `gpuwire-call` runs where no resident answers.
`gpuwire-call` is built with the hook launcher's settings compiled in, so that a CDI spec's
hook names it directly (`gpuwire.cdi.hook_program`): called as `gpuwire-hook` it does what
the launcher does, without starting /bin/sh first, and the ld-cache hook's work itself in C
where it can (`ldcache.c`, with the cache's generator string and size limit compiled in from
`runtime_hook.injection.ldcache`, so that both write the same file).

Python runs as `python -IS` with the directory that holds gpuwire written in: `-I` keeps
`PYTHON*` variables and the user's site-packages out of a program that runs as root, `-S`
skips `site`. The node side imports only the standard library and gpuwire. A run lasts
milliseconds, so the launchers turn the cyclic garbage collector off (it would only walk
the freshly imported modules), and end with `os._exit` once their output is flushed:
tearing down an interpreter with the injection's modules loaded costs ~2 ms, on every GPU
container start, for nothing (every file it wrote is closed by then).

    python -I -m runtime_hook.setup.launcher [--resident-only] /usr/local/libexec/gpuwire

writes both there (`-I`: the gpuwire that is installed, not a source tree in the working
directory); point containerd's `BinaryName` at that `gpuwire-runtime`. The image does this,
`--resident-only`, into `/opt/gpuwire/<version>/libexec` (Containerfile,
deploy/node/install-node).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwire import atomicfile, cdi, ldsocache
from runtime_hook.injection import ldcache
from runtime_hook.start import resident

RUNTIME, HOOK = "gpuwire-runtime", "gpuwire-hook"
HERE = os.path.dirname(os.path.abspath(__file__))
# The scripts' assignment line that the install fills in.
SETTINGS = "python=python3 code='' call='' socket='' token=''\n"
# What a launcher runs with `python -IS -c`, then its own path and arguments.
PYTHON_CODE = (
    "import gc, os, sys; gc.disable(); del sys.argv[0]; sys.path.insert(0, {path!r}); "
    "from {module} import main; status = main(); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)"
)
CALL = cdi.CALL
# How long gpuwire-call waits for a resident where there is no Python to fall back to: a
# resident's restart or an upgrade's handover takes seconds; a CDI spec's hook is killed
# after cdi.HOOK_TIMEOUT (30 s), and the wait must end before, with the hook's own message.
RESIDENT_WAIT = 20.0
CALL_SOURCE = os.path.join(HERE, "call.c")
# what gpuwire-call is built from: its own source, and the ld-cache hook in C
CALL_SOURCES = (CALL_SOURCE, os.path.join(HERE, "ldcache.c"))


@dataclass(frozen=True)
class Call:
    """gpuwire-call and the socket of the resident gpuwire it asks (runtime_hook.start.resident)."""

    call: str
    socket: str


def python_code(path: str, module: str) -> str:
    """`module.main()` with gpuwire's directory `path` first, as `python -IS -c` runs it."""
    return PYTHON_CODE.format(path=path, module=module)


def render(name: str, python: str | None, path: str, call: Call | None = None) -> str:
    """The launcher `name` (RUNTIME or HOOK) for this interpreter and gpuwire directory,
    asking the resident through `call` first where one is given; `python` None: the
    resident alone (`call` then given)."""
    with open(os.path.join(HERE, f"{name}.sh")) as f:
        script = f.read()
    if script.count(SETTINGS) != 1:
        raise ValueError(f"{name}.sh has no single line {SETTINGS.strip()!r} to fill in")
    module = "runtime_hook.start.shim" if name == RUNTIME else "runtime_hook.start.hook"
    if python is None and call is None:
        raise ValueError("a launcher without Python needs gpuwire-call")
    values = {
        "python": python or "",
        "code": python_code(path, module) if python else "",
        "call": call.call if call else "",
        "socket": call.socket if call else "",
        "token": path if call else "",
    }
    settings = " ".join(f"{key}={shlex.quote(value)}" for key, value in values.items())
    return script.replace(SETTINGS, settings + "\n")


def c_string(value: str) -> str:
    """`value` as a C string literal, every byte escaped (nothing in it can end the literal)."""
    return '"' + "".join(f"\\{byte:03o}" for byte in os.fsencode(value)) + '"'


def hook_defines(
    python: str | None, path: str, socket: str, wait: float = RESIDENT_WAIT
) -> list[str]:
    """What gpuwire-call needs to stand in for the hook launcher (call.c, `gpuwire-hook`
    mode): the settings `render` writes into gpuwire-hook.sh for the same install (`python`
    None: none, the resident alone), and how long it waits for a resident then."""
    values = {
        "HOOK_SOCKET": socket,
        "HOOK_TOKEN": path,
        "HOOK_PYTHON": python or "",
        "HOOK_CODE": python_code(path, "runtime_hook.start.hook") if python else "",
        "HOOK_GENERATOR": ldcache.GENERATOR.decode(),  # the cache ldcache.c writes is Python's
    }
    defines = [f"-D{name}={c_string(value)}" for name, value in values.items()]
    limits = {
        "HOOK_MAX_CACHE": ldcache.MAX_CACHE,
        "HOOK_MAX_ENTRIES": ldsocache.MAX_ENTRIES,
        "WAIT_MS": round(wait * 1000),
    }
    return [*defines, *(f"-D{name}={value}" for name, value in limits.items())]


def build_call(directory: str, defines: Sequence[str] = ()) -> str | None:
    """gpuwire-call compiled into `directory` (static: it runs whatever the host's glibc),
    with `defines` (`hook_defines`); None, and why on stderr, where no C compiler can."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    target = os.path.join(directory, CALL)
    staging = f"{target}.{os.getpid()}.tmp"
    if compiler is not None:
        built = subprocess.run(
            [compiler, "-O2", "-static", "-s", *defines, "-o", staging, *CALL_SOURCES],
            capture_output=True,
            text=True,
        )
        if built.returncode == 0:
            os.chmod(staging, 0o755)  # noqa: S103 - an executable, like the launchers
            os.rename(staging, target)
            return target
        reason = built.stderr.strip().splitlines()[-1:] or [f"status {built.returncode}"]
    else:
        reason = ["no C compiler (cc, or $CC)"]
    sys.stderr.write(
        f"gpuwire: {CALL} not built ({reason[0]}): every GPU start runs Python from the start\n"
    )
    return None


class LauncherError(RuntimeError):
    """Launchers that could not be written as asked; the message says why."""


def install(
    directory: str,
    python: str | None = sys.executable,
    socket: str | None = resident.DEFAULT_SOCKET,
    runs_from: str | None = None,
    wait: float = RESIDENT_WAIT,
) -> list[str]:
    """Write both launchers into `directory`, asking the resident gpuwire on `socket` first
    where gpuwire-call can be built (`socket` None: Python only; `python` None: the resident
    only, waited for up to `wait` seconds); returns the launchers' paths (runtime, hook).
    `runs_from`: where the directory will be when they run, if it is copied elsewhere (as
    `python` names the interpreter there)."""
    package_parent = resident.token()
    os.makedirs(directory, exist_ok=True)
    call = None
    defines = hook_defines(python, package_parent, socket or "", wait)
    if socket and (built := build_call(directory, defines)):
        call = Call(os.path.join(runs_from, CALL) if runs_from else built, socket)
    elif python is None:
        raise LauncherError(f"no launchers without Python unless {CALL} is built (a socket, cc)")
    else:  # an earlier install's would still answer CDI specs' hooks (gpuwire.cdi)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, CALL))
    written = []
    for name in (RUNTIME, HOOK):
        path = os.path.join(directory, name)
        # an executable, root-owned like its directory
        atomicfile.replace(path, render(name, python, package_parent, call).encode(), 0o755)
        written.append(path)
    return written


if __name__ == "__main__":
    args = sys.argv[1:]
    socket = resident.DEFAULT_SOCKET
    if args[:1] == ["--socket"] and len(args) > 1:
        socket, args = args[1], args[2:]
    only = args[:1] == ["--resident-only"]
    args = args[only:]
    if len(args) != 1 or not args[0].startswith("/") or not socket.startswith("/"):
        sys.exit(
            "usage: python -m runtime_hook.setup.launcher [--socket /RESIDENT.sock] "
            "[--resident-only] /ABSOLUTE/DIR"
        )
    try:
        print("\n".join(install(args[0], python=None if only else sys.executable, socket=socket)))
    except LauncherError as exc:
        sys.exit(f"python -m runtime_hook.setup.launcher: {exc}")
