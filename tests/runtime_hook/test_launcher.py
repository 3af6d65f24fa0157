"""The shell launcher of gpuwire-runtime decides as the Python shim would, or asks it.

It starts Python only for a create that may ask for a GPU or the delete of a container with
a record, and otherwise execs the runtime the config names. Each test runs the launcher with
stand-ins for Python and the runtime that print how they were called, and compares with what
`runtime_hook.shim`, `runtime_hook.holding` and `runtime_hook.config` decide for the same
arguments and file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwire import records
from runtime_hook import config, holding, launcher, shim
from tests.conftest import requires_binary, requires_root
from tests.runtime_support import Lab, container_spec, cri_annotations, grant_for
from tests.waiting import until

SHELLS = ("dash", "bash")  # Debian's /bin/sh, and RHEL's
# Stand-ins: each prints who it is and its arguments NUL-separated, then its stdin.
PYTHON_STANDIN = '#!/bin/sh\nshift 3\nprintf "%s\\0" python "$@"\ncat\n'  # drops -IS -c CODE
RUNTIME_STANDIN = '#!/bin/sh\nprintf "%s\\0" "$0" "$@"\ncat\n'


class Site:
    """A launcher written for stand-ins, in a directory that also holds bundles."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        standins = {"python": PYTHON_STANDIN, "fake-runc": RUNTIME_STANDIN, "runc": RUNTIME_STANDIN}
        for name, text in standins.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.launcher = self.bin / launcher.RUNTIME
        self.launcher.write_text(launcher.render_runtime(str(self.bin / "python"), "/opt/x"))
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
    gone = holding.deleted(args)
    return gone is not None and (not records.valid_id(gone) or (site.records / gone).exists())


WORDS = ["create", "run", "start", "delete", "--bundle", "-bundle", "-b", "gpu", "plain"]
WORDS += ["--bundle=gpu", "-b=plain", "-bundle=", "--bundle=gpu=x", "--root", "/r", "a b", ""]
WORDS += ["held", "--force", "x", ".x"]


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
    from runtime_hook import spec as ocispec

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


@requires_root()
@requires_binary("runc")
def test_only_a_gpu_create_starts_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launchers written for a Python that does not exist: every call but a GPU create
    still works, so none of them started Python."""
    from gpuwire.lab.rootfs import Bundle

    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv(config.ENV, str(lab.config))
    runtime, _ = launcher.install(str(tmp_path / "libexec"), python="/nonexistent/python3")
    version = subprocess.run([runtime, "--version"], capture_output=True, text=True)
    assert version.returncode == 0
    assert version.stdout.startswith("runc version")
    plain = Bundle.create(tmp_path / "plain", ["echo", "started"], {"A": "1"})
    out = plain.run(runtime=runtime)  # run, then runc's delete
    assert (out.returncode, out.stdout) == (0, "started\n"), out.stderr
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    gpu = Bundle.create(tmp_path / "gpu", ["true"], env)
    assert gpu.run(runtime=runtime).returncode == 127  # exec /nonexistent/python3


@requires_root()
@requires_binary("runc")
def test_a_gpu_containers_record_goes_with_its_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Create, start and delete through the launcher, as containerd calls it: the record
    the shim writes at create is removed at delete, which the launcher hands to Python."""
    from gpuwire.lab.rootfs import Bundle

    lab = Lab(tmp_path / "lab")
    monkeypatch.setenv(config.ENV, str(lab.config))
    runtime, _ = launcher.install(str(tmp_path / "libexec"))
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "GPUWIRE_GRANT": grant_for(lab.keys, "0")}
    bundle = Bundle.create(tmp_path / "gpu", ["true"], env, cri_annotations())
    root, cid = str(tmp_path / "runc"), f"gpuwire-{uuid.uuid4().hex[:12]}"

    def call(*args: str) -> None:
        """Output to a file: the container inherits it (a pipe would not see EOF)."""
        with tempfile.TemporaryFile("w+") as output:
            command = [runtime, "--root", root, *args]
            code = subprocess.call(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
            output.seek(0)
            assert code == 0, output.read()

    try:
        call("create", "--bundle", str(bundle.path), cid)
        assert (lab.records / cid).exists()
        call("start", cid)
        until(lambda: json.loads(runc_state(root, cid))["status"] == "stopped")
        call("delete", cid)
        assert not (lab.records / cid).exists()
    finally:
        subprocess.run(["runc", "--root", root, "delete", "--force", cid], capture_output=True)


def runc_state(root: str, cid: str) -> str:
    return subprocess.run(
        ["runc", "--root", root, "state", cid], capture_output=True, text=True, check=True
    ).stdout
