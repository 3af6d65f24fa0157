"""The node's gpuwire configuration: `$GPUWIRE_CONFIG`, else /etc/gpuwire/config.toml.

A missing default file means the defaults; a file named by `$GPUWIRE_CONFIG` must exist.
Unknown keys and bad values are errors naming the file, the key, the value and what is
accepted, because a typo in `trust` must not silently fall back to another policy.

The shim reads this on every runtime call and the hook on every GPU container start, but
`tomllib` imports `typing` and `re` (~15 ms here). So the parsed table is kept in a root-only
cache (`/run/gpuwire`, marshal) together with the exact bytes it was parsed from; it is used
only while the file still holds those bytes, and an entry whose file is gone is dropped at
the next miss. Validation always runs.
"""

from __future__ import annotations

import marshal
import os
import sys

from gpuwire import allocation, atomicfile, grant, hamicore, mig, records, requirements
from gpuwire.roots import Roots
from gpuwire.vendor import NVIDIA, VENDORS, Vendor, of

ENV = "GPUWIRE_CONFIG"
CACHE_DIR = "/run/gpuwire"
DEFAULT_PATH = "/etc/gpuwire/config.toml"
DEFAULT_LOG = "/var/log/gpuwire.log"
DEFAULT_LDCONFIG = "/sbin/ldconfig"
TRUST_MODES = ("granted", "any")

ABSOLUTE = "an absolute path"
KEYS = {
    "root": ABSOLUTE + " (the host root; the four roots below default to it)",
    "driver-root": ABSOLUTE + " (driver libraries, binaries, firmware; libdrm's amdgpu.ids)",
    "dev-root": ABSOLUTE + " (holds dev/nvidia*, dev/kfd, dev/dri)",
    "proc-root": ABSOLUTE + " (holds proc/driver/nvidia, proc/devices)",
    "sys-root": ABSOLUTE + " (holds sys/class/kfd, sys/class/drm)",
    "vendor": " or ".join(repr(v.name) for v in VENDORS) + " (whose GPUs this node has)",
    "trust": " or ".join(repr(m) for m in TRUST_MODES),
    "grant-key-dir": ABSOLUTE,
    "allocation-dir": ABSOLUTE,
    "runtime": "the low-level runtime: a command name or an absolute path",
    "ldconfig": ABSOLUTE + " to the host's static ldconfig",
    "hook": ABSOLUTE + " to gpuwire-hook",
    "log": "'stderr' or " + ABSOLUTE,
    "records-dir": ABSOLUTE + " (which container holds which GPUs, for the inventory)",
    "mig-map": ABSOLUTE + " (the MIG map the node agent writes: names of MIG devices)",
    "mps-root": ABSOLUTE + " (the node agent's MPS control daemons, one per GPU)",
    "hami-library": ABSOLUTE + " to HAMi-core's libvgpu.so (containers with its limits load it)",
    "hami-dir": ABSOLUTE + " (the preload list HAMi-core's containers get)",
    "driver-facts": ABSOLUTE + " (what the node agent read of NVML, for NVIDIA_REQUIRE_*)",
    "amd-cards": "'true' or 'false' (AMD: give /dev/dri/card<N> beside each render node)",
}


class ConfigError(ValueError):
    """A configuration file that cannot be used."""


