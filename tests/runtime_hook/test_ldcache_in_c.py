"""`gpuwire-hook ldcache` in C (runtime_hook/setup/ldcache.c): what the Python hook does, or
nothing at all.

The program under test is gpuwire-call as an install builds it, called as a CDI spec calls
it (argv[0] `gpuwire-hook`, the OCI state on stdin), with the bundle's root made as in
test_ldcache: the image, the driver's files where the engine bind-mounts them. Its Python
fallback does not exist and no resident listens: a call the C declines ends in "cannot
exec", so each test knows which did the work. The reference is the Python hook's own code
(`ldcache.make`, `ldsocache.update`) on a copy of the same root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings

from gpuwire import ldsocache
from gpuwire.edits import Edits, ldcache_args
from runtime_hook.injection import ldcache
from runtime_hook.setup import launcher
from tests.conftest import requires_binary
from tests.runtime_hook.test_ldcache import (
    DEB,
    DRIVER_LIBRARIES,
    IMAGE_LIBRARIES,
    IMAGES,
    NODES,
    busybox,
    debian,
    driver_edits,
    ldconfig,
    lib,
    link,
    make,
    put,
    watched_opens,
)

pytestmark = requires_binary("cc", "ldconfig")

DECLINED = "gpuwire-hook: cannot exec /nonexistent/python3"


@pytest.fixture(scope="module")
def hook() -> Iterator[str]:
    home = tempfile.mkdtemp(prefix="gpuwire-c-hook-")
    defines = launcher.hook_defines("/nonexistent/python3", home, f"{home}/nobody.sock")
    built = launcher.build_call(home, defines)
    assert built is not None
    yield built
    shutil.rmtree(home)


def run_hook(
    hook: str,
    root: Path,
    args: list[str],
    config: str | None = None,
    state: str | None = None,
    sigchld: signal.Handlers = signal.SIG_DFL,
) -> subprocess.CompletedProcess[str]:
    """The hook on the container whose root is `root` (`config`, `state`: the bundle's
    config.json and the OCI state instead), as runc runs a createContainer hook (the same
    mount namespace), with SIGCHLD as `sigchld`: its exit and stderr."""
    bundle = root.parent / f"{root.name}.bundle"
    bundle.mkdir(exist_ok=True)
    default = json.dumps({"ociVersion": "1.2.0", "root": {"path": str(root)}})
    (bundle / "config.json").write_text(default if config is None else config)
    ours = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": os.getpid(),
            "bundle": str(bundle)}  # fmt: skip
    return subprocess.run(
        ["gpuwire-hook", *args],
        executable=hook,
        input=json.dumps(ours) if state is None else state,
        capture_output=True,
        text=True,
        env={},
        timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGCHLD, sigchld),
    )


def snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path under `root`: a link's target, a file's bytes, a directory's mode."""
    seen: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            seen[name] = ("link", os.readlink(path))
        elif path.is_file():
            seen[name] = (oct(path.stat().st_mode), path.read_bytes())
        else:
            seen[name] = (oct(path.stat().st_mode), "")
    return seen


def mounted(root: Path, edits: Edits) -> None:
    """The driver's files where the engine bind-mounts them (the links are the hook's)."""
    for mount in edits.mounts:
        put(root, mount["containerPath"], Path(mount["hostPath"]).read_bytes())


def twins(tmp_path: Path, image: str, node: Path) -> tuple[Path, Path, Edits]:
    """Two identical roots of `image` with the driver mounted: one for each hook."""
    first = tmp_path / "c"
    edits = driver_edits(node, IMAGES[image](first))
    mounted(first, edits)
    second = tmp_path / "python"
    shutil.copytree(first, second, symlinks=True)
    return first, second, edits


@pytest.fixture
def node(sim_node: tuple[Path, object]) -> Path:
    from tests.runtime_hook.test_ldcache import with_32bit_libraries

    return with_32bit_libraries(sim_node[0])


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_c_hook_leaves_the_root_as_the_python_hook_does(
    hook: str, tmp_path: Path, node: Path, image: str
) -> None:
    c_root, python_root, edits = twins(tmp_path, image, node)
    out = run_hook(hook, c_root, ldcache_args(edits, "/sbin/ldconfig"))
    assert (out.returncode, out.stderr) == (0, "")
    assert make(python_root, edits)
    assert snapshot(c_root) == snapshot(python_root)
    assert (c_root / "etc/ld.so.cache").read_bytes().endswith(ldcache.GENERATOR)
    again = snapshot(c_root)
    assert run_hook(hook, c_root, ldcache_args(edits, "/sbin/ldconfig")).returncode == 0
    assert snapshot(c_root) == again  # a second start: nothing changes


