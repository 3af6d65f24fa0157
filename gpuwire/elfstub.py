"""The smallest ELF64 shared object ldconfig indexes: a SONAME and nothing else.

The simulated node's driver libraries are these, so that the ld cache a container gets is
built by the real ldconfig from real ELF headers, not assumed.
"""

from __future__ import annotations

import struct

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")

ET_DYN, EM_X86_64 = 3, 62
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_STRTAB, DT_STRSZ, DT_SONAME = 0, 5, 10, 14


def shared_object(soname: str, note: str = "") -> bytes:
    """An x86-64 ELF shared object whose dynamic section names `soname`.

    `note` is appended to the string table, so `strings` on the file says what it stands for.
    """
    strtab = b"\0" + soname.encode() + b"\0" + note.encode() + b"\0"
    phoff = _EHDR.size
    dyn_off = phoff + 2 * _PHDR.size
    dynamic = b"".join(
        _DYN.pack(tag, value)
        for tag, value in (
            (DT_SONAME, 1),
            (DT_STRTAB, dyn_off + 4 * _DYN.size),
            (DT_STRSZ, len(strtab)),
            (DT_NULL, 0),
        )
    )
    size = dyn_off + len(dynamic) + len(strtab)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = _EHDR.pack(
        ident, ET_DYN, EM_X86_64, 1, 0, phoff, 0, 0, _EHDR.size, _PHDR.size, 2, 64, 0, 0
    )
    load = _PHDR.pack(PT_LOAD, 4, 0, 0, 0, size, size, 0x1000)
    dyn = _PHDR.pack(PT_DYNAMIC, 4, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 8)
    return header + load + dyn + dynamic + strtab
