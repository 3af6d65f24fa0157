"""glibc's `/etc/ld.so.cache`, read and written byte for byte as ldconfig writes it.

A GPU container needs the cache to name the driver's libraries. Rather than run ldconfig
(a static host binary, exec'd confined: `runtime_hook.injection.ldcache`), gpuwire reads the image's
cache, puts in the entries ldconfig would make for the files it mounted and linked, and
writes the result in glibc's format (glibc 2.33 to 2.36, `elf/cache.c`, `elf/dl-cache.h`,
`elf/stringtable.c`):

- a 48-byte header: `glibc-ld.so.cache1.1`, the number of entries, the string table's
  size, the endianness (2: little) and the offset of the extension directory;
- 24-byte entries: flags (the ELF class and ABI: `FLAG_ELF_LIBC6 | FLAG_X8664_LIB64` is
  0x303), the name's and the path's offsets in the string table (counted from the
  header), an OS version (0 since 2.35) and the hwcap field: legacy hwcap bits, or bit 62
  with an index into the glibc-hwcaps subdirectory names and an ISA level in bits 32-41;
- the string table: every name and path once, ordered by reversed bytes, descending, each
  string that ends the one before it stored as that one's tail;
- at a 4-byte boundary the extension directory (magic 0xeaa42174): the generator string
  and, when used, the sorted glibc-hwcaps subdirectory names as string offsets.

Entries are sorted as `ld.so`'s binary search expects: by `_dl_cache_libcmp` descending
(runs of digits compare as numbers, a digit sorts above any other character), then flags
descending, glibc-hwcaps entries first by subdirectory name, then legacy hwcap bits
(most bits first, then value), then OS version, all descending; equal entries keep
ldconfig's scan order, in which the folders named on its command line come first. Within
one folder that order is the file system's directory order, which this module does not
know: names `_dl_cache_libcmp` calls equal there (`liba.so.1`, `liba.so.01`) are left to
ldconfig.

A cache written before glibc 2.32 may carry the old format in front ("ld.so-1.7.0",
compat); its new-format part is read. Anything this module cannot reproduce exactly
raises `CacheFormatError`, and the caller leaves the cache to ldconfig.
"""

from __future__ import annotations

import itertools
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuwire.elf import Elf

OLD_MAGIC = b"ld.so-1.7.0"
MAGIC = b"glibc-ld.so.cache1.1"
ENDIAN_LITTLE = 2
EXTENSION_MAGIC = 0xEAA42174
TAG_GENERATOR, TAG_HWCAPS = 0, 1
HWCAP_EXTENSION = 1 << 62
ISA_LEVEL_MASK = 0x3FF << 32

_OLD_HEADER = 16  # char magic[11]; uint32_t nlibs
_OLD_ENTRY = 12
_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_EXTENSION = struct.Struct("<II")  # magic, count
_SECTION = struct.Struct("<IIII")  # tag, flags, offset, size
_WORD = struct.Struct("<I")

# What ldconfig files a library under (sysdeps/unix/sysv/linux/x86/readelflib.c, x86_64's
# ldconfig.h): every x86-64 object is libc6; an i386 one is libc6 if its interpreter or a
# DT_NEEDED name says so, plain ELF otherwise.
FLAG_ELF, FLAG_ELF_LIBC6 = 0x0001, 0x0003
FLAG_X8664_LIB64, FLAG_X8664_LIBX32 = 0x0300, 0x0800
EM_386, EM_X86_64 = 3, 62
LIBC6_INTERPRETERS = frozenset(
    (
        "/lib/ld-linux-x86-64.so.2",
        "/lib/ld-linux.so.2",
        "/libx32/ld-linux-x32.so.2",
        "/lib64/ld-linux-x86-64.so.2",
    )
)
LIBC6_NEEDED = frozenset(("libc.so.6", "libm.so.6"))

# Bounds on what a cache from the image may make gpuwire read (it is the image's file): a
# name is a file name and a path a path (Linux's NAME_MAX and PATH_MAX, <linux/limits.h>);
# a real cache has a few thousand entries.
NAME_MAX, PATH_MAX = 255, 4096
MAX_ENTRIES = 1 << 16

_DIGITS = bytes(c if 48 <= c <= 57 else 32 for c in range(256))  # other bytes → space
_NOT_DIGITS = bytes(0 if 48 <= c <= 57 else c for c in range(256))  # digits → NUL
_INT_MAX = 2**31 - 1


class CacheFormatError(ValueError):
    """The cache (or a name in it) is outside what this module writes exactly."""