@settings(max_examples=40, deadline=None)
@given(image=IMAGE_LIBRARIES, driver=DRIVER_LIBRARIES)
def test_any_image_and_libraries_get_pythons_cache_or_are_declined(
    hook: str, image: list[tuple[str, str]], driver: list[tuple[str, bool]]
) -> None:
    """The same bytes as the Python writer wherever it writes the cache; where it leaves the
    cache to ldconfig (names only a directory scan orders), the C declines, changing
    nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        put(root, "/etc/ld.so.conf", f"/usr/local/lib\n/opt/v/lib\n{DEB}\n".encode())
        for directory, soname in image:
            lib(root, f"{directory}/{soname}.image", soname)
        before = ldconfig(root)
        args = ["ldcache", "--ldconfig", "/sbin/ldconfig", "--folder", DEB]
        entries = []
        for n, (soname, dev_link) in enumerate(driver):
            lib(root, f"{DEB}/{soname}.driver{n}", soname)
            args += ["--link", f"{soname}.driver{n}::{DEB}/{soname}"]
            entries.append((f"{DEB}/{soname}", 0x303))
            if dev_link:
                dev = soname.split(".so")[0] + ".so"
                args += ["--link", f"{soname}::{DEB}/{dev}"]
                entries.append((f"{DEB}/{dev}", 0x303))
        for path, flags in entries:
            args += ["--entry", f"{flags:#x}::{path}"]
        untouched = snapshot(root)
        out = run_hook(hook, root, args)
        try:
            expected = ldsocache.update(before, entries, [DEB], ldcache.GENERATOR)
        except ldsocache.CacheFormatError:
            assert out.stderr.startswith(DECLINED)
            assert snapshot(root) == untouched
        else:
            assert (out.returncode, out.stderr) == (0, "")
            assert (root / "etc/ld.so.cache").read_bytes() == expected


def declined_unchanged(hook: str, root: Path, edits: Edits) -> None:
    before = snapshot(root)
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"))
    assert (out.returncode, out.stderr.strip()) == (127, f"{DECLINED}: No such file or directory")
    assert snapshot(root) == before


def test_a_link_the_image_holds_with_a_file_is_declined_and_no_link_is_left(
    hook: str, tmp_path: Path, node: Path
) -> None:
    """The Python hook leaves that cache to ldconfig; the C had made earlier links, and
    takes them back before it declines."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, debian(root))
    mounted(root, edits)
    lib(root, edits.links[-1][1], "libimage.so.1")  # the image's own file where the last link goes
    link(root, edits.links[0][1], "libcuda.so.418")  # an image's link the C would replace
    declined_unchanged(hook, root, edits)


@pytest.mark.parametrize(
    "cache", [b"ld.so-1.7.0\0" + bytes(4), b"glibc-ld.so.cache1.1" + bytes(8) + b"\3" + bytes(19)]
)
def test_a_cache_in_another_format_is_declined(
    hook: str, tmp_path: Path, node: Path, cache: bytes
) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    put(root, "/etc/ld.so.cache", cache)
    declined_unchanged(hook, root, edits)


def test_a_cache_that_is_not_a_file_is_declined(hook: str, tmp_path: Path, node: Path) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    (root / "etc/ld.so.cache").mkdir()
    declined_unchanged(hook, root, edits)


