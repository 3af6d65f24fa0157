"""The ld cache gpuwire writes is the one ldconfig writes: byte for byte, entry for entry,
and the dynamic loader finds the driver through it.

Each image below is a root filesystem as a container gets it: libraries in several
`ld.so.conf` directories, the cache its build made with the real ldconfig (or none),
32-bit libraries, glibc-hwcaps and legacy hwcap subdirectories, libraries of its own that
the driver also ships. Then gpuwire's edits for the simulated node: the driver's libraries
(copied where a container gets them bind-mounted) and their links. The reference is the
real `ldconfig -X -r ROOT FOLDERS` on the same files: what gpuwire ran before it wrote
the cache itself, and what it still runs where it cannot write it exactly.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwire import elf, ldsocache, resolve, sim
from gpuwire.driver import discover
from gpuwire.edits import Edits, Layout, container_edits
from gpuwire.elfstub import shared_object
from gpuwire.roots import Roots
from runtime_hook.injection import inroot, ldcache
from testbed.rootfs import busybox_rootfs
from tests.conftest import requires_binary

pytestmark = requires_binary("ldconfig")

VERSION = sim.DEFAULT_DRIVER
DEB, DEB32 = "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu"
CAPABILITIES = ("compute", "utility", "video", "graphics", "compat32")


def put(root: Path, path: str, data: bytes) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def lib(root: Path, path: str, soname: str, **kwargs: Any) -> None:
    put(root, path, shared_object(soname, **kwargs))


def link(root: Path, path: str, target: str) -> None:
    place = root / path.lstrip("/")
    place.parent.mkdir(parents=True, exist_ok=True)
    if place.is_symlink():
        place.unlink()
    place.symlink_to(target)


def ldconfig(root: Path, *args: str) -> bytes:
    """What the real ldconfig writes as `root`'s cache."""
    tool = shutil.which("ldconfig")
    assert tool is not None
    subprocess.run([tool, *args, "-r", str(root)], check=True, capture_output=True)
    return (root / "etc/ld.so.cache").read_bytes()