class Entry:
    """One cache entry. `hwcaps` names the glibc-hwcaps subdirectory of an extension entry,
    whose `hwcap` then keeps only its ISA level bits."""

    __slots__ = ("flags", "hwcap", "hwcaps", "name", "osversion", "path")

    def __init__(
        self,
        name: bytes,
        path: bytes,
        flags: int,
        osversion: int = 0,
        hwcap: int = 0,
        hwcaps: bytes | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.flags = flags
        self.osversion = osversion
        self.hwcap = hwcap
        self.hwcaps = hwcaps

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, {self.path!r}, {self.flags:#x})"


def library_flags(elf: Elf) -> int | None:
    """The flags ldconfig gives this ELF object, or None where it would not list it or
    gpuwire does not know how it would (a machine other than x86)."""
    if not elf.shared or not elf.dynamic:
        return None
    if elf.machine == EM_X86_64:
        abi = FLAG_X8664_LIB64 if elf.bits == 64 else FLAG_X8664_LIBX32
        return abi | FLAG_ELF_LIBC6
    if elf.machine == EM_386 and elf.bits == 32:
        if elf.interpreter in LIBC6_INTERPRETERS or LIBC6_NEEDED.intersection(elf.needed):
            return FLAG_ELF_LIBC6
        return FLAG_ELF
    return None


def is_dso(name: str) -> bool:
    """Whether ldconfig looks at a file of this name (`_dl_is_dso`)."""
    return name.startswith(("lib", "ld-")) and ".so" in name


def folder_entries(
    folder: str,
    libraries: list[tuple[str, str | None, int | None]],
    links: list[tuple[str, str]],
) -> list[tuple[str, int]] | None:
    """The (path, flags) entries ldconfig makes for these files in `folder`: libraries as
    (name, SONAME, flags) and links as (target, name); None where a library's flags are
    unknown.

    As ldconfig's directory scan: a file is listed by its SONAME (else its own name) at
    `folder/SONAME`, once per SONAME. A link is listed by its own name where that name is
    its target's SONAME or the `.so` name that SONAME starts with (`libcuda.so ->
    libcuda.so.1` is listed as `libcuda.so`); another link counts as a copy of its target.
    """
    files = {name: (soname, flags) for name, soname, flags in libraries}
    targets = {name: target for target, name in links}
    found: dict[str, int | None] = {}
    for name, (soname, flags) in files.items():
        if is_dso(name):
            found.setdefault(soname or name, flags)
    for name, target in targets.items():
        for _ in range(len(targets)):  # a chain of links, each to the next
            target = targets.get(target, target)
        if target not in files or not is_dso(name):
            continue
        soname, flags = files[target]
        soname = soname or name
        is_link = name == soname or (name.endswith(".so") and soname.startswith(name))
        found.setdefault(name if is_link else soname, flags)
    if None in found.values():
        return None
    return [(f"{folder}/{soname}", flags) for soname, flags in found.items() if flags is not None]


# -- reading -----------------------------------------------------------------------------


def parse(data: bytes) -> list[Entry]:
    """The entries of a cache in the new format, or the compat format around it."""
    base, compat = 0, data.startswith(OLD_MAGIC)
    if compat:
        if len(data) < _OLD_HEADER:
            raise CacheFormatError("truncated old-format header")
        (old,) = _WORD.unpack_from(data, 12)
        base = (_OLD_HEADER + old * _OLD_ENTRY + 7) & ~7
    if data[base : base + len(MAGIC)] != MAGIC or len(data) < base + _HEADER.size:
        raise CacheFormatError("not in glibc's ld.so.cache format 1.1")
    _, count, _, flags, extension = _HEADER.unpack_from(data, base)
    if flags & 3 not in (0, ENDIAN_LITTLE):
        raise CacheFormatError(f"endianness flag {flags & 3} is not little-endian")
    start = base + _HEADER.size
    end = start + count * _ENTRY.size
    if end > len(data):
        raise CacheFormatError(f"{count} entries do not fit in {len(data)} bytes")
    if count > MAX_ENTRIES:
        raise CacheFormatError(f"{count} entries are more than {MAX_ENTRIES}")
    subdirs = _hwcaps_names(data, base, extension) if extension else []
    if subdirs and compat:
        raise CacheFormatError("glibc-hwcaps names in a compat-format cache")
    entries = []
    for flags, key, value, osversion, hwcap in _ENTRY.iter_unpack(data[start:end]):
        name, path = _string(data, base + key, NAME_MAX), _string(data, base + value, PATH_MAX)
        if (hwcap >> 32) & ~0x3FF == HWCAP_EXTENSION >> 32:
            index = hwcap & 0xFFFFFFFF
            if index >= len(subdirs):
                raise CacheFormatError(f"{path!r}: glibc-hwcaps index {index} out of range")
            entries.append(
                Entry(name, path, flags, osversion, hwcap & ISA_LEVEL_MASK, subdirs[index])
            )
        else:
            entries.append(Entry(name, path, flags, osversion, hwcap))
    return entries


def _string(data: bytes, offset: int, limit: int) -> bytes:
    """The NUL-ended string at `offset`, of at most `limit` bytes."""
    end = data.find(b"\0", offset, offset + limit + 1)
    if end < 0:
        raise CacheFormatError(
            f"string at {offset} is longer than {limit} bytes or runs past the end of the file"
        )
    return data[offset:end]


def _hwcaps_names(data: bytes, base: int, offset: int) -> list[bytes]:
    """The glibc-hwcaps subdirectory names of the extension directory at `offset`."""
    if offset % 4 or offset + _EXTENSION.size > len(data):
        raise CacheFormatError(f"extension directory at {offset} is misplaced")
    magic, count = _EXTENSION.unpack_from(data, offset)
    first = offset + _EXTENSION.size
    if magic != EXTENSION_MAGIC or first + count * _SECTION.size > len(data):
        raise CacheFormatError(f"extension directory at {offset} is malformed")
    names: list[bytes] = []
    for tag, _, start, size in _SECTION.iter_unpack(data[first : first + count * _SECTION.size]):
        if start + size > len(data):
            raise CacheFormatError(f"extension section {tag} runs past the end of the file")
        if tag == TAG_HWCAPS and size and not start % 4 and not size % 4:
            names = [
                _string(data, base + i, NAME_MAX)
                for (i,) in _WORD.iter_unpack(data[start : start + size])
            ]
    return names


# -- sorting -----------------------------------------------------------------------------


def libcmp_key(name: bytes) -> bytes:
    """A key whose byte order is `_dl_cache_libcmp`'s order: each run of digits becomes
    0x80 and its value in four bytes, above every ASCII character.

    Exact for ASCII names whose numbers fit a C int; others raise CacheFormatError (x86
    compares non-ASCII bytes as signed and would overflow larger numbers)."""
    if not name.isascii():
        raise CacheFormatError(f"{name!r} is not ASCII")
    runs = name.translate(_DIGITS).split()
    if not runs:
        return name
    marked = name.translate(_NOT_DIGITS)
    key, pos = b"", 0
    for run in runs:
        value = int(run)
        if value > _INT_MAX:
            raise CacheFormatError(f"{name!r} holds a number larger than a C int")
        start = marked.index(b"\0", pos)
        key += name[pos:start] + b"\x80" + value.to_bytes(4, "big")
        pos = start + len(run)
    return key + name[pos:]


def merge(existing: list[Entry], added: list[Entry], folders: list[str]) -> list[Entry]:
    """`existing` with `added` in, replacing entries of the same path, in ldconfig's order.

    ldconfig scans the folders on its command line first, so among otherwise equal entries
    (the same name in two directories) those in `folders` come first, in that order. Names
    are nearly all distinct: the rest of the order is worked out only where they are not.

    Two names `_dl_cache_libcmp` calls equal in one folder (`liba.so.1`, `liba.so.01`) are
    in the order ldconfig's scan of that folder met them, which is the file system's
    directory order: where an added entry is one of them, CacheFormatError."""
    paths = {e.path for e in added}
    entries = [e for e in existing if e.path not in paths] + added
    keyed = sorted(((libcmp_key(e.name), e) for e in entries), key=_first, reverse=True)
    prefixes = [f.encode().rstrip(b"/") + b"/" for f in folders]
    ordered: list[Entry] = []
    start = 0
    while start < len(keyed):
        end = start + 1
        while end < len(keyed) and keyed[end][0] == keyed[start][0]:
            end += 1
        same = [entry for _, entry in keyed[start:end]]
        if len(same) > 1:
            same.sort(key=lambda e: _tie_break(e, prefixes))
            _refuse_scan_order(same, paths, prefixes)
        ordered += same
        start = end
    return ordered


def _refuse_scan_order(same: list[Entry], added: set[bytes], folders: list[bytes]) -> None:
    """CacheFormatError where entries of one sort key that nothing but ldconfig's directory
    scan orders (`_tie_break` equal) include an added one."""
    for a, b in itertools.pairwise(same):
        if (a.path in added or b.path in added) and _tie_break(a, folders) == _tie_break(
            b, folders
        ):
            raise CacheFormatError(
                f"{a.path!r} and {b.path!r} sort equal: their order is the directory's"
            )


def _first(pair: tuple[bytes, Entry]) -> bytes:
    return pair[0]


def _tie_break(entry: Entry, folders: list[bytes]) -> tuple[int, int, bytes, int, int, int, int]:
    hwcap = 0 if entry.hwcaps is not None else entry.hwcap
    return (
        -entry.flags,
        entry.hwcaps is None,
        entry.hwcaps or b"",
        -hwcap.bit_count(),
        -hwcap,
        -entry.osversion,
        _scanned_under(entry, hwcap, folders),
    )


def _scanned_under(entry: Entry, hwcap: int, folders: list[bytes]) -> int:
    """The position of the folder ldconfig found `entry` in (len(folders): another one).
    Files of a glibc-hwcaps or legacy hwcap subdirectory count as the folder's."""
    depth = 3 if entry.hwcaps is not None else 1 + hwcap.bit_count()
    parent = entry.path.rsplit(b"/", depth)[0] + b"/"
    return folders.index(parent) if parent in folders else len(folders)


# -- writing -----------------------------------------------------------------------------


def render(entries: list[Entry], generator: bytes) -> bytes:
    """The cache file of `entries` (already in order), as ldconfig writes it."""
    subdirs = sorted({e.hwcaps for e in entries if e.hwcaps is not None})
    strings = {e.name for e in entries} | {e.path for e in entries} | set(subdirs)
    table, offsets = _string_table(strings)
    strings_at = _HEADER.size + len(entries) * _ENTRY.size
    extension = (strings_at + len(table) + 3) & ~3
    index = {name: i for i, name in enumerate(subdirs)}
    rows = b"".join(
        _ENTRY.pack(
            e.flags,
            strings_at + offsets[e.name],
            strings_at + offsets[e.path],
            e.osversion,
            e.hwcap if e.hwcaps is None else HWCAP_EXTENSION | e.hwcap | index[e.hwcaps],
        )
        for e in entries
    )
    header = _HEADER.pack(MAGIC, len(entries), len(table), ENDIAN_LITTLE, extension)
    padding = bytes(extension - strings_at - len(table))
    return (
        header
        + rows
        + table
        + padding
        + _extensions(extension, subdirs, strings_at, offsets, generator)
    )


def _string_table(strings: set[bytes]) -> tuple[bytes, dict[bytes, int]]:
    """`stringtable_finalize`: longest-first by reversed bytes, each string that ends the
    previous one stored as its tail."""
    ordered = sorted(strings, key=lambda s: s[::-1], reverse=True)
    offsets: dict[bytes, int] = {}
    parts: list[bytes] = []
    size = 0
    previous = b""
    previous_at = 0
    for string in ordered:
        if previous.endswith(string):
            offsets[string] = previous_at + len(previous) - len(string)
        else:
            offsets[string] = size
            parts.append(string + b"\0")
            size += len(string) + 1
        previous, previous_at = string, offsets[string]
    return b"".join(parts), offsets


def _extensions(
    offset: int, subdirs: list[bytes], strings_at: int, offsets: dict[bytes, int], generator: bytes
) -> bytes:
    """The extension directory: the generator, then glibc-hwcaps names where there are any.
    ldconfig places the data after room for both sections (`cache_extension_size`)."""
    data_at = offset + _EXTENSION.size + 2 * _SECTION.size
    hwcaps = b"".join(_WORD.pack(strings_at + offsets[name]) for name in subdirs)
    sections = []
    if subdirs:
        sections.append(_SECTION.pack(TAG_GENERATOR, 0, data_at + len(hwcaps), len(generator)))
        sections.append(_SECTION.pack(TAG_HWCAPS, 0, data_at, len(hwcaps)))
    else:
        sections.append(_SECTION.pack(TAG_GENERATOR, 0, data_at - _SECTION.size, len(generator)))
    return _EXTENSION.pack(EXTENSION_MAGIC, len(sections)) + b"".join(sections) + hwcaps + generator


def update(
    cache: bytes | None, added: list[tuple[str, int]], folders: list[str], generator: bytes
) -> bytes:
    """The cache `cache` (None: there is none) with `added` (path, flags) entries in."""
    entries = [
        Entry(path.rpartition("/")[2].encode(), path.encode(), flags) for path, flags in added
    ]
    return render(merge(parse(cache) if cache else [], entries, folders), generator)
