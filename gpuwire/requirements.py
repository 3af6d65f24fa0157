"""`NVIDIA_REQUIRE_*`: what an image says it needs of the driver and GPUs, checked as NVIDIA's
toolkit checks it, and the driver facts the check reads.

The rules are libnvidia-container's (`src/cli/dsl.c`, `src/cli/configure.c`) as NVIDIA's
toolkit feeds them (`internal/config/image/cuda_image.go` of NVIDIA/nvidia-container-toolkit):
every variable named `NVIDIA_REQUIRE_<X>` but `NVIDIA_REQUIRE_JETPACK*` is one requirement;
`NVIDIA_DISABLE_REQUIRE` true (Go's `strconv.ParseBool`) turns them all off; a legacy image
(`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` unset) requires `cuda>=<its major.minor>`. In a
requirement, space-separated terms are alternatives and comma-separated ones must all hold;
a term is `<key><op><value>`, keys `cuda` (the CUDA version the driver supports), `driver`
(its version), `arch` (each GPU's compute capability), `brand` (each GPU's brand, compared
case-insensitively, `=` and `!=` only), operators `= != < <= > >=`; versions are digits and
dots, compared number by number, trailing `.0`s ignored. Each requirement is checked for
every GPU the container gets, or once without a GPU, where `arch` and `brand` hold.

What procfs does not say (the CUDA version, compute capabilities, brands) the node agent
writes from NVML into a facts file (`write_facts`); the runtime reads it (`read_facts`).
Where a fact is unknown (no file, one from another driver version, a GPU it does not list),
a term on it is not checked, and `check` says so. On the container-start path: `os` and
`gpuwire.lightjson` only.
"""

from __future__ import annotations

from gpuwire import lightjson
from gpuwire.value import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpuwire.devices import Device

PREFIX = "NVIDIA_REQUIRE_"
JETPACK = "NVIDIA_REQUIRE_JETPACK"
DISABLE = "NVIDIA_DISABLE_REQUIRE"
CUDA = "NVIDIA_REQUIRE_CUDA"
CUDA_VERSION = "CUDA_VERSION"
DEFAULT_FACTS = "/run/gpuwire/facts/driver.json"  # the node config's driver-facts
KEYS = ("cuda", "driver", "arch", "brand")
OPERATORS = ("<=", ">=", "!=", "=", "<", ">")  # longest first
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool


class RequirementError(ValueError):
    """A requirement that does not hold, or does not parse; the message says which."""


class Facts(Value):
    """What NVML knows of the driver and GPUs that procfs does not."""

    __slots__ = _fields = ("driver", "cuda", "gpus")
    driver: str  # the driver version these facts are of
    cuda: str  # the CUDA version it supports: 12.4
    gpus: tuple[tuple[str, str, str], ...]  # (uuid, compute capability "8.0", brand or "")

    def __init__(self, driver: str, cuda: str, gpus: tuple[tuple[str, str, str], ...]) -> None:
        self._set(driver=driver, cuda=cuda, gpus=gpus)

    def gpu(self, uuid: str) -> tuple[str, str] | None:
        """(arch, brand) of GPU `uuid`, if listed."""
        for listed, arch, brand in self.gpus:
            if listed.lower() == uuid.lower():
                return arch, brand
        return None


