"""The register count of a compiled CUDA kernel, read from its cubin with no GPU.

A cubin is an ELF file. Its `.nv.info` section holds attribute records: a format byte,
an attribute byte, then either a 16-bit value or (format EIFMT_SVAL) a 16-bit size and
that many bytes. EIATTR_REGCOUNT (0x2F, sized) holds a function's symbol index and its
registers a thread, the number `ptxas -v` prints and the driver reports as the loaded
function's NUM_REGS (`CompiledKernel.n_regs`). A Triton cubin holds one kernel.
"""
from __future__ import annotations

import struct

_EIFMT_SVAL = 0x04
_EIATTR_REGCOUNT = 0x2F


def _sections(elf: bytes) -> dict:
    """{section name: its bytes} of a little-endian ELF64 file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = heads[shstrndx]
    strtab = elf[names[4]:names[4] + names[5]]
    out = {}
    for name, _type, _flags, _addr, offset, size in heads:
        out[strtab[name:strtab.index(b"\0", name)].decode()] = elf[offset:offset + size]
    return out


def register_count(cubin: bytes) -> int:
    """Registers a thread of the cubin's one kernel; ValueError when the cubin does not
    record exactly one count."""
    info = _sections(cubin).get(".nv.info", b"")
    counts, pos = [], 0
    while pos + 4 <= len(info):
        fmt, attr, value = struct.unpack_from("<BBH", info, pos)
        pos += 4
        if fmt != _EIFMT_SVAL:
            continue
        if attr == _EIATTR_REGCOUNT and value == 8:
            counts.append(struct.unpack_from("<II", info, pos)[1])
        pos += value
    if len(counts) != 1:
        raise ValueError(f"the cubin records {len(counts)} register counts, expected one")
    return counts[0]
