"""The few x86-64 instruction shapes heapwalk looks for in libraries' functions (`CodeReader` for x86-64).

No disassembler: only RIP-relative ``lea``/``mov`` loads are recognised, by
their fixed encoding (REX.W prefix, opcode 8D or 8B, ModRM with mod=00 and
r/m=101, then a 32-bit displacement).  That is enough to read, from
``malloc_trim`` the address of main_arena, from ``malloc_stats`` an mp_ field,
from ``malloc`` the GOT slot of the ``tcache`` TLS variable, and from
``gnu_get_libc_version`` the version string.
"""

from __future__ import annotations

import re
import struct

from heapwalk.arch.base import CodeRef

__all__ = ["READER"]

LEA, MOV = 0x8D, 0x8B
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
FS_PREFIX = 0x64
#: register number (REX.R:reg) -> the argument it carries in the System V calling convention
_ARGUMENT = {7: 0, 6: 1, 2: 2, 1: 3, 8: 4, 9: 5}


def _passed_as(code: bytes, after: int, register: int) -> tuple[int | None, int]:
    """(the argument REGISTER's value is passed as, the offset past it): its own, or, as unoptimised code
    computes into rax, rcx or rdx first, the argument register the ``mov`` right after copies it into."""
    if register < 8 and code[after:after + 2] == b"\x48\x89" and after + 2 < len(code):
        modrm = code[after + 2]
        if modrm >> 6 == 3 and (modrm >> 3) & 7 == register and modrm & 7 in _ARGUMENT:
            return _ARGUMENT[modrm & 7], after + 3
    return _ARGUMENT.get(register), after


def _ref(code: bytes, start: int, end: int, target: int, computes: bool, register: int) -> CodeRef:
    argument, past = _passed_as(code, end, register)
    return CodeRef(start, target, computes, end - start, argument, past)


def rip_loads(code: bytes, address: int) -> list[CodeRef]:
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
            out.append(_ref(code, i, i + 7, address + i + 7 + disp, op == LEA, (rex & 4) << 1 | (modrm >> 3) & 7))
    return out


def rip_loads32(code: bytes, address: int) -> list[CodeRef]:
    """Every 32-bit ``mov r32, [rip+disp]`` (opcode 8B with no REX prefix) in CODE (which starts at ADDRESS):
    how a compiler reads an ``unsigned`` global."""
    out = []
    for i in range(1, len(code) - 5):
        if code[i] == MOV and code[i + 1] & 0xC7 == 0x05 and code[i - 1] & 0xF0 != 0x40:
            disp, = struct.unpack_from("<i", code, i + 2)
            out.append(_ref(code, i, i + 6, address + i + 6 + disp, False, (code[i + 1] >> 3) & 7))
    return out


def rip_refs(code: bytes, address: int) -> list[CodeRef]:
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
            out.append(CodeRef(start, address + i + 6 + disp, op == LEA, i + 6 - start, None, i + 6))
            i += 6
            continue
        if op == 0x0F and i + 7 <= len(code) and code[i + 1] in (0xB6, 0xB7, 0xBE, 0xBF) \
                and code[i + 2] & 0xC7 == 0x05:
            disp, = struct.unpack_from("<i", code, i + 3)
            out.append(CodeRef(start, address + i + 7 + disp, False, i + 7 - start, None, i + 7))
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


def frame_body(code: bytes) -> int | None:
    """Where the body of the unoptimised function CODE starts ends (its ``pop rbp; ret``), None when CODE does
    not start as unoptimised code does (``push rbp; mov rbp, rsp``) or has no such end."""
    if code[:4] != b"\x55\x48\x89\xe5":
        return None
    end = code.find(b"\x5d\xc3")
    return end if end >= 0 else None


def first_load(code: bytes, address: int) -> int | None:
    """The global the first instruction of the function CODE (at ADDRESS) reads, past an ``endbr64``; None when
    that instruction is no RIP-relative 64-bit ``mov``."""
    first = len(_ENDBR64) if code.startswith(_ENDBR64) else 0
    loads = rip_loads(code, address)
    return loads[0].target if loads and loads[0].offset == first and not loads[0].computes else None


