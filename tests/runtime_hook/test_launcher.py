"""The shell launcher of gpuwire-runtime decides as the Python shim would, or asks it.

It starts Python only for a create that may ask for a GPU or the delete of a container with
a record, and otherwise execs the runtime the config names. Each test runs the launcher with
stand-ins for Python and the runtime that print how they were called, and compares with what
`runtime_hook.start.shim`, `runtime_hook.start.recording` and `runtime_hook.start.config`
decide for the same arguments and file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwire import allocation, records, requirements
from gpuwire.vendor import VENDORS
from runtime_hook.setup import launcher
from runtime_hook.start import config, recording, shim
from testbed.lab import container_spec

SHELLS = ("dash", "bash")  # Debian's /bin/sh, and RHEL's
# Stand-ins: each prints who it is and its arguments NUL-separated, then its stdin.
PYTHON_STANDIN = '#!/bin/sh\nshift 3\nprintf "%s\\0" python "$@"\ncat\n'  # drops -IS -c CODE
RUNTIME_STANDIN = '#!/bin/sh\nprintf "%s\\0" "$0" "$@"\ncat\n'
# gpuwire-call where no resident answers: its fallback where it has one, else it would wait
# (and then fail): it says so as `call` with the program's arguments.
CALL_STANDIN = """#!/bin/sh
n=$4
shift 4
if [ $# -gt "$n" ]; then exec "$@"; fi
printf "%s\\0" call "$@"
cat
"""


class Site:
    """A launcher written for stand-ins, in a directory that also holds bundles; `python`
    False: written as the image writes it, for the resident alone (gpuwire-call, no Python)."""

    def __init__(self, root: Path, python: bool = True) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        standins = {
            "python": PYTHON_STANDIN,
            "fake-runc": RUNTIME_STANDIN,
            "runc": RUNTIME_STANDIN,
            launcher.CALL: CALL_STANDIN,
        }
        for name, text in standins.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.launcher = self.bin / launcher.RUNTIME
        call = launcher.Call(str(self.bin / launcher.CALL), "/run/x.sock")
        self.launcher.write_text(
            launcher.render(launcher.RUNTIME, str(self.bin / "python"), "/opt/x")
            if python
            else launcher.render(launcher.RUNTIME, None, "/opt/x", call)
        )
        self.launcher.chmod(0o755)
        self.config = root / "config.toml"
        self.runtime = f"{self.bin}/fake-runc"
        self.records = root / "records"
        self.records.mkdir()
        (self.records / "held").write_text("{}")  # a GPU container's record
        self.config.write_text(f'runtime = "{self.runtime}"\nrecords-dir = "{self.records}"\n')
        for name, env in (("gpu", {"NVIDIA_VISIBLE_DEVICES": "0"}), ("plain", {"A": "1"})):
            (root / name).mkdir()
            (root / name / "config.json").write_text(json.dumps(container_spec(env)))
        (root / "config.json").write_text(json.dumps(container_spec({})))  # the cwd's bundle

    def call(
        self, shell: str, args: list[str], env: dict[str, str] | None = None
    ) -> tuple[str, list[str]]:
        """(the program the launcher ended in: `python` or the runtime's path, its arguments)."""
        base = {"PATH": os.environ["PATH"], config.ENV: str(self.config)}
        out = subprocess.run(
            [shell, str(self.launcher), *args],
            input=b"stdin-data",
            capture_output=True,
            cwd=self.root,
            env=base | (env or {}),
            check=True,
        )
        *fields, rest = out.stdout.split(b"\0")
        assert rest == b"stdin-data"  # the container's stdin reaches the runtime
        program, *argv = (f.decode() for f in fields)
        return program, argv


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return Site(tmp_path_factory.mktemp("launcher"))


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def creates_for_a_gpu(site: Site, args: list[str]) -> bool:
    """Whether the shim has a create to edit: one whose bundle may ask for a GPU (or whose
    config.json cannot be read: the shim reports that)."""
    if not shim.is_create(args):
        return False
    bundle = site.root / (shim.flag_value(args, shim.BUNDLE_FLAGS) or ".")
    try:
        return "NVIDIA_VISIBLE_DEVICES" in (bundle / "config.json").read_text()
    except OSError:
        return True


def forgets(site: Site, args: list[str]) -> bool:
    """Whether the shim has a record to remove, or a container id to complain about."""
    gone = recording.deleted(args)
    return gone is not None and (not records.valid_id(gone) or (site.records / gone).exists())


WORDS = ["create", "run", "start", "delete", "--bundle", "-bundle", "-b", "gpu", "plain"]
WORDS += ["--bundle=gpu", "-b=plain", "-bundle=", "--bundle=gpu=x", "--root", "/r", "a b", ""]
WORDS += ["held", "--force", "x", ".x"]


def settings_of(script: str) -> dict[str, str]:
    """What the install filled into a launcher: python, code, call, socket, token (call
    empty: it runs Python itself, no gpuwire-call in front)."""
    (line,) = [line for line in script.splitlines() if line.startswith("python=")]
    return dict(word.split("=", 1) for word in shlex.split(line))


def script_words() -> list[str]:
    """What gpuwire-runtime.sh must spell as the shim and the config do, each a line of it."""
    flags, creating = " | ".join(shim.BUNDLE_FLAGS), " | ".join(shim.CREATING)
    markers = (
        *(v.visible_env for v in VENDORS),
        requirements.CUDA_VERSION,
        allocation.CONTAINER_DIR + "/",
    )
    assert all(c.isalnum() or c in "_/" for c in "".join(markers))  # nothing grep -E reads
    # JSON escapes that could spell a character of the markers (`\/`, `\u002f`, `\u0041`
    # ... `\u007f`); Go's own escapes (`\u0026` for `&`, `\u003c`, `\u003e`) are not among them.
    escapes = r"\\/|\\u00(2[Ff]|[4-7][0-9A-Fa-f])"
    own = {
        "trust": " | ".join(config.TRUST_MODES),
        "log": "stderr | /*",
        "runtime": "?*",
        "vendor": " | ".join(v.name for v in VENDORS),
        "amd-cards": "true | false",
    }
    kept = {"runtime": "runtime", "records-dir": "records"}  # keys whose value it uses
    arms = [
        f"\t\t{key}) case $value in {own.get(key, '/*')}) "
        f"{f'{kept[key]}=$value' if key in kept else ':'} ;; *) odd=1 ;; esac ;;"
        for key in config.KEYS
    ]
    return [
        f"\t\t\tcase ${{path##*/}} in {launcher.RUNTIME}) return 1 ;; esac",
        f"\tcase $previous in {flags}) ;; *)",
        f"\t\tcase $arg in {creating}) create=1 ;; esac ;;",
        f"\t\t{' | '.join(f'{f}=*' for f in shim.BUNDLE_FLAGS)}) found=1 bundle=${{arg#*=}} ;;",
        f"\t\t{flags}) found=1 wanted=1 ;;",
        f"\tgrep -qsE -e '{'|'.join((*markers, escapes))}' -- \"${{bundle:-.}}/config.json\"",
        f"config=${{{config.ENV}:-{config.DEFAULT_PATH}}}",
        f"runtime=runc records={records.DEFAULT_DIR} odd=",
        *arms,
        f'elif [ -e "$config" ] || [ -n "${{{config.ENV}-}}" ]; then',
    ]


def test_the_script_spells_what_the_shim_and_the_config_spell() -> None:
    """The shell program is a file a linter reads, not a template: its words for the shim's
    flags, the config's keys and values, the records and the GPU markers are written out
    in it, and must be the Python's (a config key added there and not here fails this)."""
    script = (Path(launcher.HERE) / f"{launcher.RUNTIME}.sh").read_text().splitlines()
    assert [w for w in script_words() if w not in script] == []
    assert sum(line.startswith("\t\t") and ") case $value in" in line for line in script) == len(
        config.KEYS
    )


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(WORDS), max_size=7))
@example(["--root", "/r", "delete", "--force", "held"])  # as containerd deletes
@example(["delete", "x"])
@example(["delete", ".x"])
@example(["create", "--bundle", "gpu", "x"])
def test_arguments_are_parsed_as_the_shim_parses_them(
    site: Site, shell: str, args: list[str]
) -> None:
    program, argv = site.call(shell, args)
    if creates_for_a_gpu(site, args) or forgets(site, args):
        assert (program, argv) == ("python", [str(site.launcher), *args])
    elif program == "python":  # also any other `delete ... ID` whose ID has a record
        last = args[-1]
        assert "delete" in args
        assert not records.valid_id(last) or (site.records / last).exists()
    else:
        assert argv == args  # untouched
        assert program == site.runtime


