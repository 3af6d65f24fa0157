"""The gpuwire runtime handler in containerd's configuration, written the way containerd reads it.

containerd loads its main file, then every `imports` entry breadth first, and before 2.1 an
imported file *replaces* each plugin section it names instead of merging into it
(containerd/containerd#5837). So the drop-in carries the whole effective CRI plugin section
with the gpuwire runtime added, and the admin's main file gains nothing but one `imports`
entry: tomlkit round-trips it, comments and layout included.

The core reads files through `Files` (the disk, or a dict in tests) and returns the changes
to make; `containerd config dump`, `ctr oci spec` and argument handling are the shell's job
(`runtime_hook.setup.cli`).
Facts: `nvidia-ctk runtime configure` (NVIDIA/nvidia-container-toolkit
`pkg/config/engine/containerd`), containerd's CRI config docs (`docs/cri/config.md`, CDI from
1.7: `enable_cdi`, `cdi_spec_dirs`), the RuntimeClass of the NVIDIA/k8s-device-plugin README.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
import glob
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import tomlkit
from tomlkit.exceptions import ParseError

from gpuwire import atomicfile
from gpuwire.allocation import OWNER_ANNOTATIONS
from gpuwire.edits import HOOK_ENV
from gpuwire.grant import POD_ANNOTATION, SUBJECT_ANNOTATIONS

# Config version → the plugin whose `containerd.runtimes` table holds runtime handlers.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
NEW_CONFIG_VERSION = 2  # what an absent main file becomes; containerd 2.x migrates it
RUNC_SHIM = "io.containerd.runc.v2"
DEFAULT_CONFIG = Path("/etc/containerd/config.toml")
DROP_IN = "conf.d/99-gpuwire.toml"  # beside the main file
BASE_SPEC = Path("/etc/gpuwire/containerd-base-spec.json")
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
# The grant binds the namespace and container name the runtime writes under these keys, and an
# allocation binds the pod UID and sandbox id: no pod may pass its own values through,
# whatever order containerd applies annotations in.
PROTECTED_ANNOTATIONS = (
    *(key for pair in SUBJECT_ANNOTATIONS for key in pair),
    *(key for pair in OWNER_ANNOTATIONS for key in pair),
)
_HANDLER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RuntimeClass `handler`


class ContainerdConfigError(ValueError):
    """A containerd config gpuwire will not edit; the message names the file and the value."""


class Files(Protocol):
    """The files the core reads: the disk, or the disk as it will be after writing."""

    def read(self, path: Path) -> str | None: ...  # None: no such file

    def glob(self, pattern: str) -> list[Path]: ...


def _is_glob(entry: str) -> bool:
    return any(c in entry for c in "*?[")


def _matches(path: Path, pattern: str) -> bool:
    """Go's filepath.Match on whole paths: `*` stays within one path element."""
    return PurePosixPath(path).match(os.path.abspath(pattern))


class Disk:
    def read(self, path: Path) -> str | None:
        try:
            return path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ContainerdConfigError(f"{path}: cannot read: {exc.strerror}") from None

    def glob(self, pattern: str) -> list[Path]:
        return [Path(p) for p in sorted(glob.glob(pattern))]


@dataclass(frozen=True)
class Overlay:
    """`base` with `new` written over it."""

    base: Files
    new: dict[Path, str] = field(default_factory=dict)

    def read(self, path: Path) -> str | None:
        return self.new[path] if path in self.new else self.base.read(path)

    def glob(self, pattern: str) -> list[Path]:
        planned = {p for p in self.new if _matches(p, pattern)}
        return sorted(set(self.base.glob(pattern)) | planned)


@dataclass(frozen=True)
class Runtime:
    """The handler to add, and which way it injects GPUs.

    By default the handler's `BinaryName` is `shim` (`gpuwire-runtime`). With `hook` set
    (`gpuwire-hook`) it keeps runc instead, and containerd starts every container from the
    spec file `base_spec`, whose prestart hook is `hook`: the prestart-hook path.
    """

    name: str = "gpuwire"
    shim: str = ""
    hook: str | None = None
    base_spec: str = str(BASE_SPEC)
    set_default: bool = False
    cdi: bool = False

    def __post_init__(self) -> None:
        if not _HANDLER.match(self.name):
            raise ContainerdConfigError(
                f"runtime name {self.name!r} is not a RuntimeClass handler: accepted are "
                "lower-case letters, digits and '-', 1-63 characters, alphanumeric at both ends"
            )
        if self.hook:
            required = {"hook path": self.hook, "base spec": self.base_spec}
        else:
            required = {"runtime path": self.shim}
        for what, path in required.items():
            if not path.startswith("/"):
                raise ContainerdConfigError(
                    f"{what} {path!r} must be absolute: containerd resolves no PATH"
                )