def write_facts(path: str, facts: Facts) -> None:
    import os

    from gpuwire import atomicfile

    body = {
        "driver": facts.driver,
        "cuda": facts.cuda,
        "gpus": [{"uuid": u, "arch": a, "brand": b} for u, a, b in facts.gpus],
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomicfile.replace(path, lightjson.dumps(body).encode(), 0o644)


def read_facts(path: str, driver: str) -> Facts | None:
    """The facts at `path` if they are of driver version `driver` (else stale: None)."""
    try:
        with open(path, "rb") as f:
            body = lightjson.loads(f.read())
        if not isinstance(body, dict) or body.get("driver") != driver:
            return None
        gpus = tuple((str(g["uuid"]), str(g["arch"]), str(g["brand"])) for g in body["gpus"])
        return Facts(driver, str(body["cuda"]), gpus)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def requirements(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, requirement) for every requirement of a container's environment."""
    if env.get(DISABLE, "") in _TRUE:
        return []
    found = [
        (name, value)
        for name, value in env.items()
        if name.startswith(PREFIX) and not name.startswith(JETPACK)
    ]
    if is_legacy(env):
        major_minor = _major_minor(env[CUDA_VERSION])
        if major_minor is None:
            raise RequirementError(
                f"{CUDA_VERSION}={env[CUDA_VERSION]!r} is not a version (legacy CUDA image)"
            )
        found.append((CUDA_VERSION, f"cuda>={major_minor}"))
    return found


def is_legacy(env: Mapping[str, str]) -> bool:
    """A CUDA image from before `NVIDIA_REQUIRE_CUDA`: the toolkit gives it every GPU and
    every capability where it names none, and requires its CUDA version."""
    return bool(env.get(CUDA_VERSION)) and not env.get(CUDA)


def _major_minor(version: str) -> str | None:
    """`12.4.1` → `12.4` (the toolkit's semver MajorMinor; `12` → `12.0`)."""
    parts = version.removeprefix("v").split("-")[0].split("+")[0].split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return f"{int(parts[0])}.{int(parts[1]) if len(parts) > 1 else 0}"


def compare_versions(have: str, op: str, want: str) -> bool:
    """`have <op> want`, number by number, trailing zeros ignored (dsl.c)."""
    if not _is_version(have) or not _is_version(want):
        raise ValueError(f"{want!r} is not a version (digits and dots)")
    a = [int(p) for p in have.split(".") if p]
    b = [int(p) for p in want.split(".") if p]
    while a and a[-1] == 0:
        a.pop()
    while b and b[-1] == 0:
        b.pop()
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _is_version(text: str) -> bool:
    return bool(text) and all(c in "0123456789." for c in text)


def _term(text: str) -> tuple[str, str, str]:
    """`cuda>=12.4` → ("cuda", ">=", "12.4"); ValueError where it is no term."""
    for op in OPERATORS:
        key, sep, value = text.partition(op)
        if sep and key and value and not any(c in "<>=!" for c in value):
            if key.lower() not in KEYS:
                raise ValueError(f"unknown key {key!r}")
            if key.lower() == "brand" and op not in ("=", "!="):
                raise ValueError(f"brand takes = or !=, not {op}")
            return key.lower(), op, value
    raise ValueError(f"{text!r} is not <key><operator><value>")


class _Seen:
    """The facts one evaluation reads: None where unknown."""

    def __init__(self, driver: str, cuda: str | None, gpu: tuple[str, str] | None, device: bool):
        self.values = {"driver": driver, "cuda": cuda}
        self.device = device  # a GPU is selected (else arch and brand hold)
        self.arch: str | None = gpu[0] if gpu else None
        self.brand: str | None = (gpu[1] or None) if gpu else None  # "": NVML did not say
        self.unknown: set[str] = set()

    def holds(self, key: str, op: str, value: str) -> bool:
        if key in ("arch", "brand"):
            if not self.device:
                return True
            have = self.arch if key == "arch" else self.brand
        else:
            have = self.values[key]
        if have is None:
            self.unknown.add(key)
            return True
        if key == "brand":
            return (have.lower() == value.lower()) == (op == "=")
        return compare_versions(have, op, value)


def evaluate(requirement: str, seen: _Seen) -> bool:
    """Whether `requirement` holds: some space-separated alternative whose comma-separated
    terms all hold (an empty requirement holds)."""
    alternatives = [a for a in requirement.split(" ") if a]
    for alternative in alternatives:
        if all(seen.holds(*_term(t)) for t in alternative.split(",") if t):
            return True
    return not alternatives


def check(
    env: Mapping[str, str], driver: str, facts: Facts | None, devices: Iterable[Device]
) -> list[str]:
    """Check every requirement of `env` against this node; RequirementError names the first
    that does not hold, as libnvidia-container words it. Returns what could not be checked
    (a fact unknown here), for the log."""
    chosen = list(devices)
    cuda = facts.cuda if facts else None
    views = [_Seen(driver, cuda, facts.gpu(d.uuid) if facts else None, True) for d in chosen]
    views = views or [_Seen(driver, cuda, None, False)]
    unchecked: list[str] = []
    for name, requirement in requirements(env):
        for seen in views:
            seen.unknown = set()
            try:
                holds = evaluate(requirement, seen)
            except ValueError as exc:
                raise RequirementError(
                    f"{name}={requirement!r}: invalid expression: {exc}; accepted: terms "
                    f"<key><operator><value> with keys {', '.join(KEYS)} and operators "
                    f"{' '.join(OPERATORS)}, comma-separated (all must hold), space-separated "
                    "(one must hold)"
                ) from None
            if not holds:
                first = requirement.split(" ")[0]
                hint = (
                    ", please update your driver to a newer version, or use an earlier cuda "
                    "container"
                    if first.startswith("cuda>=")
                    else ""
                )
                node = f"this node: driver {driver}" + (f", CUDA {cuda}" if cuda else "")
                raise RequirementError(f"{name}: unsatisfied condition: {first}{hint} ({node})")
            unchecked += [f"{name} ({k} unknown here)" for k in sorted(seen.unknown)]
    return sorted(set(unchecked))
