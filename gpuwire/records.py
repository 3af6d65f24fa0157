"""Which container holds which GPUs: the record the runtime side keeps of each GPU container.

The kubelet knows which pod got which device only for device-plugin allocations (its
pod-resources API); a pod granted GPUs by annotation (plugin-less) appears in no accounting.
So the shim and the prestart hook, which decide every GPU container's devices, write one
file per container into a root-only directory (`/run/gpuwire/containers/<container-id>`) when
they give it GPUs, and remove it when the container is deleted. The node agent reads them.

A record names the pod (from the CRI annotations), the GPUs by UUID, the path (`plugin`:
the devices came from a device-plugin allocation; `dra`: from prepared DRA claims, which it
names, with the GPUs it holds as a share of a shared GPU; `plugin-less`: from a grant,
privilege or `trust = "any"`), whether the request was `all`, and the capabilities. It also
carries how to tell whether its container still runs, because a crashed shim or a killed
node can leave a record behind: the hook knows the container's init pid, and records it with
the process start time (`/proc/<pid>/stat`, so a reused pid does not pass for the
container); the shim runs before the container exists, and records the runtime's state
directory instead (`<runc --root>/<id>`, whose `state.json` names the init pid and start
time once created).
`sweep` removes the records of containers that are gone.

Writes are atomic (a temporary file, then rename), so a reader sees a whole record or none.
This module is on the container-start path: standard library only, and no `json` import
(`import json` compiles regular expressions); records are written with the C encoder
`json` itself uses, and only the node agent parses them.
"""

from __future__ import annotations

import os
import stat

from gpuwire import atomicfile
from gpuwire.value import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

DEFAULT_DIR = "/run/gpuwire/containers"
PLUGIN = "plugin"
DRA = "dra"  # a DRA claim's devices (gpuwire.claimtoken)
PLUGIN_LESS = "plugin-less"
PATHS = (PLUGIN, DRA, PLUGIN_LESS)
VERSION = 1
RUNC_ROOT = "/run/runc"  # runc's state root for root when `--root` is not given

# (namespace, pod name, pod uid, container name) annotation keys: containerd CRI, then CRI-O.
POD_ANNOTATIONS = (
    (
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.cri.sandbox-uid",
        "io.kubernetes.cri.container-name",
    ),
    (
        "io.kubernetes.pod.namespace",
        "io.kubernetes.pod.name",
        "io.kubernetes.pod.uid",
        "io.kubernetes.container.name",
    ),
)

_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-.")


class RecordError(ValueError):
    """A record that cannot be written or read; the message names it and why."""


def valid_id(container: str) -> bool:
    """runc's container ID grammar (`[\\w+.-]+`), as a file name: not `.`/`..`, ≤ 250 bytes."""
    return (
        0 < len(container) <= 250
        and set(container) <= _ID_CHARS
        and container not in (".", "..")
        and not container.startswith(".")
    )


class ContainerRecord(Value):
    __slots__ = _fields = (
        "id",
        "namespace",
        "pod",
        "pod_uid",
        "container",
        "gpus",
        "path",
        "whole_node",
        "capabilities",
        "pid",
        "start",
        "state",
        "claims",
        "shares",
        "mps",
    )
    id: str  # the runtime's container ID
    namespace: str  # "" for a container that is not a Kubernetes pod's
    pod: str
    pod_uid: str
    container: str
    gpus: tuple[str, ...]  # GPU UUIDs, sorted
    path: str  # PLUGIN, DRA or PLUGIN_LESS
    whole_node: bool  # the request was `all`
    capabilities: tuple[str, ...]
    pid: int | None  # the container's init process, with its start time (clock ticks)
    start: int | None
    state: str | None  # the runtime's state directory of this container
    claims: tuple[str, ...]  # DRA: the claims, `namespace/name`, sorted
    shares: tuple[str, ...]  # DRA: the GPUs held as a share of a shared GPU
    mps: tuple[str, ...]  # the GPUs whose MPS control daemon it is a client of

    def __init__(
        self,
        id: str,
        namespace: str,
        pod: str,
        pod_uid: str,
        container: str,
        gpus: tuple[str, ...],
        path: str,
        whole_node: bool = False,
        capabilities: tuple[str, ...] = (),
        pid: int | None = None,
        start: int | None = None,
        state: str | None = None,
        claims: tuple[str, ...] = (),
        shares: tuple[str, ...] = (),
        mps: tuple[str, ...] = (),
    ) -> None:
        self._set(
            id=id,
            namespace=namespace,
            pod=pod,
            pod_uid=pod_uid,
            container=container,
            gpus=gpus,
            path=path,
            whole_node=whole_node,
            capabilities=capabilities,
            pid=pid,
            start=start,
            state=state,
            claims=claims,
            shares=shares,
            mps=mps,
        )


