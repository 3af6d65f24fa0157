"""The smallest ELF shared object ldconfig indexes: a SONAME and nothing else.

The simulated node's driver libraries are these, so that the ld cache a container gets is
built by the real ldconfig from real ELF headers, not assumed. Tests also make 32-bit ones,
other machines, DT_NEEDED entries and an interpreter: what ldconfig classifies a library by.
"""

from __future__ import annotations

import struct

ET_DYN, EM_386, EM_X86_64 = 3, 3, 62
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 1, 5, 10, 14

# (ELF header, program header, dynamic entry) per class
_LAYOUTS = {
    64: (struct.Struct("<16sHHIQQQIHHHHHH"), struct.Struct("<IIQQQQQQ"), struct.Struct("<qQ")),
    32: (struct.Struct("<16sHHIIIIIHHHHHH"), struct.Struct("<8I"), struct.Struct("<iI")),
}


def shared_object(
    soname: str,
    note: str = "",
    *,
    bits: int = 64,
    machine: int | None = None,
    needed: tuple[str, ...] = (),
    interpreter: str | None = None,
    kind: int = ET_DYN,
) -> bytes:
    """A little-endian ELF object (x86-64, or i386 for 32 bits) whose dynamic section
    names `soname` and `needed`.

    `note` is appended to the string table, so `strings` on the file says what it stands for.
    """
    ehdr, phdr, dyn = _LAYOUTS[bits]
    strtab = b"\0"
    index = {}
    for name in (soname, *needed, note):
        index[name] = len(strtab)
        strtab += name.encode() + b"\0"
    interp = interpreter.encode() + b"\0" if interpreter else b""
    headers = 3 if interp else 2
    dyn_off = ehdr.size + headers * phdr.size
    tags = [(DT_NEEDED, index[n]) for n in needed] + [(DT_SONAME, index[soname])]
    str_off = dyn_off + (len(tags) + 3) * dyn.size
    tags += [(DT_STRTAB, str_off), (DT_STRSZ, len(strtab)), (DT_NULL, 0)]
    dynamic = b"".join(dyn.pack(tag, value) for tag, value in tags)
    interp_off = str_off + len(strtab)
    size = interp_off + len(interp)
    if machine is None:
        machine = EM_X86_64 if bits == 64 else EM_386
    ident = b"\x7fELF" + bytes([bits // 32, 1, 1, 0]) + bytes(8)
    shentsize = 64 if bits == 64 else 40  # no section headers, but the sizes they would have
    header = ehdr.pack(
        ident, kind, machine, 1, 0, ehdr.size, 0, 0, ehdr.size, phdr.size, headers, shentsize, 0, 0
    )
    programs = [
        _program(bits, phdr, PT_LOAD, 0, size, 0x1000),
        _program(bits, phdr, PT_DYNAMIC, dyn_off, len(dynamic), 8),
    ]
    if interp:
        programs.append(_program(bits, phdr, PT_INTERP, interp_off, len(interp), 1))
    return header + b"".join(programs) + dynamic + strtab + interp


def _program(
    bits: int, phdr: struct.Struct, kind: int, offset: int, size: int, align: int
) -> bytes:
    """A program header mapping `size` bytes at `offset` to the same address, read-only."""
    if bits == 64:
        return phdr.pack(kind, 4, offset, offset, offset, size, size, align)
    return phdr.pack(kind, offset, offset, offset, size, size, 4, align)