@pytest.fixture(scope="module")
def resident_site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return Site(tmp_path_factory.mktemp("resident-only"), python=False)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(WORDS), max_size=7))
@example(["--root", "/r", "delete", "--force", "held"])  # as containerd deletes
@example(["create", "--bundle", "gpu", "x"])
def test_without_python_only_a_gpu_create_waits_for_the_resident(
    resident_site: Site, shell: str, args: list[str]
) -> None:
    """No Python here: a create the shim would edit goes to the resident alone (gpuwire-call
    with nothing to fall back to: it waits); everything else runs the runtime itself where
    no resident answers, the delete of a GPU container too (gpuwire-call's fallback), with
    its arguments untouched."""
    site = resident_site
    program, argv = site.call(shell, args)
    if creates_for_a_gpu(site, args):
        assert (program, argv) == ("call", [str(site.launcher), *args])
    else:
        assert (program, argv) == (site.runtime, args)


@pytest.mark.parametrize(
    ("env", "routed"),
    [
        (["A=1"], "runtime"),
        (["NVIDIA_VISIBLE_DEVICES=void"], "python"),  # the shim decides what void means
        (["A=&<>"], "runtime"),  # Go writes these as \u0026 \u003c \u003e
        (["NVIDIA\u005fVISIBLE_DEVICES=all"], "python"),  # json.dumps writes this one plainly
    ],
)
def test_gpu_request_is_found_in_the_bundle(
    site: Site, shell: str, tmp_path: Path, env: list[str], routed: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(container_spec(env)))
    program, _ = site.call(shell, ["create", "--bundle", str(tmp_path), "x"])
    assert program == (site.runtime if routed == "runtime" else "python")