def pod_identity(annotations: Mapping[str, str]) -> tuple[str, str, str, str]:
    """(namespace, pod, pod uid, container name) from the CRI annotations; "" where absent."""
    for keys in POD_ANNOTATIONS:
        if annotations.get(keys[0]) and annotations.get(keys[1]):
            namespace, pod, uid, container = (annotations.get(k, "") for k in keys)
            return namespace, pod, uid, container
    return "", "", "", ""


def process_start(pid: int, proc: str = "/proc") -> int | None:
    """The start time of process `pid` in clock ticks after boot (`stat` field 22), or None
    when there is no such process, or only its zombie (dead, not yet reaped)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def started(
    container: str,
    annotations: Mapping[str, str],
    gpus: Iterable[str],
    *,
    path: str,
    whole_node: bool,
    capabilities: Iterable[str],
    pid: int | None = None,
    state: str | None = None,
    claims: Iterable[str] = (),
    shares: Iterable[str] = (),
    mps: Iterable[str] = (),
) -> ContainerRecord:
    """The record of a container given `gpus`; with `pid`, its start time is read now."""
    if path not in PATHS:
        raise RecordError(f"record {container}: path {path!r}: expected one of {', '.join(PATHS)}")
    return ContainerRecord(
        container,
        *pod_identity(annotations),
        tuple(sorted(set(gpus))),
        path,
        whole_node,
        tuple(capabilities),
        pid,
        process_start(pid) if pid is not None else None,
        state,
        tuple(sorted(set(claims))),
        tuple(sorted(set(shares))),
        tuple(sorted(set(mps))),
    )


def runtime_state(runtime_args: list[str], container: str) -> str:
    """The state directory runc keeps for `container`, from the global `--root` among the
    runtime's arguments (containerd passes `--root /run/containerd/runc/<namespace>`)."""
    root = RUNC_ROOT
    for i, arg in enumerate(runtime_args):
        name, eq, value = arg.partition("=")
        if name in ("--root", "-root"):
            if eq:
                root = value
            elif i + 1 < len(runtime_args):
                root = runtime_args[i + 1]
            break
    return f"{root.rstrip('/')}/{container}"


# Fields written only where they hold something: a record without them reads as before.
OPTIONAL = ("claims", "shares", "mps")


def encode(record: ContainerRecord) -> str:
    import _json  # the C encoder behind `json`, without json's import cost

    def text(value: object) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, tuple):
            return "[" + ",".join(text(v) for v in value) + "]"
        return str(_json.encode_basestring_ascii(str(value)))

    fields = [("version", VERSION), *record.as_dict().items()]
    fields = [(k, v) for k, v in fields if not (k in OPTIONAL and not v)]
    return "{" + ",".join(f'"{name}":{text(value)}' for name, value in fields) + "}\n"


