"""What a container sees of the GPUs: a busybox script that prints it, and its output as data.

Tests run `VIEW_SCRIPT` in their containers and compare with `granted_view`; the demo bakes
it into its image as the default command and shows what it printed.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwire.devices import Device

# One `key: value` line each (busybox sh). `var` lines are the GPU-related env, `memory` what
# nvidia-smi reports of each GPU's memory, `lib` lines the driver libraries in the Debian
# library dir, `preload` what /etc/ld.so.preload makes every program load, `mounted` the
# mounts shared with a daemon on the node (MPS's pipes and shm; the last one of a path is
# on top), `mps` what the MPS pipe directory holds (its daemon's socket and pid file), `shm`
# what /dev/shm holds.
VIEW_SCRIPT = r"""
echo "devices: $(cd /dev && echo nvidia*)"
for d in /dev/nvidia[0-9]* /dev/nvidia-caps/nvidia-cap*; do
  [ -e "$d" ] && cat "$d" 2>&1 >/dev/null | sed "s|^|open $d: |"
done
[ -d /dev/nvidia-caps ] && echo "caps: $(cd /dev/nvidia-caps && echo *)"
echo "env: $NVIDIA_VISIBLE_DEVICES"
env | grep -E '^(NVIDIA|CUDA|GPU|PYTORCH|XLA|TF)_' | sort | sed 's/^/var: /'
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L 2>&1 | sed 's/^/smi: /'
  nvidia-smi --query-gpu=memory.total --format=csv,noheader 2>&1 | sed 's/^/memory: /'
else
  echo "smi: nvidia-smi: not found"
fi
for f in /usr/lib/x86_64-linux-gnu/lib*.so.*; do [ -e "$f" ] && echo "lib: ${f##*/}"; done
lib=/usr/lib/x86_64-linux-gnu/libcuda.so.1
if [ -e $lib ]; then
  if (echo x >> $lib) 2>/dev/null; then echo "libcuda: writable"; else echo "libcuda: read-only"; fi
fi
grep -q libcuda.so.1 /etc/ld.so.cache 2>/dev/null && echo "ldcache: libcuda.so.1"
[ -r /etc/ld.so.preload ] && sed 's/^/preload: /' /etc/ld.so.preload
grep -E ' (/tmp/nvidia-mps|/dev/shm) ' /proc/self/mounts | cut -d' ' -f2,4 | sed 's/^/mounted: /'
[ -d /tmp/nvidia-mps ] && ls /tmp/nvidia-mps | sed 's/^/mps: /'
ls /dev/shm | sed 's/^/shm: /'
true
"""


def view(stdout: str) -> dict[str, list[str]]:
    """VIEW_SCRIPT's output as key → values."""
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def granted_view(
    devices: Sequence[Device],
    indices: Sequence[int],
    control: str = "nvidia-uvm nvidia-uvm-tools",
) -> dict[str, list[str]]:
    """What VIEW_SCRIPT prints in a container given GPUs `indices` of `devices` and the compute
    and utility files: those nodes (`control` beside them), each opening with ENXIO (allowed
    by the cgroup, no driver to answer), nvidia-smi listing exactly them, libcuda read-only
    and in the ld cache."""
    minors = " ".join(f"nvidia{i}" for i in sorted(indices))
    return {
        "devices": [f"{control} {minors} nvidiactl"],
        **{
            f"open /dev/nvidia{i}": [f"cat: can't open '/dev/nvidia{i}': No such device or address"]
            for i in indices
        },
        "smi": [
            f"GPU {n}: {devices[i].product} (UUID: {devices[i].uuid})"
            for n, i in enumerate(sorted(indices))
        ],
        "libcuda": ["read-only"],
        "ldcache": ["libcuda.so.1"],
    }


def shown(seen: dict[str, list[str]], expected: dict[str, list[str]]) -> dict[str, list[str]]:
    """The part of `seen` that `expected` speaks about, to compare in one assert."""
    return {key: seen.get(key, []) for key in expected}


# What an AMD container sees: its DRM nodes and /dev/kfd, each opened (ENXIO: the cgroup allows
# it and no driver answers; EPERM: the cgroup denies it), AMD_VISIBLE_DEVICES, and, where
# `SIBLING` names a render minor the container was not given, that node made with mknod and
# opened and written: the cgroup, not the missing file, must keep it out.
AMD_VIEW_SCRIPT = r"""
echo "dri: $(cd /dev/dri 2>/dev/null && echo *)"
for d in /dev/kfd /dev/dri/*; do
  [ -e "$d" ] && cat "$d" 2>&1 >/dev/null | sed "s|^|open $d: |"
done
echo "env: $AMD_VISIBLE_DEVICES"
if [ -n "$SIBLING" ]; then
  mknod /tmp/sibling c 226 "$SIBLING" 2>&1 | sed 's/^/mknod: /'
  cat /tmp/sibling 2>&1 >/dev/null | sed 's/^/sibling: /'
  (echo x > /tmp/sibling) 2>&1 | sed 's/^/write: /'
fi
true
"""
ENXIO = "cat: can't open '{}': No such device or address"


def amd_granted_view(minors: Sequence[int]) -> dict[str, list[str]]:
    """What AMD_VIEW_SCRIPT prints in a container given the render nodes `minors`: those and
    /dev/kfd, each opening with ENXIO."""
    paths = ["/dev/kfd", *(f"/dev/dri/renderD{m}" for m in sorted(minors))]
    return {
        "dri": [" ".join(f"renderD{m}" for m in sorted(minors))],
        **{f"open {p}": [ENXIO.format(p)] for p in paths},
    }


def sibling_denied() -> dict[str, list[str]]:
    """What AMD_VIEW_SCRIPT prints of a sibling's render node made inside: the cgroup's EPERM."""
    return {
        "sibling": ["cat: can't open '/tmp/sibling': Operation not permitted"],
        "write": ["sh: can't create /tmp/sibling: Operation not permitted"],
    }