@pytest.mark.parametrize(
    "text",
    [
        '{"process": {"env": ["NVIDIA\\u005fVISIBLE_DEVICES=all"]}}',
        '{"process": {"env": ["\\u004eVIDIA_VISIBLE_DEVICES=all"]}}',
        '{"mounts": [{"destination": "\\/run\\/gpuwire\\/allocations\\/' + "a" * 32 + '"}]}',
        '{"mounts": [{"destination": "/run/gpuwire/allocations/' + "a" * 32 + '"}]}',
    ],
)
def test_a_gpu_request_spelt_with_json_escapes_goes_to_the_shim(
    site: Site, shell: str, tmp_path: Path, text: str
) -> None:
    from gpuwire import lightjson
    from runtime_hook.start import spec as ocispec

    assert ocispec.asks_for_gpu(lightjson.loads(text))  # type: ignore[arg-type]
    (tmp_path / "config.json").write_text(text)
    assert site.call(shell, ["create", "--bundle", str(tmp_path), "x"])[0] == "python"


# -- the config file: plain lines are read, anything else is left to Python --------------

VALID = {
    "root": ["/", "/host"],
    "driver-root": ["/run/nvidia/driver"],
    "dev-root": ["/"],
    "proc-root": ["/"],
    "trust": ["granted", "any"],
    "grant-key-dir": ["/etc/gpuwire/keys"],
    "allocation-dir": ["/var/lib/gpuwire/allocations"],
    "runtime": ["fake-runc", "RUNTIME"],  # RUNTIME: the stand-in's absolute path
    "ldconfig": ["/sbin/ldconfig"],
    "hook": ["/usr/libexec/gpuwire-hook"],
    "log": ["stderr", "/var/log/gpuwire.log"],
    "records-dir": ["/run/gpuwire/containers"],
    "mig-map": ["/run/gpuwire/mig/devices"],
    "mps-root": ["/run/gpuwire/mps"],
    "hami-library": ["/usr/local/vgpu/libvgpu.so"],
    "hami-dir": ["/run/gpuwire/hami"],
    "driver-facts": ["/run/gpuwire/facts/driver.json"],
    "vendor": ["nvidia", "amd"],
    "sys-root": ["/"],
    "amd-cards": ["true", "false"],
}
assert set(VALID) == set(config.KEYS)
PLAIN = [f'{k} = "{v}"' for k, values in VALID.items() for v in values] + ["# comment", ""]
ODD = [
    'trust = "sometimes"',  # bad values
    'root = "relative"',
    'runtime = ""',
    'log = "syslog"',
    'colour = "/x"',  # unknown key
    'runtime="fake-runc"',  # valid TOML, not the plain form
    "runtime = 'fake-runc'",
    'runtime = "fake-runc" # the runtime',
    'runtime = "fake\\u002drunc"',
    '  trust = "any"',
    'trust = "any"\r',
    'root = "/h\tx"',
    'root = "/hé"',
    "[table]",
    'runtime = """fake-runc"""',
    "not toml",
]


