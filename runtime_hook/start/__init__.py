"""The container-start path: what runs when containerd starts or deletes a container.

`gpuwire-runtime` (`shim`) and `gpuwire-hook` (`hook`) decide (`trust`, `plan`, on the
node's `config` and the container's `spec`), say so (`log`), keep the container record
(`recording`) and apply the edits (`runtime_hook.injection`); `resident` serves their calls
from a process that has all of it loaded. Every start pays for what it imports, so the
modules a start may import are declared here, once: the resident preloads exactly these
(scripts/layers.py holds both lists to what the sources import).
"""

MODULES = (
    "gpuwire.allocation",
    "gpuwire.amd",
    "gpuwire.amdedits",
    "gpuwire.atomicfile",
    "gpuwire.cdi",
    "gpuwire.claimtoken",
    "gpuwire.devices",
    "gpuwire.driver",
    "gpuwire.edits",
    "gpuwire.elf",
    "gpuwire.grant",
    "gpuwire.hamicore",
    "gpuwire.kfd",
    "gpuwire.ldsocache",
    "gpuwire.lightjson",
    "gpuwire.mig",
    "gpuwire.mps",
    "gpuwire.nvidia",
    "gpuwire.records",
    "gpuwire.requirements",
    "gpuwire.resolve",
    "gpuwire.roots",
    "gpuwire.syscalls",
    "gpuwire.value",
    "gpuwire.vendor",
    "runtime_hook.injection.cgroup",
    "runtime_hook.injection.child",
    "runtime_hook.injection.inject",
    "runtime_hook.injection.inroot",
    "runtime_hook.injection.ldcache",
    "runtime_hook.start.config",
    "runtime_hook.start.enforcement",
    "runtime_hook.start.hook",
    "runtime_hook.start.log",
    "runtime_hook.start.plan",
    "runtime_hook.start.recording",
    "runtime_hook.start.shim",
    "runtime_hook.start.spec",
    "runtime_hook.start.trust",
)
# The standard library modules those import, at module level or in a function, and the
# codecs they name: the resident preloads these too, as it imports nothing once it has
# entered the host's namespaces.
STDLIB = (
    "__future__",
    "_ctypes",
    "_json",
    "_operator",
    "_thread",
    "argparse",
    "collections.abc",
    "contextlib",
    "encodings.ascii",
    "encodings.utf_8",
    "errno",
    "fcntl",
    "hashlib",
    "itertools",
    "json",
    "marshal",
    "os",
    "re",
    "resource",
    "secrets",
    "signal",
    "stat",
    "struct",
    "sys",
    "time",
    "tomllib",
    "typing",
)