@dataclass(frozen=True)
class Source:
    """One config file, parsed, as containerd loads it."""

    path: Path
    data: dict[str, Any]

    @property
    def version(self) -> int:
        return version_of(self.path, self.data)

    def section(self, plugin: str) -> dict[str, Any] | None:
        plugins = self.data.get("plugins", {})
        section = plugins.get(plugin) if isinstance(plugins, dict) else None
        return section if isinstance(section, dict) else None


@dataclass(frozen=True)
class Change:
    path: Path
    old: str | None  # None: the file does not exist yet
    new: str


def parse(path: Path, text: str) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except ParseError as exc:
        raise ContainerdConfigError(f"{path}: not valid TOML: {exc}") from None


def version_of(path: Path, data: dict[str, Any]) -> int:
    version = data.get("version", 1)
    if version in CRI_PLUGIN:
        return int(version)
    if version == 1:
        raise ContainerdConfigError(
            f"{path}: config version 1 (no `version` key) has no drop-in support: migrate it "
            "with `containerd config migrate` (containerd >= 1.7) or rewrite it as version 2"
        )
    raise ContainerdConfigError(
        f"{path}: version = {version!r} is not a containerd config version: accepted are "
        "2 (containerd 1.x) and 3 (containerd 2.x)"
    )


def import_paths(parent: Path, imports: object, files: Files) -> list[Path]:
    """An `imports` value resolved as containerd does: a relative path is relative to the
    importing file; a glob is expanded (relative to the working directory, as containerd does)."""
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise ContainerdConfigError(f"{parent}: imports = {imports!r} is not a list of paths")
    out: list[Path] = []
    for entry in imports:
        if _is_glob(entry):
            out.extend(files.glob(entry))
        else:
            out.append(Path(os.path.normpath(parent.parent / entry)))
    return out


def load_chain(main: Path, files: Files) -> list[Source]:
    """The main file and its imports, breadth first, each once: containerd's merge order.

    A missing main file is an empty one; a missing import is an error, as containerd
    refuses to start without it.
    """
    chain: list[Source] = []
    pending, seen = [main], set()
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        text = files.read(path)
        if text is None and path != main:
            raise ContainerdConfigError(
                f"{path}: imported by the containerd config but does not exist"
            )
        data = parse(path, text or f"version = {NEW_CONFIG_VERSION}\n").unwrap()
        chain.append(Source(path, data))
        pending.extend(import_paths(path, data.get("imports", []), files))
    return chain


def effective_section(chain: list[Source], plugin: str) -> dict[str, Any]:
    """The CRI plugin section containerd < 2.1 ends up with: the last file's that has one."""
    section: dict[str, Any] = {}
    for source in chain:
        found = source.section(plugin)
        if found is not None:
            section = found
    return copy.deepcopy(section)