def decode(text: str, source: str = "record") -> ContainerRecord:
    """A record from its file's text; RecordError names the source and what is wrong."""
    import json

    try:
        raw = json.loads(text)
        version = raw.pop("version")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordError(f"{source}: not a gpuwire container record ({exc})") from None
    if version != VERSION:
        raise RecordError(
            f"{source}: record version {version!r} is not supported: expected {VERSION}"
        )
    try:
        for name in ("gpus", "capabilities", *(n for n in OPTIONAL if n in raw)):
            if not isinstance(raw[name], list):
                raise TypeError(f"{name} is not a list")
            raw[name] = tuple(raw[name])
        record = ContainerRecord(**raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RecordError(f"{source}: not a gpuwire container record ({exc})") from None
    wrong = [name for name, value in record.as_dict().items() if not _TYPES[name](value)]
    if wrong or not valid_id(record.id) or record.path not in PATHS:
        raise RecordError(f"{source}: not a gpuwire container record ({', '.join(wrong) or 'id'})")
    return record


def _strings(value: object) -> bool:
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


def _count(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


_TYPES: dict[str, Callable[[object], bool]] = {
    **dict.fromkeys(
        ("id", "namespace", "pod", "pod_uid", "container", "path"), lambda v: isinstance(v, str)
    ),
    "gpus": _strings,
    "capabilities": _strings,
    "whole_node": lambda v: isinstance(v, bool),
    "pid": _count,
    "start": _count,
    "state": lambda v: v is None or isinstance(v, str),
    "claims": _strings,
    "shares": _strings,
    "mps": _strings,
}


def _path(root: str, container: str) -> str:
    if not valid_id(container):
        raise RecordError(
            f"container id {container!r}: expected letters, digits and _+-. (runc's grammar)"
        )
    return os.path.join(root, container)


def write(root: str, record: ContainerRecord) -> None:
    """Write (or replace) `record` atomically in `root`, a directory only root can write."""
    path = _path(root, record.id)
    os.makedirs(root, mode=0o700, exist_ok=True)
    atomicfile.replace(
        path, encode(record).encode(), 0o600, durable=False
    )  # lives as its container


def remove(root: str, container: str) -> bool:
    """Forget `container`'s record (its container is deleted); whether there was one."""
    try:
        os.unlink(_path(root, container))
    except FileNotFoundError:
        return False
    return True


RUNNING = "running"
GONE = "gone"
ABSENT = "absent"  # no runtime state: not created yet, or deleted
UNKNOWN = "unknown"


def status(record: ContainerRecord, host_root: str = "/", proc: str = "/proc") -> str:
    """Whether `record`'s container still runs: RUNNING, GONE, ABSENT or UNKNOWN.

    `host_root` is where the host's filesystem is seen (the runtime's state directory);
    `proc` must show the host's processes (the agent runs in the host's PID namespace).
    """
    if record.pid is not None:
        alive = record.start is not None and process_start(record.pid, proc) == record.start
        return RUNNING if alive else GONE
    if record.state is None:
        return UNKNOWN
    import json

    state_file = os.path.join(host_root, record.state.lstrip("/"), "state.json")
    try:
        with open(state_file) as f:
            state = json.load(f)
        pid, start = int(state["init_process_pid"]), int(state["init_process_start"])
    except FileNotFoundError:
        return ABSENT
    except (OSError, ValueError, KeyError, TypeError):
        return UNKNOWN
    return RUNNING if process_start(pid, proc) == start else GONE


class Entry(Value):
    """One file in the records directory: its record, or why it is not one."""

    __slots__ = _fields = ("name", "record", "error", "mtime")
    name: str
    record: ContainerRecord | None
    error: str | None
    mtime: float

    def __init__(
        self, name: str, record: ContainerRecord | None, error: str | None, mtime: float
    ) -> None:
        self._set(name=name, record=record, error=error, mtime=mtime)


def scan(root: str) -> list[Entry]:
    """Every file in `root`, read: records, broken files, and writes a crash interrupted."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    entries = []
    for name in names:
        path = os.path.join(root, name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            continue  # removed since listed
        except OSError as exc:  # a symlink: nothing the runtime side writes
            entries.append(Entry(name, None, f"{path}: {exc.strerror}", 0.0))
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                continue
            entries.append(_entry(name, path, f.read() if stat.S_ISREG(st.st_mode) else b"", st))
    return entries


def _entry(name: str, path: str, data: bytes, st: os.stat_result) -> Entry:
    if name.startswith("."):
        return Entry(name, None, f"{path}: an interrupted write", st.st_mtime)
    try:
        record = decode(data.decode(), path)
    except (RecordError, UnicodeDecodeError) as exc:
        return Entry(name, None, str(exc), st.st_mtime)
    if record.id != name:
        return Entry(name, None, f"{path}: holds the record of {record.id}", st.st_mtime)
    return Entry(name, record, None, st.st_mtime)


def sweep(
    root: str, grace: float, now: float, host_root: str = "/", proc: str = "/proc"
) -> tuple[list[ContainerRecord], list[str]]:
    """The records of containers that may still run, and the names of files removed.

    A record goes as soon as its container's init process is gone. A record whose container
    has no runtime state goes once it is older than `grace` seconds (the shim writes its
    record just before the runtime creates the container), and so does a file that is not
    a record at all (an interrupted write, a foreign file).
    """
    live, removed = [], []
    for entry in scan(root):
        found = UNKNOWN if entry.record is None else status(entry.record, host_root, proc)
        old = now - entry.mtime >= grace
        if found == GONE or (old and (entry.record is None or found == ABSENT)):
            try:
                os.unlink(os.path.join(root, entry.name))
            except FileNotFoundError:
                continue  # someone else removed it
            removed.append(entry.name)
        elif entry.record is not None:
            live.append(entry.record)
    return live, removed
