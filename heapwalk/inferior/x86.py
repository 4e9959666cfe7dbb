"""The few x86_64 instruction shapes heapwalk looks for in libc's exported functions.

No disassembler: only RIP-relative ``lea``/``mov`` loads are recognised, by
their fixed encoding (REX.W prefix, opcode 8D or 8B, ModRM with mod=00 and
r/m=101, then a 32-bit displacement).  That is enough to read, from
``malloc_trim`` the address of main_arena, from ``malloc_stats`` an mp_ field,
from ``malloc`` the GOT slot of the ``tcache`` TLS variable, and from
``gnu_get_libc_version`` the version string.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["RipLoad", "RipRef", "rip_loads", "rip_loads32", "rip_refs", "rip_byte_stores", "rip_byte_loads",
           "call_targets", "first_lea", "first_shift_right", "tls_got_slot", "LEA", "MOV"]

LEA, MOV = 0x8D, 0x8B
FS_PREFIX = 0x64


@dataclass(frozen=True)
class RipLoad:
    """A ``lea``/``mov reg, [rip+disp]`` at OFFSET in the code; TARGET is the address it refers to."""

    offset: int
    opcode: int
    target: int
    length: int = 7


def rip_loads(code: bytes, address: int) -> list[RipLoad]:
    """Every REX.W lea/mov with a RIP-relative operand in CODE (which starts at ADDRESS).

    Scanning byte by byte can find an instruction inside another's
    immediate; callers take the first hit, which in a function's prologue is
    the real one.
    """
    out = []
    for i in range(len(code) - 6):
        rex, op, modrm = code[i], code[i + 1], code[i + 2]
        if rex & 0xF8 == 0x48 and op in (LEA, MOV) and modrm & 0xC7 == 0x05:
            disp, = struct.unpack_from("<i", code, i + 3)
            out.append(RipLoad(i, op, address + i + 7 + disp))
    return out


def rip_loads32(code: bytes, address: int) -> list[RipLoad]:
    """Every 32-bit ``mov r32, [rip+disp]`` (opcode 8B with no REX prefix) in CODE (which starts at ADDRESS):
    how a compiler reads an ``unsigned`` global."""
    out = []
    for i in range(1, len(code) - 5):
        if code[i] == MOV and code[i + 1] & 0xC7 == 0x05 and code[i - 1] & 0xF0 != 0x40:
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(RipLoad(i, MOV, address + i + 6 + disp, 6))
    return out


@dataclass(frozen=True)
class RipRef:
    """An instruction at OFFSET that computes (``lea``) or reads (a load) the RIP-relative address TARGET."""

    offset: int
    lea: bool
    target: int


def rip_refs(code: bytes, address: int) -> list[RipRef]:
    """Every ``lea``, ``mov r, [rip+disp]`` (any width) and ``movzx``/``movsx r, [rip+disp]`` in CODE (which
    starts at ADDRESS), in order: how a function computes or reads a global, whatever the compiler chose."""
    out = []
    i = 0
    while i < len(code) - 5:
        start = i
        if code[i] & 0xF0 == 0x40:          # a REX prefix
            i += 1
        op = code[i]
        if op in (LEA, MOV) and code[i + 1] & 0xC7 == 0x05 and i + 6 <= len(code):
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(RipRef(start, op == LEA, address + i + 6 + disp))
            i += 6
            continue
        if op == 0x0F and i + 7 <= len(code) and code[i + 1] in (0xB6, 0xB7, 0xBE, 0xBF) \
                and code[i + 2] & 0xC7 == 0x05:
            disp, = struct.unpack_from("<i", code, i + 3)
            out.append(RipRef(start, False, address + i + 7 + disp))
            i += 7
            continue
        i = start + 1
    return out


def rip_byte_stores(code: bytes, address: int) -> list[int]:
    """The targets of every ``mov byte [rip+disp], imm8`` (C6 05 disp32 ib) in CODE (which starts at ADDRESS)."""
    out = []
    for i in range(len(code) - 6):
        if code[i] == 0xC6 and code[i + 1] == 0x05:
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(address + i + 7 + disp)
    return out


def rip_byte_loads(code: bytes, address: int) -> list[int]:
    """The globals CODE (which starts at ADDRESS) reads one byte of, in order: a ``movzx``, ``mov r8``, ``cmp``
    or ``test`` of a byte at [rip+disp], or, as position-independent code reads a global it also writes, a
    ``lea r, [rip+disp]`` whose very next instruction reads the byte at [r] (``movzx``, ``mov r8``, ``cmp``)."""
    out = []
    i = 0
    while i < len(code) - 6:
        start = i
        rex = code[i] if code[i] & 0xF0 == 0x40 else 0
        i += 1 if rex else 0
        op, modrm = code[i], code[i + 1]
        if op == 0x0F and code[i + 1] == 0xB6 and i + 7 <= len(code) and code[i + 2] & 0xC7 == 0x05:
            disp, = struct.unpack_from("<i", code, i + 3)
            out.append(address + i + 7 + disp)
            i += 7
            continue
        if op == 0x8A and modrm & 0xC7 == 0x05 and i + 6 <= len(code):
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(address + i + 6 + disp)
            i += 6
            continue
        if op in (0x80, 0xF6) and modrm in (0x3D if op == 0x80 else 0x05,) and i + 7 <= len(code):
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(address + i + 7 + disp)
            i += 7
            continue
        if op == LEA and rex & 0x08 and modrm & 0xC7 == 0x05 and i + 6 <= len(code):
            disp, = struct.unpack_from("<i", code, i + 2)
            register = (modrm >> 3 & 7) | (8 if rex & 0x04 else 0)
            if _reads_byte_at(code, i + 6, register):
                out.append(address + i + 6 + disp)
            i += 6
            continue
        i = start + 1
    return out


def _reads_byte_at(code: bytes, i: int, register: int) -> bool:
    """Whether the instruction at I in CODE reads the byte at [REGISTER] (no displacement, no index)."""
    rex = code[i] if i < len(code) and code[i] & 0xF0 == 0x40 else 0
    i += 1 if rex else 0
    if i + 2 >= len(code):
        return False
    if code[i] == 0x0F and code[i + 1] == 0xB6:
        modrm = code[i + 2]
    elif code[i] == 0x8A:
        modrm = code[i + 1]
    elif code[i] == 0x80 and code[i + 1] & 0x38 == 0x38:
        modrm = code[i + 1]
    else:
        return False
    base = (modrm & 7) | (8 if rex & 0x01 else 0)
    return modrm & 0xC0 == 0 and modrm & 7 not in (4, 5) and base == register


def call_targets(code: bytes, address: int) -> list[int]:
    """The targets of every ``call rel32`` (E8 disp32) in CODE (which starts at ADDRESS), in order; scanning
    byte by byte finds some inside other instructions, which callers must tell apart."""
    out = []
    for i in range(len(code) - 4):
        if code[i] == 0xE8:
            disp, = struct.unpack_from("<i", code, i + 1)
            out.append(address + i + 5 + disp)
    return out


def first_shift_right(code: bytes) -> int | None:
    """The count of the first ``shr r64, imm8`` (REX.W C1 /5 ib) in CODE, None when it has none."""
    for i in range(len(code) - 3):
        if code[i] & 0xF8 == 0x48 and code[i + 1] == 0xC1 and code[i + 2] & 0xF8 == 0xE8:
            return code[i + 3]
    return None


def first_lea(code: bytes, address: int) -> int | None:
    """Target of the first RIP-relative lea (the first address a function computes)."""
    return next((r.target for r in rip_loads(code, address) if r.opcode == LEA), None)


def tls_got_slot(code: bytes, address: int, window: int = 16) -> int | None:
    """The GOT slot of the first initial-exec TLS access: ``mov rX,[rip+GOT]`` then an fs-prefixed use.

    In malloc that is the ``tcache`` variable: ``mov rax,[rip+X]; mov rdx,fs:[rax]``.
    """
    for load in rip_loads(code, address):
        if load.opcode != MOV:
            continue
        tail = code[load.offset + 7:load.offset + 7 + window]
        for i in range(len(tail) - 2):
            if tail[i] == FS_PREFIX and tail[i + 1] & 0xF0 == 0x40 and tail[i + 2] == MOV:
                return load.target
    return None