def returned_constant(code: bytes) -> int | None:
    """The 32-bit constant the function CODE only returns (``mov eax, imm32; ret``, past an ``endbr64``)."""
    code = code[len(_ENDBR64):] if code.startswith(_ENDBR64) else code
    if len(code) < 6 or code[0] != 0xB8 or code[5] != 0xC3:
        return None
    return int.from_bytes(code[1:5], "little")


def call_at(code: bytes, offset: int) -> bool:
    """Whether a direct call starts at OFFSET of CODE."""
    return offset < len(code) and code[offset] == 0xE8


def first_shift_right(code: bytes) -> int | None:
    """The count of the first ``shr r64, imm8`` (REX.W C1 /5 ib) in CODE, None when it has none."""
    for i in range(len(code) - 3):
        if code[i] & 0xF8 == 0x48 and code[i + 1] == 0xC1 and code[i + 2] & 0xF8 == 0xE8:
            return code[i + 3]
    return None


def first_lea(code: bytes, address: int) -> int | None:
    """Target of the first RIP-relative lea (the first address a function computes)."""
    return next((r.target for r in rip_loads(code, address) if r.computes), None)


def tls_got_slot(code: bytes, address: int, window: int = 16) -> int | None:
    """The GOT slot of the first initial-exec TLS access: ``mov rX,[rip+GOT]`` then an fs-prefixed use.

    In malloc that is the ``tcache`` variable: ``mov rax,[rip+X]; mov rdx,fs:[rax]``.
    """
    for load in rip_loads(code, address):
        if load.computes:
            continue
        tail = code[load.offset + 7:load.offset + 7 + window]
        for i in range(len(tail) - 2):
            if tail[i] == FS_PREFIX and tail[i + 1] & 0xF0 == 0x40 and tail[i + 2] == MOV:
                return load.target
    return None


def stored_constant(code: bytes) -> int | None:
    """The constant a function that reports one stores to its stack slot before copying it out: the immediate of its
    first ``mov r/m, imm`` (C6 /0 ib, C7 /0 id), None when it has none.  Unoptimised code (a plain
    ``--enable-debug`` build, no -O) keeps its return value in a stack slot too, loaded into eax just before
    ``leave`` (``mov eax, [rbp+d8]``): a store to that slot is the error code (EPERM, first), not the constant;
    and it stores a bool through eax (``mov eax, imm32`` then ``mov [rbp+d8], al``), which counts as a store."""
    returned = {code[m.start() + 2] for m in re.finditer(rb"\x8b\x45.\xc9", code, re.S)}
    i = 0
    while i < len(code) - 2:
        op = code[i]
        if op == 0xB8 and code[i + 5:i + 7] in (b"\x88\x45", b"\x89\x45") and i + 8 <= len(code) \
                and code[i + 7] not in returned:
            value = int.from_bytes(code[i + 1:i + 5], "little", signed=True)
            return value & 0xFF if code[i + 5] == 0x88 else value
        if op in (0xC6, 0xC7) and (code[i + 1] >> 3) & 7 == 0 and (i == 0 or code[i - 1] not in (0x0F,)):
            modrm = code[i + 1]
            mod, rm = modrm >> 6, modrm & 7
            length = 2
            if mod != 3 and rm == 4:
                length += 1
            if mod == 1:
                length += 1
            elif mod == 2 or (mod == 0 and rm == 5):
                length += 4
            size = 1 if op == 0xC6 else 4
            to_return = modrm == 0x45 and code[i + 2] in returned       # [rbp+d8], the slot eax returns
            if i + length + size <= len(code) and not to_return:
                return int.from_bytes(code[i + length:i + length + size], "little", signed=size == 4)
        i += 1
    return None


class _Reader:
    """x86-64's `CodeReader`: RIP-relative operands, rel32 calls."""

    address_refs = staticmethod(rip_loads)
    loads32 = staticmethod(rip_loads32)
    all_refs = staticmethod(rip_refs)
    byte_stores = staticmethod(rip_byte_stores)
    byte_loads = staticmethod(rip_byte_loads)
    calls = staticmethod(call_targets)
    first_shift_right = staticmethod(first_shift_right)
    first_address = staticmethod(first_lea)
    tls_slot = staticmethod(tls_got_slot)
    frame_body = staticmethod(frame_body)
    call_at = staticmethod(call_at)
    first_load = staticmethod(first_load)
    returned_constant = staticmethod(returned_constant)
    stored_constant = staticmethod(stored_constant)


READER = _Reader()