def reference(root: Path, folders: list[str]) -> bytes:
    """`ldconfig -X -r ROOT FOLDERS` on a copy of `root` (the root itself stays as it was)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "root"
        shutil.copytree(root, copy, symlinks=True)
        tool = shutil.which("ldconfig")
        assert tool is not None
        (copy / "etc").mkdir(exist_ok=True)
        subprocess.run([tool, "-X", "-r", str(copy), *folders], check=True, capture_output=True)
        return (copy / "etc/ld.so.cache").read_bytes()


def generator(cache: bytes) -> bytes:
    """The generator string ldconfig signs its cache with (the file's last bytes)."""
    return cache[cache.rindex(b"ldconfig (") :]


def listing(cache: bytes) -> list[str]:
    """`ldconfig -p` on the cache: every entry as ld.so sees it, in order."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(cache)
        f.flush()
        out = subprocess.run(
            ["ldconfig", "-p", "-C", f.name], check=True, capture_output=True, text=True
        ).stdout
    count, *entries = out.splitlines()
    return [count.split(" in cache ")[0], *(e for e in entries if e.startswith("\t"))]


# -- the node and the images -------------------------------------------------------------


def with_32bit_libraries(node: Path) -> Path:
    """The simulated node, with 32-bit compute libraries (compat32) as the driver has them."""
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-opencl.so"):
        soname = f"{name}.1"
        lib(node, f"{DEB32}/{name}.{VERSION}", soname, bits=32, needed=("libc.so.6",))
        link(node, f"{DEB32}/{soname}", f"{name}.{VERSION}")
    return node


@pytest.fixture
def node(sim_node: tuple[Path, sim.Machine]) -> Path:
    return with_32bit_libraries(sim_node[0])


def driver_edits(node: Path, debian: bool) -> Edits:
    """What gpuwire injects from `node` (all capabilities, 32-bit too)."""
    driver = discover(Roots(str(node)), CAPABILITIES)
    return container_edits(driver, driver.devices[:1], CAPABILITIES, Layout.of(debian=debian))


def inject(root: Path, edits: Edits) -> None:
    """The files a container gets: each library where runc bind-mounts it, and the links."""
    for mount in edits.mounts:
        put(root, mount["containerPath"], Path(mount["hostPath"]).read_bytes())
    for target, path in edits.links:
        link(root, path, target)


def busybox(root: Path) -> bool:
    """No libraries, no cache: busybox is static."""
    busybox_rootfs(root)
    return True


def debian(
    root: Path,
    *cache_format: str,
    hwcaps: tuple[str, ...] = (
        "glibc-hwcaps/x86-64-v3",
        "glibc-hwcaps/x86-64-v2",
        "tls",
        "haswell",
        "tls/x86_64",
    ),
) -> bool:
    """Libraries in five directories of three conf files, the same SONAME in several (one
    of them the driver's own, libnvidia-ml, in a directory scanned before the driver's),
    32-bit ones, glibc-hwcaps and legacy hwcap subdirectories, numbers of every width."""
    busybox_rootfs(root)
    put(root, "/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    put(root, "/etc/ld.so.conf.d/a.conf", b"/usr/local/lib\n/opt/vendor/lib\n")
    put(root, "/etc/ld.so.conf.d/x86_64-linux-gnu.conf", f"/lib/x86_64-linux-gnu\n{DEB}\n".encode())
    put(root, "/etc/ld.so.conf.d/i386-linux-gnu.conf", f"{DEB32}\n".encode())
    for i in range(30):
        soname = f"libthing{i}.so.{i % 3}"
        lib(root, f"{DEB}/{soname}.0.{i}", soname, needed=("libc.so.6",))
        link(root, f"{DEB}/{soname}", f"{soname}.0.{i}")
        link(root, f"{DEB}/libthing{i}.so", soname)
    for name in ("lib10.so", "lib9.so", "lib09x.so", "libA.so.001", "libA.so.1", "libZ-2.so"):
        lib(root, f"{DEB}/{name}", name)
    lib(root, "/usr/local/lib/libcuda.so.1", "libcuda.so.1")  # an image's own stub
    lib(root, "/opt/vendor/lib/libnvidia-ml.so.1", "libnvidia-ml.so.1")
    lib(root, f"{DEB}/libnvidia-ml.so.470.82.01", "libnvidia-ml.so.1")  # an older driver's
    link(root, f"{DEB}/libnvidia-ml.so.1", "libnvidia-ml.so.470.82.01")
    lib(root, "/lib/x86_64-linux-gnu/libz.so.1.2.13", "libz.so.1")
    link(root, "/lib/x86_64-linux-gnu/libz.so.1", "libz.so.1.2.13")
    lib(root, "/usr/local/lib/libz.so.1", "libz.so.1")
    lib(root, f"{DEB32}/libz.so.1", "libz.so.1", bits=32, needed=("libc.so.6",))
    lib(root, f"{DEB32}/libold.so.2", "libold.so.2", bits=32)
    for sub in hwcaps:
        lib(root, f"{DEB}/{sub}/libthing1.so.1", "libthing1.so.1")
    ldconfig(root, *cache_format)
    return True


def compat(root: Path) -> bool:
    """The same image, its cache in the format glibc before 2.32 wrote (old and new),
    without hwcap subdirectories: ldconfig 2.36 aborts on them in this format (a double
    free), and glibc-hwcaps came after it."""
    return debian(root, "-c", "compat", hwcaps=())


def rhel(root: Path) -> bool:
    """No /etc/debian_version: the driver goes to /usr/lib64 and /usr/lib."""
    busybox_rootfs(root, debian=False)
    put(root, "/etc/ld.so.conf", b"include ld.so.conf.d/*.conf\n")
    put(root, "/etc/ld.so.conf.d/lib.conf", b"/usr/lib64\n/usr/lib\n/usr/local/lib64\n")
    lib(root, "/usr/lib64/libc.so.6", "libc.so.6", interpreter="/lib64/ld-linux-x86-64.so.2")
    lib(root, "/usr/lib64/libcuda.so.418.87.01", "libcuda.so.1")  # an old driver's, whose
    link(root, "/usr/lib64/libcuda.so.1", "libcuda.so.418.87.01")  # link the driver's replaces
    lib(root, "/usr/local/lib64/libcuda.so.1", "libcuda.so.1")
    lib(root, "/usr/lib/libc.so.6", "libc.so.6", bits=32, interpreter="/lib/ld-linux.so.2")
    ldconfig(root)
    return False


IMAGES: dict[str, Callable[[Path], bool]] = {
    "busybox": busybox,
    "debian": debian,
    "compat": compat,
    "rhel": rhel,
}


# -- byte for byte -----------------------------------------------------------------------


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_cache_is_byte_for_byte_what_ldconfig_writes(
    tmp_path: Path, node: Path, image: str
) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, IMAGES[image](root))
    cache = root / "etc/ld.so.cache"
    before = cache.read_bytes() if cache.exists() else None
    inject(root, edits)
    expected = reference(root, edits.ldcache_folders)
    assert edits.ldcache_entries is not None
    written = ldsocache.update(
        before, edits.ldcache_entries, edits.ldcache_folders, generator(expected)
    )
    assert written == expected


def test_the_driver_comes_first_among_libraries_of_the_same_name(
    tmp_path: Path, node: Path
) -> None:
    """ldconfig scans the folders it is given first: the driver's libnvidia-ml.so.1 is
    found before the image's copy in a directory its own conf scans earlier."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, debian(root))
    before = (root / "etc/ld.so.cache").read_bytes()
    assert edits.ldcache_entries is not None
    written = ldsocache.update(before, edits.ldcache_entries, edits.ldcache_folders, b"x")

    def found(cache: bytes) -> list[str]:
        return [
            line.split(" => ")[1]
            for line in listing(cache)
            if line.startswith("\tlibnvidia-ml.so.1 (libc6,x86-64)")
        ]

    assert found(before) == ["/opt/vendor/lib/libnvidia-ml.so.1", f"{DEB}/libnvidia-ml.so.1"]
    assert found(written) == [f"{DEB}/libnvidia-ml.so.1", "/opt/vendor/lib/libnvidia-ml.so.1"]


SONAMES = st.builds(
    "lib{}.so.{}".format,
    st.sampled_from(["a", "b", "z", "A", "cuda", "x-y", "x_y", "q9", "q10"]),
    st.lists(
        st.integers(0, 999_999_999).map(str) | st.sampled_from(["0", "01", "007", "10"]),
        min_size=1,
        max_size=3,
    ).map(".".join),
)


# (folder, SONAME) of an image's libraries; (SONAME, with a `.so` link) of the driver's
IMAGE_LIBRARIES = st.lists(
    st.tuples(st.sampled_from(["/usr/local/lib", "/opt/v/lib", DEB]), SONAMES), max_size=12
)
DRIVER_LIBRARIES = st.lists(st.tuples(SONAMES, st.booleans()), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(image=IMAGE_LIBRARIES, driver=DRIVER_LIBRARIES)
def test_random_images_and_libraries_match_ldconfig(
    image: list[tuple[str, str]], driver: list[tuple[str, bool]]
) -> None:
    """Any image libraries, any driver libraries (SONAME, with a `.so` development link or
    not): the same bytes as ldconfig, or left to it where only its directory scan orders
    them (two names `_dl_cache_libcmp` calls equal in the driver's folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        put(root, "/etc/ld.so.conf", f"/usr/local/lib\n/opt/v/lib\n{DEB}\n".encode())
        for directory, soname in image:
            lib(root, f"{directory}/{soname}.image", soname)
        before = ldconfig(root)
        libraries: list[tuple[str, str | None, int | None]] = []
        links: list[tuple[str, str]] = []
        for n, (soname, dev_link) in enumerate(driver):
            name = f"{soname}.driver{n}"
            lib(root, f"{DEB}/{name}", soname)
            link(root, f"{DEB}/{soname}", name)
            libraries.append((name, soname, 0x303))
            links.append((name, soname))
            if dev_link:
                dev = soname.split(".so")[0] + ".so"
                link(root, f"{DEB}/{dev}", soname)
                links.append((soname, dev))
        entries = ldsocache.folder_entries(DEB, libraries, links)
        expected = reference(root, [DEB])
        assert entries is not None
        added = {soname for soname, _ in driver}
        beside = added | {soname for directory, soname in image if directory == DEB}
        if any(a != b and libcmp(a.encode(), b.encode()) == 0 for a in added for b in beside):
            with pytest.raises(ldsocache.CacheFormatError):
                ldsocache.update(before, entries, [DEB], generator(expected))
        else:
            assert ldsocache.update(before, entries, [DEB], generator(expected)) == expected


@pytest.mark.parametrize(("image_folder", "written"), [("/usr/local/lib", True), (DEB, False)])
def test_names_ldconfig_calls_equal_are_written_where_folders_order_them(
    tmp_path: Path, image_folder: str, written: bool
) -> None:
    """The image's liba.so.01 and the driver's liba.so.1 compare equal. In two folders
    ldconfig's folder order decides and gpuwire writes what it does; in one folder the
    directory's order decides (ext4's is by hash) and gpuwire leaves the cache to ldconfig."""
    put(tmp_path, "/etc/ld.so.conf", f"/usr/local/lib\n{DEB}\n".encode())
    lib(tmp_path, f"{image_folder}/liba.so.01", "liba.so.01")
    before = ldconfig(tmp_path)
    lib(tmp_path, f"{DEB}/liba.so.1", "liba.so.1")
    expected = reference(tmp_path, [DEB])
    added = [(f"{DEB}/liba.so.1", 0x303)]
    if written:
        assert ldsocache.update(before, added, [DEB], generator(expected)) == expected
    else:
        with pytest.raises(ldsocache.CacheFormatError):
            ldsocache.update(before, added, [DEB], generator(expected))


# -- what ldconfig files a library under ------------------------------------------------


@pytest.mark.parametrize(
    ("stub", "flags"),
    [
        ({}, 0x303),  # x86-64: always libc6
        ({"bits": 32, "needed": ("libc.so.6",)}, 0x3),
        ({"bits": 32, "needed": ("libdl.so.2", "libm.so.6")}, 0x3),
        ({"bits": 32, "interpreter": "/lib/ld-linux.so.2"}, 0x3),
        ({"bits": 32, "needed": ("libdl.so.2",)}, 0x1),  # plain ELF
        ({"bits": 32, "machine": 62}, 0x803),  # x32
        ({"machine": 183}, None),  # AArch64: ldconfig here skips it
        ({"kind": 2}, None),  # an executable
    ],
)
def test_library_flags_are_ldconfigs(
    tmp_path: Path, stub: dict[str, object], flags: int | None
) -> None:
    lib(tmp_path, f"{DEB}/libprobe.so.1", "libprobe.so.1", **stub)
    fd = os.open(tmp_path / f"{DEB.lstrip('/')}/libprobe.so.1", os.O_RDONLY)
    try:
        assert ldsocache.library_flags(elf.read(fd)) == flags
    finally:
        os.close(fd)
    listed = {e.path: e.flags for e in ldsocache.parse(reference(tmp_path, [DEB]))}
    assert listed.get(f"{DEB}/libprobe.so.1".encode()) == flags


# -- the order ld.so searches ----------------------------------------------------------


def libcmp(a: bytes, b: bytes) -> int:
    """glibc's `_dl_cache_libcmp` (elf/dl-cache.c), step by step, for ASCII names."""
    i = j = 0
    while i < len(a):
        if a[i : i + 1].isdigit():
            if not b[j : j + 1].isdigit():
                return 1
            start = i
            while a[i : i + 1].isdigit():
                i += 1
            left = int(a[start:i])
            start = j
            while b[j : j + 1].isdigit():
                j += 1
            right = int(b[start:j])
            if left != right:
                return left - right
        elif b[j : j + 1].isdigit():
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return a[i] - (b[j] if j < len(b) else 0)
        else:
            i, j = i + 1, j + 1
    return -(b[j] if j < len(b) else 0)


def _fits_a_c_int(name: bytes) -> bool:
    """ldconfig's numbers are C ints: names with larger ones are left to it (below)."""
    runs = bytes(c if c in b"0123456789" else 32 for c in name).split()
    return all(int(run) <= 2**31 - 1 for run in runs)


NAMES = (
    st.text(st.sampled_from("lib.so-_xyzA0123456789"), max_size=14)
    .map(str.encode)
    .filter(_fits_a_c_int)
)


@given(NAMES, NAMES)
def test_sort_key_orders_names_as_dl_cache_libcmp(a: bytes, b: bytes) -> None:
    order = libcmp(a, b)
    ka, kb = ldsocache.libcmp_key(a), ldsocache.libcmp_key(b)
    assert (order > 0, order == 0) == (ka > kb, ka == kb)


@pytest.mark.parametrize("name", [b"libfoo.so.2147483648", "libé.so.1".encode()])
def test_names_ldconfig_compares_differently_are_left_to_it(name: bytes) -> None:
    """A number past a C int overflows in ldconfig, and x86 compares non-ASCII bytes as
    signed: gpuwire does not write such a cache (ldconfig does)."""
    with pytest.raises(ldsocache.CacheFormatError):
        ldsocache.libcmp_key(name)


# -- reading what is there ---------------------------------------------------------------


def test_parsing_reads_every_entry_ldconfig_lists(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    debian(root)
    cache = (root / "etc/ld.so.cache").read_bytes()
    rows = [f"\t{e.name.decode()} " for e in ldsocache.parse(cache)]
    lines = listing(cache)[1:]
    assert len(rows) == len(lines) > 40
    assert all(line.startswith(row) for row, line in zip(rows, lines, strict=True))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"ld.so-1.7.0\0" + bytes(4), "not in glibc's ld.so.cache format 1.1"),  # old only
        (b"glibc-ld.so.cache1.0" + bytes(40), "not in glibc's ld.so.cache format 1.1"),
        (b"glibc-ld.so.cache1.1" + bytes(8) + b"\3" + bytes(19), "not little-endian"),
        (b"glibc-ld.so.cache1.1" + b"\5\0\0\0" + bytes(24), "5 entries do not fit"),
    ],
)
def test_caches_in_other_formats_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ldsocache.CacheFormatError, match=message):
        ldsocache.parse(data)


