"""What discovery needs from an ELF file: its class, SONAME and program interpreter.

The SONAME decides the link a container needs (`libcuda.so.1 -> libcuda.so.550.54.15`);
the class keeps a 32-bit library out of the 64-bit directory; the interpreter tells a
static ldconfig (safe to run inside a container root) from a dynamic one (which would load
the container's own loader). Only headers are read, a few kilobytes per file.
"""

from __future__ import annotations

import os
import struct

ELFCLASS32, ELFCLASS64 = 1, 2
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_STRTAB, DT_SONAME = 0, 5, 14


class ElfError(ValueError):
    """Not an ELF file discovery can read."""


class Elf:
    __slots__ = ("bits", "interpreter", "soname")

    def __init__(self, bits: int, soname: str | None, interpreter: str | None) -> None:
        self.bits = bits
        self.soname = soname
        self.interpreter = interpreter


def read(fd: int) -> Elf:
    """The class, SONAME and interpreter of the ELF file open on `fd` (little-endian)."""
    ident = os.pread(fd, 64, 0)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[5] != 1:
        raise ElfError("not a little-endian ELF file")
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
    table = os.pread(fd, phentsize * phnum, phoff)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic = interp = None
    for i in range(phnum):
        fields = phdr.unpack_from(table, i * phentsize)
        if bits == 64:
            kind, offset, vaddr, filesz = fields[0], fields[2], fields[3], fields[5]
        else:
            kind, offset, vaddr, filesz = fields[0], fields[1], fields[2], fields[4]
        if kind == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == PT_DYNAMIC:
            dynamic = (offset, filesz)
        elif kind == PT_INTERP:
            interp = os.pread(fd, filesz, offset).rstrip(b"\0").decode(errors="replace")
    return Elf(bits, _soname(fd, dynamic, loads, dyn), interp)


def _soname(
    fd: int,
    dynamic: tuple[int, int] | None,
    loads: list[tuple[int, int, int]],
    entry: struct.Struct,
) -> str | None:
    if dynamic is None:
        return None
    data = os.pread(fd, dynamic[1], dynamic[0])
    strtab = soname = None
    for off in range(0, len(data) - entry.size + 1, entry.size):
        tag, value = entry.unpack_from(data, off)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = value
        elif tag == DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    # DT_STRTAB is a virtual address: map it to a file offset through the PT_LOAD segments.
    for vaddr, offset, filesz in loads:
        if vaddr <= strtab < vaddr + filesz:
            raw = os.pread(fd, 256, offset + (strtab - vaddr) + soname)
            return raw.split(b"\0", 1)[0].decode(errors="replace")
    return None