def _table(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise ContainerdConfigError(f"{where}.{key} = {value!r} is not a table")
    return value


def _exposes_protected(pattern: object) -> bool:
    return any(fnmatch.fnmatchcase(key, str(pattern)) for key in PROTECTED_ANNOTATIONS)


def runtime_entry(runtimes: dict[str, Any], runtime: Runtime, where: str) -> dict[str, Any]:
    """The handler's table: runc's (its cgroup driver and options must match), gpuwire's way.

    Rebuilt on every run, so switching between shim and hook, or a changed runc, lands.
    """
    base = runtimes.get("runc")
    entry = copy.deepcopy(base) if isinstance(base, dict) else {}
    entry["runtime_type"] = RUNC_SHIM
    options = _table(entry, "options", f"{where}.{runtime.name}")
    for key in ("pod_annotations", "container_annotations"):
        if key in entry:
            entry[key] = [p for p in entry[key] if not _exposes_protected(p)]
    # the one pod annotation the runtime reads: the admission a grant binds (gpuwire.grant)
    passed = entry.setdefault("pod_annotations", [])
    if POD_ANNOTATION not in passed:
        passed.append(POD_ANNOTATION)
    if runtime.hook:
        entry["base_runtime_spec"] = runtime.base_spec
    else:
        options["BinaryName"] = runtime.shim
    return entry


def configured_section(section: dict[str, Any], runtime: Runtime, where: str) -> dict[str, Any]:
    """`section` (a CRI plugin section) with the gpuwire handler, default and CDI as asked."""
    out = copy.deepcopy(section)
    containerd = _table(out, "containerd", where)
    runtimes = _table(containerd, "runtimes", f"{where}.containerd")
    # A runtimes table in a config replaces containerd's built-in one, whose `runc` is the
    # default runtime: keep that entry, or every pod of the node stops starting.
    runtimes.setdefault("runc", {"runtime_type": RUNC_SHIM})
    runtimes[runtime.name] = runtime_entry(runtimes, runtime, f"{where}.containerd.runtimes")
    if runtime.set_default:
        containerd["default_runtime_name"] = runtime.name
    if runtime.cdi:
        out["enable_cdi"] = True
        out.setdefault("cdi_spec_dirs", list(CDI_SPEC_DIRS))
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return value


def drop_in_text(version: int, section: dict[str, Any]) -> str:
    """The drop-in, keys sorted as `containerd config dump` sorts them, so the text depends
    only on the settings, whichever source they came from."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Written by `gpuwire containerd configure`; re-run it after editing"))
    doc.add(tomlkit.comment("the CRI section of the main config: containerd < 2.1 reads this"))
    doc.add(tomlkit.comment("file's copy of that section in place of the main file's."))
    doc["version"] = version
    doc["plugins"] = {CRI_PLUGIN[version]: _sorted(section)}
    return tomlkit.dumps(doc)


def _imported(main: Path, entry: str, target: Path) -> bool:
    if _is_glob(entry):
        return _matches(target, entry)
    return Path(os.path.normpath(main.parent / entry)) == target


def main_text(main: Path, text: str | None, drop_in: Path) -> str:
    """The main file with `drop_in` in its imports, appended last; unchanged if already there."""
    doc = parse(main, text or f"version = {NEW_CONFIG_VERSION}\n")
    version_of(main, doc.unwrap())
    imports = doc.get("imports")
    if imports is None:
        doc["imports"] = [str(drop_in)]
    elif not any(_imported(main, entry, drop_in) for entry in imports):
        imports.append(str(drop_in))
    return tomlkit.dumps(doc)


def without_import(main: Path, text: str, drop_in: Path) -> str:
    """The main file with `drop_in` taken out of its imports (the key too, if nothing else is
    imported): what `main_text` added, undone, the rest as written."""
    doc = parse(main, text)
    imports = doc.get("imports")
    if imports is None:
        return text
    kept = [entry for entry in imports if _is_glob(entry) or not _imported(main, entry, drop_in)]
    if len(kept) == len(imports):
        return text
    if kept:
        for index in reversed(range(len(imports))):
            if imports[index] not in kept:
                del imports[index]
    else:
        del doc["imports"]
    return tomlkit.dumps(doc)


def base_spec_text(spec: dict[str, Any], hook: str) -> str:
    """containerd's base OCI spec with `gpuwire-hook prestart` as the last prestart hook and
    `gpuwire-hook poststop` (which forgets the container's GPU record) as the last poststop one.

    The hooks get an explicit env, so they never inherit the container's (LD_PRELOAD etc.).
    """
    out = copy.deepcopy(spec)
    hooks = out.setdefault("hooks", {})
    for stage in ("prestart", "poststop"):
        kept = [h for h in hooks.get(stage, []) if Path(h.get("path", "")).name != "gpuwire-hook"]
        hooks[stage] = [
            *kept,
            {"path": hook, "args": ["gpuwire-hook", stage], "env": list(HOOK_ENV)},
        ]
    return json.dumps(out, indent=2) + "\n"


@dataclass(frozen=True)
class Plan:
    changes: list[Change]
    warnings: list[str]


def plan(
    main: Path,
    drop_in: Path,
    runtime: Runtime,
    files: Files,
    dump: Source | None = None,
    default_spec: Callable[[], dict[str, Any]] | None = None,
) -> Plan:
    """The files to write so containerd runs `runtime`; only those whose content changes.

    The CRI section comes from the config files as containerd merges them, or from `dump`
    (`containerd config dump`: the effective config, defaults included) when given. The
    prestart-hook path also writes the base spec: runc's own base spec if it has one, else
    the one written before, else `default_spec()` (containerd's default, `ctr oci spec`).
    """
    if drop_in == main:
        raise ContainerdConfigError(
            f"drop-in {drop_in} is the main config itself: name another file"
        )
    chain = load_chain(main, files)  # also validates every file's imports
    version = dump.version if dump else chain[0].version
    plugin = CRI_PLUGIN[version]
    if dump:
        section = copy.deepcopy(dump.section(plugin) or {})
    else:
        section = effective_section(chain, plugin)
    where = f'{drop_in}: plugins."{plugin}"'
    configured = configured_section(section, runtime, where)
    texts: dict[Path, str] = {}
    if runtime.hook:
        texts[Path(runtime.base_spec)] = base_spec_text(
            _base_spec(section, runtime, files, default_spec), runtime.hook
        )
    texts[drop_in] = drop_in_text(version, configured)
    texts[main] = main_text(main, files.read(main), drop_in)
    changes = [Change(p, files.read(p), t) for p, t in texts.items() if files.read(p) != t]
    after = load_chain(main, Overlay(files, texts))
    paths = [s.path for s in after]
    later = [s.path for s in after[paths.index(drop_in) + 1 :] if s.section(plugin) is not None]
    warnings = [
        f'{path} is imported after {drop_in} and replaces its whole plugins."{plugin}" '
        "section on containerd < 2.1, hiding the gpuwire runtime: move its settings into "
        f"{main} or rename the drop-in to sort after it"
        for path in later
    ]
    runc = configured["containerd"]["runtimes"]["runc"]
    for key in ("pod_annotations", "container_annotations"):
        exposing = [p for p in runc.get(key, []) if _exposes_protected(p)]
        if exposing:
            warnings.append(
                f"runc's {key} {exposing} not copied to {runtime.name!r}: they would let a pod "
                f"set {', '.join(PROTECTED_ANNOTATIONS)}, which its GPU grant and allocation bind"
            )
    return Plan(changes, warnings)


def _base_spec(
    section: dict[str, Any],
    runtime: Runtime,
    files: Files,
    default_spec: Callable[[], dict[str, Any]] | None,
) -> dict[str, Any]:
    runc = section.get("containerd", {}).get("runtimes", {}).get("runc", {})
    own = runc.get("base_runtime_spec") if isinstance(runc, dict) else None
    for path in (own, runtime.base_spec):
        text = files.read(Path(path)) if path else None
        if text is not None:
            try:
                spec = json.loads(text)
            except ValueError as exc:
                raise ContainerdConfigError(
                    f"{path}: base runtime spec is not JSON: {exc}"
                ) from None
            if not isinstance(spec, dict):
                raise ContainerdConfigError(f"{path}: base runtime spec is not a JSON object")
            return spec
    if default_spec is None:
        raise ContainerdConfigError("no base runtime spec to add the hook to")
    return default_spec()


def diff(changes: list[Change]) -> str:
    """What `--dry-run` prints: a unified diff per file (from /dev/null for new files)."""
    out: list[str] = []
    for c in changes:
        old = "/dev/null" if c.old is None else str(c.path)
        out.extend(
            difflib.unified_diff(
                (c.old or "").splitlines(keepends=True),
                c.new.splitlines(keepends=True),
                fromfile=old,
                tofile=str(c.path),
            )
        )
    return "".join(out)


def write(changes: list[Change]) -> None:
    """Each file replaced atomically, in order (drop-ins before the file that imports them),
    keeping an existing file's mode."""
    for c in changes:
        c.path.parent.mkdir(parents=True, exist_ok=True)
        mode = c.path.stat().st_mode & 0o7777 if c.path.exists() else 0o644
        atomicfile.replace(str(c.path), c.new.encode(), mode)