def test_a_string_past_the_end_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    busybox(root)
    lib(root, f"{DEB}/libx.so.1", "libx.so.1")
    cache = bytearray(ldconfig(root))
    cache[52:56] = (len(cache) + 100).to_bytes(4, "little")  # the first entry's name
    with pytest.raises(ldsocache.CacheFormatError, match="past the end"):
        ldsocache.parse(bytes(cache))


@pytest.mark.parametrize(
    ("name", "path"),
    [(b"lib" + b"x" * 253, b"/lib/x"), (b"libx.so.1", b"/" + b"d" * 4096 + b"/libx.so.1")],
)
def test_a_name_or_path_longer_than_linux_allows_is_refused(name: bytes, path: bytes) -> None:
    """The image's cache may point every entry at one long string: each is read at most as
    far as a file name (255) or a path (4096) goes, and one longer is not a cache's."""
    cache = ldsocache.render([ldsocache.Entry(name, path, 0x303)], b"x")
    assert ldsocache.parse(ldsocache.render([ldsocache.Entry(name[:255], b"/l", 0x303)], b"x"))
    with pytest.raises(ldsocache.CacheFormatError, match="longer than"):
        ldsocache.parse(cache)


def test_more_entries_than_a_cache_has_are_refused() -> None:
    entry = ldsocache.Entry(b"libx.so.1", b"/l/libx.so.1", 0x303)
    cache = ldsocache.render([entry] * (ldsocache.MAX_ENTRIES + 1), b"x")
    with pytest.raises(ldsocache.CacheFormatError, match="more than"):
        ldsocache.parse(cache)