@pytest.mark.parametrize("kind", sorted(NODES))
def test_a_cache_that_is_a_device_fifo_or_socket_is_declined_unopened(
    hook: str, tmp_path: Path, node: Path, kind: str
) -> None:
    """As the Python hook refuses it, unopened (test_ldcache.py's test of the same name)."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    cache = root / "etc/ld.so.cache"
    NODES[kind](cache)
    with watched_opens(cache) as opened:
        declined_unchanged(hook, root, edits)
    assert not opened()


def test_a_directory_the_image_links_to_the_host_is_looked_up_in_the_root(
    hook: str, tmp_path: Path, node: Path
) -> None:
    """The image's library directory is a link to a host path: in the root nothing is there,
    so the C declines; nothing is written where the link points on the host."""
    host = tmp_path / "host-lib"
    host.mkdir()
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    folder = root / edits.ldcache_folders[0].lstrip("/")
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(host)
    declined_unchanged(hook, root, edits)
    assert list(host.iterdir()) == []


def test_a_cache_link_to_the_host_is_replaced_in_the_root(
    hook: str, tmp_path: Path, node: Path
) -> None:
    victim = tmp_path / "host-ld.so.cache"
    victim.write_bytes(b"host data\n")
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    (root / "etc/ld.so.cache").symlink_to(victim)
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"))
    assert (out.returncode, out.stderr) == (0, "")
    assert victim.read_bytes() == b"host data\n"
    assert (root / "etc/ld.so.cache").read_bytes().endswith(ldcache.GENERATOR)


@pytest.mark.parametrize(
    "args",
    [
        ["ldcache", "--folder", DEB],  # no ldconfig
        ["ldcache", "--ldconfig", "/sbin/ldconfig", "--link", "no-separator"],
        ["ldcache", "--ldconfig", "/sbin/ldconfig", "--entry", "0X303::/usr/lib/libx.so.1"],
        ["ldcache", "--ldconfig"],
    ],
)
def test_arguments_the_python_hook_refuses_are_left_to_it(
    hook: str, tmp_path: Path, args: list[str]
) -> None:
    root = tmp_path / "rootfs"
    busybox(root)
    before = snapshot(root)
    out = run_hook(hook, root, args)
    assert out.stderr.startswith(DECLINED)
    assert snapshot(root) == before


def test_config_json_is_read_as_json_not_searched(hook: str, tmp_path: Path, node: Path) -> None:
    """A pod's annotation that spells a root member inside a string does not move the root;
    a config.json that is not JSON is declined."""
    decoy = tmp_path / "decoy"
    busybox(decoy)
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    spelled = json.dumps({"root": {"path": str(decoy)}})
    config = json.dumps({"annotations": {"a": spelled, "b": '\\"}'}, "root": {"path": str(root)}})
    untouched = snapshot(decoy)
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"), config)
    assert (out.returncode, out.stderr) == (0, "")
    assert (root / "etc/ld.so.cache").read_bytes().endswith(ldcache.GENERATOR)
    assert snapshot(decoy) == untouched
    before = snapshot(root)
    truncated = config[:-1]
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"), truncated)
    assert out.stderr.startswith(DECLINED)
    assert snapshot(root) == before


def test_a_link_the_cache_leads_through_is_made_before_the_cache_is_read(
    hook: str, tmp_path: Path, node: Path
) -> None:
    """As the Python hook: the image's cache is a dangling link to where a link goes, so the
    cache path leads to a library once the links are made: not a cache gpuwire writes."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    (root / "etc/ld.so.cache").symlink_to(edits.links[0][1])
    declined_unchanged(hook, root, edits)


def test_of_a_member_named_twice_the_last_counts_and_json_is_strict(
    hook: str, tmp_path: Path, node: Path
) -> None:
    decoy = tmp_path / "decoy"
    busybox(decoy)
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    untouched = snapshot(decoy)
    twice = f'{{"root": {{"path": "{decoy}"}}, "root": {{"path": "{root}"}}}}'
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"), twice)
    assert (out.returncode, out.stderr) == (0, "")
    assert snapshot(decoy) == untouched
    before = snapshot(root)
    for config in (f'{{"root": {{"path": "{root}"}}, "x": tru}}', '{"root": nul}',
                   f'{{"pid": 05, "root": {{"path": "{root}"}}}}',
                   f'{{"root": {{"path": "{root}"}}, "x": "\\q"}}'):  # fmt: skip
        out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"), config)
        assert out.stderr.startswith(DECLINED), config
    assert snapshot(root) == before


def with_dynamic_beyond_the_end(tmp_path: Path) -> str:
    """The host's ldconfig with its PT_DYNAMIC segment made 1 TiB long, past its end."""
    data = bytearray(Path("/sbin/ldconfig").read_bytes())
    at, size, count = (
        int.from_bytes(data[i : i + n], "little") for i, n in ((32, 8), (54, 2), (56, 2))
    )
    for entry in range(at, at + size * count, size):
        if int.from_bytes(data[entry : entry + 4], "little") == 2:  # PT_DYNAMIC
            data[entry + 32 : entry + 40] = (1 << 40).to_bytes(8, "little")
    copy = tmp_path / "ldconfig"
    copy.write_bytes(bytes(data))
    copy.chmod(0o755)
    return str(copy)


@pytest.mark.parametrize("ldconfig", ["/nonexistent/ldconfig", "/bin/ls", "dynamic-beyond"])
def test_an_ldconfig_the_python_hook_refuses_is_left_to_it(
    hook: str, tmp_path: Path, node: Path, ldconfig: str
) -> None:
    """Not there, dynamic, or an ELF file the Python hook's reader cannot read: it fails the
    start and names it."""
    if ldconfig == "dynamic-beyond":
        ldconfig = with_dynamic_beyond_the_end(tmp_path)
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    before = snapshot(root)
    out = run_hook(hook, root, ldcache_args(edits, ldconfig))
    assert out.stderr.startswith(DECLINED)
    assert snapshot(root) == before


