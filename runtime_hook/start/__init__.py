"""The container-start path: what runs when containerd starts or deletes a container.

`gpuwire-runtime` (`shim`) and `gpuwire-hook` (`hook`) decide (`trust`, `plan`, on the
node's `config` and the container's `spec`), say so (`log`), keep the container record
(`recording`) and apply the edits (`runtime_hook.injection`); `resident` serves their calls
from a process that has all of it loaded. Every start pays for what it imports, so the
modules a start may import are declared here, once: the resident preloads exactly these.
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