def resolved(site: Site, text: str) -> str | None:
    """The runtime the shim would exec for `text` as the config file, or None."""
    site.config.write_text(text)
    try:
        settings = config.load(str(site.config))
        return shim.runtime_path(settings.runtime)
    except (config.ConfigError, RuntimeError):
        return None


@pytest.fixture
def own_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """A site whose config file the test changes; its stand-ins come first on PATH."""
    site = Site(tmp_path)
    monkeypatch.setenv("PATH", f"{site.bin}:{os.environ['PATH']}")  # for the shim's lookup
    return site


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PLAIN + ODD), max_size=6))
def test_config_is_read_as_the_shim_reads_it(own_site: Site, shell: str, lines: list[str]) -> None:
    site = own_site
    text = "".join(f"{line}\n" for line in lines).replace("RUNTIME", site.runtime)
    expected = resolved(site, text)
    program, argv = site.call(shell, ["state", "x"])
    if program != "python":  # read by the launcher: exactly what the shim would exec
        assert program == expected
        assert argv == ["state", "x"]
    keys = [line.partition(" ")[0] for line in lines if " = " in line]
    if all(line in PLAIN for line in lines) and len(keys) == len(set(keys)):
        assert program == expected  # a plain file never needs Python


def test_runtime_is_found_on_path_as_the_shim_finds_it(own_site: Site, shell: str) -> None:
    site = own_site
    site.config.write_text('runtime = "fake-runc"\n')
    path = f"/nonexistent::{site.bin}:/usr/bin"
    assert site.call(shell, ["start", "x"], {"PATH": path})[0] == site.runtime
    assert site.call(shell, ["start", "x"], {"PATH": "/usr/bin"})[0] == "python"  # not found
    site.config.write_text('runtime = "gpuwire-runtime"\n')  # itself: the shim says why not
    assert site.call(shell, ["start", "x"], {"PATH": path})[0] == "python"


def test_a_config_named_but_missing_is_left_to_the_shim(
    site: Site, shell: str, tmp_path: Path
) -> None:
    program, _ = site.call(shell, ["start", "x"], {config.ENV: str(tmp_path / "none.toml")})
    assert program == "python"  # a file named by $GPUWIRE_CONFIG must exist: the shim says so


# -- with real runc ---------------------------------------------------------------------