def test_an_ignored_sigchld_does_not_hide_the_work_done(
    hook: str, tmp_path: Path, node: Path
) -> None:
    """SIGCHLD ignored is inherited across exec; the C's own child must still be waited for."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    out = run_hook(hook, root, ldcache_args(edits, "/sbin/ldconfig"), sigchld=signal.SIG_IGN)
    assert (out.returncode, out.stderr) == (0, "")
    assert (root / "etc/ld.so.cache").read_bytes().endswith(ldcache.GENERATOR)


def recording_hook(tmp_path: Path) -> tuple[str, Path]:
    """The hook built with a fallback that stands in for the Python hook: it keeps its stdin
    in the file returned, and its SIGCHLD disposition beside it (`.sigchld`)."""
    received = tmp_path / "received"
    code = (
        "import signal, sys; "
        f"open({str(received)!r} + '.sigchld', 'w').write(str(signal.getsignal(signal.SIGCHLD))); "
        f"open({str(received)!r}, 'wb').write(sys.stdin.buffer.read())"
    )
    home = tmp_path / "libexec"
    home.mkdir()
    defines = launcher.hook_defines(sys.executable, str(home), f"{home}/nobody.sock")
    defines = [d for d in defines if not d.startswith("-DHOOK_CODE=")]
    built = launcher.build_call(str(home), [*defines, f"-DHOOK_CODE={launcher.c_string(code)}"])
    assert built is not None
    return built, received


@pytest.mark.parametrize("padding", [0, 3 << 20])
def test_a_declined_call_hands_the_whole_oci_state_on(tmp_path: Path, padding: int) -> None:
    """What the Python hook reads as stdin is the OCI state as the runtime wrote it, however
    large (the C reads at most 1 MiB of it and tries nothing then)."""
    built, received = recording_hook(tmp_path)
    root = tmp_path / "rootfs"
    busybox(root)
    state = json.dumps({"bundle": "/nonexistent", "pid": 1, "annotations": {"a": "x" * padding}})
    out = run_hook(built, root, ["ldcache", "--ldconfig", "/sbin/ldconfig"], state=state)
    assert (out.returncode, out.stderr) == (0, "")
    assert received.read_text() == state


@pytest.mark.parametrize("sigchld", [signal.SIG_IGN, signal.SIG_DFL])
def test_a_declined_call_leaves_sigchld_as_it_was_given(
    tmp_path: Path, node: Path, sigchld: signal.Handlers
) -> None:
    built, received = recording_hook(tmp_path)
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    put(root, "/etc/ld.so.cache", b"ld.so-1.7.0\0" + bytes(4))  # declined after the links
    out = run_hook(built, root, ldcache_args(edits, "/sbin/ldconfig"), sigchld=sigchld)
    assert (out.returncode, out.stderr) == (0, "")
    assert Path(f"{received}.sigchld").read_text() == str(sigchld)


def test_a_link_in_a_directory_another_link_makes_is_declined(hook: str, tmp_path: Path) -> None:
    """The Python hook keeps each directory it opened, so a link made through a directory
    link another one replaces lands elsewhere: left to it."""
    root = tmp_path / "rootfs"
    busybox(root)
    (root / "opt/a").mkdir(parents=True)
    (root / "opt/b").mkdir()
    (root / "opt/d").symlink_to("a")
    args = ["ldcache", "--ldconfig", "/sbin/ldconfig", "--link", "x::/opt/d/x",
            "--link", "b::/opt/d", "--link", "y::/opt/d/y"]  # fmt: skip
    before = snapshot(root)
    assert run_hook(hook, root, args).stderr.startswith(DECLINED)
    assert snapshot(root) == before


def test_an_integer_python_does_not_read_is_declined(hook: str, tmp_path: Path) -> None:
    """Python refuses to read an integer of more than 4300 digits: so does the C."""
    root = tmp_path / "rootfs"
    busybox(root)
    args = ["ldcache", "--ldconfig", "/sbin/ldconfig", "--link", "x::/etc/x"]
    for digits, declined in ((4300, False), (4301, True)):
        config = f'{{"x": {"1" * digits}, "root": {json.dumps({"path": str(root)})}}}'
        out = run_hook(hook, root, args, config)
        assert out.stderr.startswith(DECLINED) == declined, digits


def test_an_image_link_replaced_and_taken_back_keeps_its_owner(
    hook: str, tmp_path: Path, node: Path
) -> None:
    """Declined after the links (a cache only ldconfig writes): the image's own link where a
    driver link goes is put back as it was, target and owner."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    mounted(root, edits)
    put(root, "/etc/ld.so.cache", b"ld.so-1.7.0\0" + bytes(4))
    place = root / edits.links[0][1].lstrip("/")
    link(root, edits.links[0][1], "libcuda.so.418")
    os.lchown(place, 1234, 5678)
    declined_unchanged(hook, root, edits)
    assert (place.lstat().st_uid, place.lstat().st_gid) == (1234, 5678)
