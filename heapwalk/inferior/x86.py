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

__all__ = ["RipLoad", "rip_loads", "rip_loads32", "first_lea", "first_shift_right", "tls_got_slot", "LEA", "MOV"]

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
