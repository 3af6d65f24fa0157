"""Launchers for gpuwire-runtime and gpuwire-hook that start fast.

containerd calls the runtime binary four times per container (create, start, delete twice)
and a kubelet waits for the first two. pip's console scripts start Python with `site`
(~4 ms: site-packages scanned, `.pth` files run) on every one of them. The launchers:

- `gpuwire-runtime` is a POSIX shell script. Python (`runtime_hook.shim`) starts only for
  `create`/`run` of a bundle whose `config.json` may ask for a GPU, and for `delete` of a
  container that has a record (`runtime_hook.holding`); every other call execs the runtime
  named in the gpuwire config directly, with its arguments untouched. It parses the
  arguments as the shim does (`shim.is_create`, `shim.flag_value`; any `delete` and the last
  argument, of which `holding.deleted` is a special case), reads the config only in its
  plain form (`key = "value"` lines of known keys with valid values, comments, blank lines)
  and leaves everything else (any other TOML, a bad value, a runtime it cannot find, a
  container id the records refuse) to Python, which answers as before. A container may ask
  for a GPU only if its config.json names `NVIDIA_VISIBLE_DEVICES` or an allocation mount;
  one `grep` finds either, or a JSON escape that could spell them.
- `gpuwire-hook` is a shell script that runs Python at once (it has work to do whenever
  it is called).

Where a C compiler can build it, `gpuwire-call` (runtime_hook/call.c) goes beside them and
both hand their Python part to the resident gpuwire (runtime_hook.resident), which has it
loaded already; the Python command line is what `gpuwire-call` runs where no resident
answers.

Python runs as `python -IS` with the directory that holds gpuwire written in: `-I` keeps
`PYTHON*` variables and the user's site-packages out of a program that runs as root, `-S`
skips `site`. The node side imports only the standard library and gpuwire. A run lasts
milliseconds, so the launchers turn the cyclic garbage collector off (it would only walk
the freshly imported modules), and end with `os._exit` once their output is flushed:
tearing down an interpreter with the injection's modules loaded costs ~2 ms, on every GPU
container start, for nothing (every file it wrote is closed by then).

    python -I -m runtime_hook.launcher /usr/local/libexec/gpuwire

writes both there (`-I`: the gpuwire that is installed, not a source tree in the working
directory); point containerd's `BinaryName` at that `gpuwire-runtime`. The image does this
into `/opt/gpuwire/<version>/libexec` (Containerfile, deploy/node/install-node).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

from gpuwire import allocation, atomicfile, nvidia, records
from runtime_hook import config, resident, shim

RUNTIME, HOOK = "gpuwire-runtime", "gpuwire-hook"
# JSON escapes that could spell a character of the markers below (`\/`, `\u002f`, `\u0041`
# ... `\u007f`); Go's own escapes (`\u0026` for `&`, `\u003c`, `\u003e`) are not among them.
ESCAPES = r"\\/|\\u00(2[Ff]|[4-7][0-9A-Fa-f])"
MARKERS = (nvidia.VISIBLE_DEVICES_ENV, allocation.CONTAINER_DIR + "/")
# Keys with a value the shell checks itself; every other key takes an absolute path.
OWN_CHECKS = {"trust": " | ".join(config.TRUST_MODES), "log": "stderr | /*", "runtime": "?*"}
# Keys whose value the shell uses, and the variable that holds it.
VARIABLES = {"runtime": "runtime", "records-dir": "records"}

RUNTIME_SCRIPT = """\
#!/bin/sh
# gpuwire-runtime launcher (runtime_hook/launcher.py): Python only for a create that may
# ask for a GPU, the configured runtime exec'd directly for everything else.
shim() {{
	exec {command} "$0" "$@"
}}
# exec $1 with the other arguments if it is the runtime's first executable candidate
run() {{
	path=$1
	shift
	if [ -x "$path" ] && [ ! -d "$path" ]; then
		case ${{path##*/}} in {runtime_name}) shim "$@" ;; esac
		case $0 in */*) if [ "$path" -ef "$0" ]; then shim "$@"; fi ;; esac
		exec "$path" "$@"
	fi
}}

create= bundle= found= wanted= previous= deleting= last=
for arg do
	if [ -n "$wanted" ]; then bundle=$arg wanted=; fi
	case $previous in {bundle_flags}) ;; *)
		case $arg in {creating}) create=1 ;; esac ;;
	esac
	case $arg in delete) deleting=1 ;; esac
	if [ -z "$found" ]; then
		case $arg in
		{bundle_flags_eq}) found=1 bundle=${{arg#*=}} ;;
		{bundle_flags}) found=1 wanted=1 ;;
		esac
	fi
	previous=$arg last=$arg
done
if [ -n "$create" ]; then
	grep -qsE -e '{pattern}' -- "${{bundle:-.}}/config.json"
	[ $? -eq 1 ] || shim "$@"
fi

config=${{{env}:-{default_config}}}
runtime=runc records={records_dir} odd=
if [ -f "$config" ] && [ -r "$config" ]; then
	seen=' '
	while IFS= read -r line || [ -n "$line" ]; do
		case $line in
		'' | '#'*) continue ;;
		*[!\\ -~]* | *\\\\*) odd=1 ;;
		[a-z]*' = "'*'"') ;;
		*) odd=1 ;;
		esac
		key=${{line%%' = "'*}} value=${{line#*' = "'}}
		value=${{value%'"'}}
		case $value in *'"'*) odd=1 ;; esac
		case $seen in *" $key "*) odd=1 ;; esac
		seen="$seen$key "
		case $key in
{key_checks}
		*) odd=1 ;;
		esac
		[ -z "$odd" ] || break
	done <"$config"
elif [ -e "$config" ] || [ -n "${{{env}-}}" ]; then
	odd=1
fi
[ -z "$odd" ] || shim "$@"
if [ -n "$deleting" ]; then
	case $last in '' | .* | *[!A-Za-z0-9_+.-]*) shim "$@" ;; esac
	[ "${{#last}}" -le 250 ] || shim "$@"
	if [ -e "$records/$last" ] || [ -L "$records/$last" ]; then shim "$@"; fi
fi

case $runtime in
*/*) run "$runtime" "$@" ;;
*)
	set -f
	IFS=:
	for dir in $PATH; do
		[ -z "$dir" ] || run "$dir/$runtime" "$@"
	done
	;;
esac
shim "$@"
"""

HOOK_SCRIPT = """\
#!/bin/sh
# gpuwire-hook launcher (runtime_hook/launcher.py): Python, or the resident gpuwire first.
exec {command} "$0" "$@"
"""
# What a launcher runs with `python -IS -c`, then its own path and arguments.
PYTHON_CODE = (
    "import gc, os, sys; gc.disable(); del sys.argv[0]; sys.path.insert(0, {path!r}); "
    "from {module} import main; status = main(); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(status)"
)
CALL = "gpuwire-call"
CALL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "call.c")


def _alternatives(words: tuple[str, ...]) -> str:
    return " | ".join(words)


def _key_checks() -> str:
    """One `case` arm per config key: what `config.from_table` accepts for it."""
    arms = []
    for key in config.KEYS:
        accepted = OWN_CHECKS.get(key, "/*")
        action = f"{VARIABLES[key]}=$value" if key in VARIABLES else ":"
        arms.append(f"\t\t{key}) case $value in {accepted}) {action} ;; *) odd=1 ;; esac ;;")
    return "\n".join(arms)


class Call:
    """gpuwire-call and the socket of the resident gpuwire it asks (runtime_hook.resident)."""

    __slots__ = ("call", "socket")

    def __init__(self, call: str, socket: str) -> None:
        self.call = call
        self.socket = socket

    def entry(self, kind: str, python: str, path: str) -> str:
        """The start of the command line: gpuwire-call, then the Python it falls back to."""
        words = (self.call, self.socket, path, kind)
        return " ".join(shlex.quote(w) for w in words) + " $(($# + 1)) " + shlex.quote(python)


def python_code(path: str, module: str) -> str:
    """`module.main()` with gpuwire's directory `path` first, as `python -IS -c` runs it."""
    return PYTHON_CODE.format(path=path, module=module)


def command(python: str, path: str, kind: str, module: str, call: Call | None) -> str:
    """What a launcher execs, for the shell: Python running `module.main`, with
    gpuwire-call in front of it where one was built."""
    start = call.entry(kind, python, path) if call else shlex.quote(python)
    return f"{start} -IS -c {shlex.quote(python_code(path, module))}"


def render_runtime(python: str, path: str, call: Call | None = None) -> str:
    """The `gpuwire-runtime` shell script for this interpreter and gpuwire directory."""
    if not all(c.isalnum() or c in "_/" for c in "".join(MARKERS)):
        raise ValueError(f"markers {MARKERS} need escaping for grep -E")
    flags = shim.BUNDLE_FLAGS
    return RUNTIME_SCRIPT.format(
        command=command(python, path, "runtime", "runtime_hook.shim", call),
        bundle_flags=_alternatives(flags),
        bundle_flags_eq=_alternatives(tuple(f"{f}=*" for f in flags)),
        creating=_alternatives(shim.CREATING),
        pattern="|".join((*MARKERS, ESCAPES)),
        env=config.ENV,
        default_config=config.DEFAULT_PATH,
        records_dir=shlex.quote(records.DEFAULT_DIR),
        key_checks=_key_checks(),
        runtime_name=RUNTIME,
    )


def render_hook(python: str, path: str, call: Call | None = None) -> str:
    return HOOK_SCRIPT.format(command=command(python, path, "hook", "runtime_hook.hook", call))


def build_call(directory: str) -> str | None:
    """gpuwire-call compiled into `directory` (static: it runs whatever the host's glibc);
    None, and why on stderr, where no C compiler can build it."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    target = os.path.join(directory, CALL)
    staging = f"{target}.{os.getpid()}.tmp"
    if compiler is not None:
        built = subprocess.run(
            [compiler, "-O2", "-static", "-s", "-o", staging, CALL_SOURCE],
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


def install(
    directory: str,
    python: str = sys.executable,
    socket: str | None = resident.DEFAULT_SOCKET,
    runs_from: str | None = None,
) -> list[str]:
    """Write both launchers into `directory`, asking the resident gpuwire on `socket` first
    where gpuwire-call can be built (`socket` None: Python only); returns the launchers'
    paths (runtime, hook). `runs_from`: where the directory will be when they run, if it
    is copied elsewhere (as `python` names the interpreter there)."""
    package_parent = resident.token()
    os.makedirs(directory, exist_ok=True)
    call = None
    if socket and (built := build_call(directory)):
        call = Call(os.path.join(runs_from, CALL) if runs_from else built, socket)
    written = []
    for name, render in ((RUNTIME, render_runtime), (HOOK, render_hook)):
        path = os.path.join(directory, name)
        # an executable, root-owned like its directory
        atomicfile.replace(path, render(python, package_parent, call).encode(), 0o755)
        written.append(path)
    return written


if __name__ == "__main__":
    args = sys.argv[1:]
    socket = resident.DEFAULT_SOCKET
    if args[:1] == ["--socket"] and len(args) > 1:
        socket, args = args[1], args[2:]
    if len(args) != 1 or not args[0].startswith("/") or not socket.startswith("/"):
        sys.exit("usage: python -m runtime_hook.launcher [--socket /RESIDENT.sock] /ABSOLUTE/DIR")
    print("\n".join(install(args[0], socket=socket)))
