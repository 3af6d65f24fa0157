"""What discovery needs from an ELF file: its class, machine, SONAME and program interpreter,
and what ldconfig files a library under; and the symbol versions it needs of each library.

The SONAME decides the link a container needs (`libcuda.so.1 -> libcuda.so.550.54.15`);
the class keeps a 32-bit library out of the 64-bit directory; the interpreter tells a
static ldconfig (safe to run inside a container root) from a dynamic one (which would load
the container's own loader). The type, machine, dynamic string table and, for 32-bit
objects, the DT_NEEDED names are what ldconfig classifies a library by
(`gpuwire.ldsocache.library_flags`). Only headers are read, a few kilobytes per file.
The version needs (`version_needs`: `GLIBC_2.34` of `libc.so.6`) say which C library a
program asks for: gpuwire's files on a host must run with the host's
(tests/system/test_host_roots.py).
"""

from __future__ import annotations

import os
import struct

ELFCLASS32, ELFCLASS64 = 1, 2
ET_DYN = 3
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME = 0, 1, 5, 14
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF


class ElfError(ValueError):
    """Not an ELF file discovery can read."""


class Elf:
    __slots__ = ("bits", "dynamic", "interpreter", "machine", "needed", "shared", "soname")

    def __init__(
        self,
        bits: int,
        soname: str | None,
        interpreter: str | None,
        machine: int = 0,
        shared: bool = False,
        dynamic: bool = False,
        needed: tuple[str, ...] = (),
    ) -> None:
        self.bits = bits
        self.soname = soname
        self.interpreter = interpreter
        self.machine = machine  # e_machine: 62 x86-64, 3 i386
        self.shared = shared  # ET_DYN
        self.dynamic = dynamic  # a dynamic section with a string table
        self.needed = needed  # DT_NEEDED names, read for 32-bit objects only


def read(fd: int) -> Elf:
    """The facts above of the ELF file open on `fd` (little-endian)."""
    bits, kind, machine, loads, dynamic, interp, dyn = _headers(fd)
    strtab, soname, needed = _dynamic(fd, dynamic, dyn)
    names = _Strings(fd, strtab, loads)
    return Elf(
        bits,
        names.get(soname),
        interp,
        machine,
        kind == ET_DYN,
        strtab is not None,
        tuple(n for n in map(names.get, needed if bits == 32 else ()) if n is not None),
    )


def version_needs(fd: int) -> dict[str, tuple[str, ...]]:
    """The symbol versions the ELF file open on `fd` needs, by library (its
    `.gnu.version_r`, found as the dynamic loader finds it: DT_VERNEED); a static program
    needs none."""
    _, _, _, loads, dynamic, _, dyn = _headers(fd)
    tags = dict(reversed(_entries(fd, dynamic, dyn)))  # the first of each tag
    names = _Strings(fd, tags.get(DT_STRTAB), loads)
    address = tags.get(DT_VERNEED)
    needs: dict[str, tuple[str, ...]] = {}
    if address is None or (offset := names.offset(address)) is None:
        return needs
    for _ in range(tags.get(DT_VERNEEDNUM, 0)):
        # Elf_Verneed: vn_version, vn_cnt, vn_file, vn_aux, vn_next (the same in both classes)
        _, aux_count, file, aux, following = struct.unpack("<HHIII", os.pread(fd, 16, offset))
        versions, at = [], offset + aux
        for _ in range(aux_count):
            # Elf_Vernaux: vna_hash, vna_flags, vna_other, vna_name, vna_next
            _, _, _, name, after = struct.unpack("<IHHII", os.pread(fd, 16, at))
            versions.append(names.get(name) or "?")
            at += after
        needs[names.get(file) or "?"] = tuple(versions)
        if not following:
            break
        offset += following
    return needs


def _headers(
    fd: int,
) -> tuple[
    int, int, int, list[tuple[int, int, int]], tuple[int, int] | None, str | None, struct.Struct
]:
    """Class (bits), type, machine, the PT_LOAD segments (vaddr, offset, filesz), the
    dynamic section's (offset, size), the interpreter, and the dynamic entry's layout."""
    ident = os.pread(fd, 64, 0)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[5] != 1:
        raise ElfError("not a little-endian ELF file")
    kind, machine = struct.unpack_from("<HH", ident, 16)
    if ident[4] == ELFCLASS64:
        bits, phdr, dyn = 64, struct.Struct("<IIQQQQQQ"), struct.Struct("<qQ")
        (phoff,) = struct.unpack_from("<Q", ident, 32)
        phentsize, phnum = struct.unpack_from("<HH", ident, 54)
    elif ident[4] == ELFCLASS32:
        bits, phdr, dyn = 32, struct.Struct("<IIIIIIII"), struct.Struct("<iI")
        (phoff,) = struct.unpack_from("<I", ident, 28)
        phentsize, phnum = struct.unpack_from("<HH", ident, 42)
    else:
        raise ElfError("unknown ELF class")
    if phnum and phentsize < phdr.size:
        raise ElfError("program headers too small")
    table = os.pread(fd, phentsize * phnum, phoff)
    if len(table) < phentsize * phnum:
        raise ElfError("program headers beyond the end of the file")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic = interp = None
    for i in range(phnum):
        fields = phdr.unpack_from(table, i * phentsize)
        if bits == 64:
            kind_, offset, vaddr, filesz = fields[0], fields[2], fields[3], fields[5]
        else:
            kind_, offset, vaddr, filesz = fields[0], fields[1], fields[2], fields[4]
        if kind_ == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind_ == PT_DYNAMIC:
            dynamic = (offset, filesz)
        elif kind_ == PT_INTERP:
            interp = os.pread(fd, filesz, offset).rstrip(b"\0").decode(errors="replace")
    return bits, kind, machine, loads, dynamic, interp, dyn


def _dynamic(
    fd: int, dynamic: tuple[int, int] | None, entry: struct.Struct
) -> tuple[int | None, int | None, list[int]]:
    """DT_STRTAB, DT_SONAME and the DT_NEEDED string offsets of the dynamic section."""
    strtab = soname = None
    needed: list[int] = []
    for tag, value in _entries(fd, dynamic, entry):
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
        elif tag == DT_NEEDED:
            needed.append(value)
    return strtab, soname, needed


def _entries(
    fd: int, dynamic: tuple[int, int] | None, entry: struct.Struct
) -> list[tuple[int, int]]:
    """The dynamic section's (tag, value) entries, up to DT_NULL."""
    if dynamic is None or dynamic[1] == 0:
        return []
    data = os.pread(fd, dynamic[1], dynamic[0])
    found = []
    for off in range(0, len(data) - entry.size + 1, entry.size):
        tag, value = entry.unpack_from(data, off)
        if tag == DT_NULL:
            break
        found.append((tag, value))
    return found


class _Strings:
    """Strings of the dynamic string table, whose address maps to a file offset through the
    PT_LOAD segments."""

    def __init__(self, fd: int, strtab: int | None, loads: list[tuple[int, int, int]]) -> None:
        self.fd = fd
        self.loads = loads
        self.base = self.offset(strtab) if strtab is not None else None

    def offset(self, address: int) -> int | None:
        """The file offset of a virtual address in a PT_LOAD segment."""
        for vaddr, offset, filesz in self.loads:
            if vaddr <= address < vaddr + filesz:
                return offset + (address - vaddr)
        return None

    def get(self, index: int | None) -> str | None:
        if self.base is None or index is None:
            return None
        raw = os.pread(self.fd, 256, self.base + index)
        return raw.split(b"\0", 1)[0].decode(errors="replace")