def default_hook() -> str:
    """The gpuwire-hook beside the running program (a launcher beside a launcher, a console
    script beside a console script), else beside the interpreter."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "gpuwire-hook")
    if os.path.basename(sys.argv[0]).startswith("gpuwire") and os.access(beside, os.X_OK):
        return beside
    return os.path.join(os.path.dirname(sys.executable), "gpuwire-hook")


class Config:
    __slots__ = (
        "allocation_dir",
        "amd_cards",
        "driver_facts",
        "grant_key_dir",
        "hami_dir",
        "hami_library",
        "hook",
        "ldconfig",
        "log",
        "mig_map",
        "mps_root",
        "records_dir",
        "roots",
        "runtime",
        "source",
        "trust",
        "vendor",
    )

    def __init__(
        self,
        *,
        roots: Roots | None = None,
        trust: str = "granted",
        grant_key_dir: str = grant.DEFAULT_KEY_DIR,
        allocation_dir: str = allocation.DEFAULT_DIR,
        runtime: str = "runc",
        ldconfig: str = DEFAULT_LDCONFIG,
        hook: str | None = None,
        log: str = DEFAULT_LOG,
        records_dir: str = records.DEFAULT_DIR,
        mig_map: str = mig.DEFAULT_MAP,
        mps_root: str | None = None,
        hami_library: str | None = None,
        hami_dir: str = hamicore.DEFAULT_DIR,
        driver_facts: str = requirements.DEFAULT_FACTS,
        source: str = "defaults",
        vendor: Vendor = NVIDIA,
        amd_cards: bool = False,
    ) -> None:
        self.roots = roots or Roots("/")
        self.trust = trust
        self.grant_key_dir = grant_key_dir
        self.allocation_dir = allocation_dir
        self.runtime = runtime
        self.ldconfig = ldconfig
        self.hook = hook or default_hook()
        self.log = log
        self.records_dir = records_dir
        self.mig_map = mig_map
        self.mps_root = mps_root  # None: this node runs no MPS control daemons
        self.hami_library = hami_library  # None: this node has no HAMi-core
        self.hami_dir = hami_dir
        self.driver_facts = driver_facts
        self.source = source
        self.vendor = vendor  # whose GPUs this node has: whose request env a start reads
        self.amd_cards = amd_cards


def from_table(table: dict[str, object], source: str) -> Config:
    """Validate a parsed TOML table; every error names the key, value and what is accepted."""
    for key in table:
        if key not in KEYS:
            raise ConfigError(f"{source}: unknown key {key!r}; accepted keys are {', '.join(KEYS)}")
    values: dict[str, str] = {}
    for key, value in table.items():
        if not (isinstance(value, str) and _accepts(key, value)):
            raise ConfigError(f"{source}: {key} = {value!r} is not accepted: expected {KEYS[key]}")
        values[key] = value
    root = values.get("root", "/")
    return Config(
        roots=Roots(
            root,
            driver=values.get("driver-root"),
            dev=values.get("dev-root"),
            proc=values.get("proc-root"),
            sys=values.get("sys-root"),
        ),
        trust=values.get("trust", "granted"),
        grant_key_dir=values.get("grant-key-dir", grant.DEFAULT_KEY_DIR),
        allocation_dir=values.get("allocation-dir", allocation.DEFAULT_DIR),
        runtime=values.get("runtime", "runc"),
        ldconfig=values.get("ldconfig", DEFAULT_LDCONFIG),
        hook=values.get("hook"),
        log=values.get("log", DEFAULT_LOG),
        records_dir=values.get("records-dir", records.DEFAULT_DIR),
        mig_map=values.get("mig-map", mig.DEFAULT_MAP),
        mps_root=values.get("mps-root"),
        hami_library=values.get("hami-library"),
        hami_dir=values.get("hami-dir", hamicore.DEFAULT_DIR),
        driver_facts=values.get("driver-facts", requirements.DEFAULT_FACTS),
        source=source,
        vendor=of(values.get("vendor", NVIDIA.name)),
        amd_cards=values.get("amd-cards") == "true",
    )


def _accepts(key: str, value: str) -> bool:
    if "\0" in value:
        return False
    if key == "trust":
        return value in TRUST_MODES
    if key == "vendor":
        return value in (v.name for v in VENDORS)
    if key == "amd-cards":
        return value in ("true", "false")
    if key == "log":
        return value == "stderr" or value.startswith("/")
    if key == "runtime":
        return value != ""
    return value.startswith("/")


def parse_toml(data: bytes, source: str) -> dict[str, object]:
    import tomllib

    try:
        return tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def _cache_path(st: os.stat_result) -> str:
    return f"{CACHE_DIR}/config-{st.st_dev}-{st.st_ino}"


def _read_entry(path: str) -> tuple[str, bytes, dict[str, object]] | None:
    try:
        with open(path, "rb") as f:
            source, data, table = marshal.load(f)  # noqa: S302 - ours, a directory only we write
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return source, data, table


def _cached(st: os.stat_result, data: bytes) -> dict[str, object] | None:
    """The table parsed from exactly `data`, from a directory only we can write."""
    try:
        directory = os.stat(CACHE_DIR)
    except OSError:
        return None
    if directory.st_uid != os.geteuid() or directory.st_mode & 0o022:
        return None
    entry = _read_entry(_cache_path(st))
    if entry is None or entry[1] != data or not isinstance(entry[2], dict):
        return None
    return entry[2]


def _remember(source: str, st: os.stat_result, data: bytes, table: dict[str, object]) -> None:
    """Cache `table`, and drop the entries of config files that are gone or replaced (a
    miss is rare, so the cache stays as small as the set of live config files)."""
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        path = _cache_path(st)
        atomicfile.replace(
            path, marshal.dumps((source, data, table)), 0o600, durable=False
        )  # a cache
        for name in os.listdir(CACHE_DIR):
            other = f"{CACHE_DIR}/{name}"
            if name.startswith("config-") and other != path and not _live(other):
                os.unlink(other)
    except (OSError, ValueError):
        pass  # a table marshal cannot hold (TOML dates) or a read-only /run: parse each time


def _live(entry_path: str) -> bool:
    """Whether a cache entry still belongs to the file it was parsed from."""
    entry = _read_entry(entry_path)
    try:
        return entry is not None and _cache_path(os.stat(entry[0])) == entry_path
    except OSError:
        return False


def load(path: str | None = None) -> Config:
    """The configuration from `path`, `$GPUWIRE_CONFIG` or the default file."""
    explicit = path or os.environ.get(ENV)
    source = explicit or DEFAULT_PATH
    try:
        with open(source, "rb") as f:
            st, data = os.fstat(f.fileno()), f.read()
        table = _cached(st, data)
        if table is None:
            table = parse_toml(data, source)
            _remember(source, st, data, table)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{source}: no such configuration file") from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    return from_table(table, source)