# -- writing it into a root --------------------------------------------------------------


def make(root: Path, edits: Edits) -> bool:
    journal = inroot.Journal()
    try:
        dirs = inroot.Dirs(journal.keep(resolve.open_root(str(root))), journal)
        return ldcache.make(dirs, edits.links, edits.ldcache_folders, edits.ldcache_entries)
    finally:
        journal.close()


def test_writing_into_the_root_gives_ldconfigs_entries(tmp_path: Path, node: Path) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, debian(root))
    inject(root, edits)  # the library files, for the reference only: gpuwire reads none
    expected = reference(root, edits.ldcache_folders)
    for _, path in edits.links:
        (root / path.lstrip("/")).unlink()  # gpuwire makes them
    assert make(root, edits)
    written = (root / "etc/ld.so.cache").read_bytes()
    assert listing(written) == listing(expected)
    assert written.endswith(ldcache.GENERATOR)
    assert all((root / path.lstrip("/")).is_symlink() for _, path in edits.links)
    stat = (root / "etc/ld.so.cache").stat()
    assert (stat.st_mode & 0o777, sorted(os.listdir(root / "etc"))) == (
        0o644,
        sorted(["debian_version", "group", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd"]),
    )
    assert make(root, edits)  # again: the same file
    assert (root / "etc/ld.so.cache").read_bytes() == written


def test_a_link_the_image_holds_with_a_file_leaves_the_cache_to_ldconfig(
    tmp_path: Path, node: Path
) -> None:
    """ldconfig would read the image's file there: gpuwire cannot know what it lists."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, debian(root))
    lib(root, f"{DEB}/libcuda.so", "libcuda.so.1")  # a copy, where the dev link goes
    before = (root / "etc/ld.so.cache").read_bytes()
    assert not make(root, edits)
    assert (root / "etc/ld.so.cache").read_bytes() == before
    assert (root / f"{DEB.lstrip('/')}/libcuda.so.1").is_symlink()  # the other links are made


@pytest.mark.parametrize(
    "cache", [b"ld.so-1.7.0\0" + bytes(4), b"glibc-ld.so.cache1.1" + bytes(8) + b"\3" + bytes(19)]
)
def test_a_cache_in_another_format_is_left_to_ldconfig(
    tmp_path: Path, node: Path, cache: bytes
) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    put(root, "/etc/ld.so.cache", cache)
    assert not make(root, edits)
    assert (root / "etc/ld.so.cache").read_bytes() == cache


def test_a_cache_link_to_the_host_is_resolved_in_the_root_and_replaced(
    tmp_path: Path, node: Path
) -> None:
    victim = tmp_path / "host-ld.so.cache"
    victim.write_bytes(b"host data\n")
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    (root / "etc/ld.so.cache").symlink_to(victim)  # dangling inside the root
    assert make(root, edits)
    assert victim.read_bytes() == b"host data\n"
    assert not (root / "etc/ld.so.cache").is_symlink()
    assert any("libcuda.so.1 " in line for line in listing((root / "etc/ld.so.cache").read_bytes()))


def test_a_cache_that_is_not_a_file_fails_clearly(tmp_path: Path, node: Path) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    (root / "etc/ld.so.cache").mkdir()
    with pytest.raises(ldcache.LdcacheError, match=r"ld\.so\.cache in the container is a dir"):
        make(root, edits)


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))  # the file stays


# What an image may hold where gpuwire reads a file: each is refused by its type, unopened.
NODES: dict[str, Callable[[Path], None]] = {
    "a character device": lambda p: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(1, 3)),
    "a FIFO": os.mkfifo,
    "a socket": _socket,
}


@contextmanager
def watched_opens(path: Path) -> Iterator[Callable[[], bool]]:
    """Whether anything opened `path` while in the block, as inotify's IN_OPEN reports it: a
    device's open, a FIFO's; a lookup with O_PATH is none (it opens nothing of the file's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    assert libc.inotify_add_watch(fd, os.fsencode(path), 0x20) >= 0  # IN_OPEN, alone
    events: list[bytes] = []
    try:
        yield lambda: bool(events[0])
    finally:
        try:
            events.append(os.read(fd, 4096))
        except BlockingIOError:
            events.append(b"")
        os.close(fd)


@pytest.mark.parametrize("kind", sorted(NODES))
def test_a_cache_that_is_a_device_fifo_or_socket_is_refused_unopened(
    tmp_path: Path, node: Path, kind: str
) -> None:
    """An image's /etc/ld.so.cache may be a device node whose open has side effects (a
    watchdog's starts its countdown), or a FIFO whose open waits: gpuwire reads it as host
    root, outside the container's device cgroup, so it must not open it at all."""
    root = tmp_path / "rootfs"
    edits = driver_edits(node, busybox(root))
    cache = root / "etc/ld.so.cache"  # busybox has none
    NODES[kind](cache)
    message = f"/etc/ld.so.cache in the container is {kind}, not a regular file: refused, unopened"
    with watched_opens(cache) as opened, pytest.raises(ldcache.LdcacheError) as refused:
        make(root, edits)
    assert not opened()
    assert str(refused.value) == message


def test_a_failed_write_leaves_no_file_behind(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "rootfs"
    edits = driver_edits(node, debian(root))
    before = sorted(os.listdir(root / "etc")), (root / "etc/ld.so.cache").read_bytes()

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(OSError, match="No space left"):
        make(root, edits)
    assert (sorted(os.listdir(root / "etc")), (root / "etc/ld.so.cache").read_bytes()) == before


# -- the dynamic loader ------------------------------------------------------------------


# -- with real runc: the shim and the prestart hook -------------------------------------
