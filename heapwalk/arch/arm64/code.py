"""The instruction shapes discovery reads in AArch64 code, decoded from the fixed 32-bit words (A64).

No disassembler: a global's address is built in two instructions, ``adrp Xn, page`` then ``add Xd, Xn, #lo12``
(the address computed) or ``ldr Xt, [Xn, #lo12]`` (the word read); the reader follows each register an
``adrp`` set until another instruction consumes or overwrites it.  ``adr`` and ``ldr`` (literal) reach a
global in one instruction.  Calls are ``bl``; the thread pointer is read with ``mrs Xt, tpidr_el0``.
"""

from __future__ import annotations

import struct

from heapwalk.arch.base import CodeRef

__all__ = ["READER"]

_BTI_PAC = {0xD503245F, 0xD503249F, 0xD50324DF, 0xD503233F, 0xD503201F}   # bti c/j/jc, paciasp, nop
_RET = 0xD65F03C0
_MOV_FP_SP = 0x910003FD


def _words(code: bytes) -> list[int]:
    return list(struct.unpack_from(f"<{len(code) // 4}I", code))


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) else value


def _adrp(word: int, pc: int) -> int | None:
    """The page an ``adrp`` at PC computes, None when WORD is no ``adrp``."""
    if word & 0x9F000000 != 0x90000000:
        return None
    imm = _signed(((word >> 5) & 0x7FFFF) << 2 | (word >> 29) & 3, 21)
    return ((pc & ~0xFFF) + (imm << 12)) & (2**64 - 1)


def _pc_relative(word: int, pc: int) -> tuple[int, bool, int] | None:
    """(target, computes, width) of a one-instruction PC-relative ``adr`` or ``ldr`` (literal), or None."""
    if word & 0x9F000000 == 0x10000000:
        return (pc + _signed(((word >> 5) & 0x7FFFF) << 2 | (word >> 29) & 3, 21)) & (2**64 - 1), True, 8
    if word & 0xBF000000 == 0x18000000:
        return (pc + _signed((word >> 5) & 0x7FFFF, 19) * 4) & (2**64 - 1), False, 8 if word >> 30 & 1 else 4
    return None


def _consumer(word: int) -> tuple[str, int, int, int] | None:
    """(kind, base register, offset, destination) of an ``add #imm`` or unsigned-offset load/store WORD, or
    None; kinds: add, ldr64, ldr32, ldrb, strb."""
    rn, rd = (word >> 5) & 31, word & 31
    if word & 0xFF800000 == 0x91000000:
        return "add", rn, ((word >> 10) & 0xFFF) << (12 if word >> 22 & 1 else 0), rd
    for mask, value, kind, scale in ((0xFFC00000, 0xF9400000, "ldr64", 8), (0xFFC00000, 0xB9400000, "ldr32", 4),
                                     (0xFFC00000, 0x39400000, "ldrb", 1), (0xFFC00000, 0x39000000, "strb", 1)):
        if word & mask == value:
            return kind, rn, ((word >> 10) & 0xFFF) * scale, rd
    return None


def _refs(code: bytes, at: int) -> list[tuple[int, str, int, int]]:
    """(offset, kind, target, register) of every global an ``adrp`` pair or a PC-relative instruction
    reaches, in order; REGISTER: the destination (the stored register for ``strb``)."""
    pages: dict[int, int] = {}
    out = []
    for i, word in enumerate(_words(code)):
        pc = at + 4 * i
        page = _adrp(word, pc)
        if page is not None:
            pages[word & 31] = page
            continue
        single = _pc_relative(word, pc)
        if single is not None:
            target, computes, width = single
            out.append((4 * i, "add" if computes else f"ldr{width * 8}", target, word & 31))
            pages.pop(word & 31, None)
            continue
        used = _consumer(word)
        if used is not None and used[1] in pages:
            kind, rn, offset, rd = used
            out.append((4 * i, kind, (pages[rn] + offset) & (2**64 - 1), rd))
            if kind != "strb" and rd == rn:
                del pages[rn]
        elif word & 0x1F != 31 and not (word & 0xFC000000 == 0x94000000):
            pages.pop(word & 31, None)     # most instructions write their low five bits' register
    return out


def _ref(offset: int, target: int, computes: bool, register: int, indirect: bool = False) -> CodeRef:
    return CodeRef(offset, target, computes, 4, register if register < 8 else None, offset + 4, indirect)


#: instructions followed past a word read to see whether the code reads or writes through it
_THROUGH_SPAN = 16


def _used_as_address(words: list[int], after: int, register: int) -> bool:
    """Whether an instruction among the few after index AFTER loads or stores through REGISTER (its base), or
    a call takes it as an argument, before one overwrites it."""
    for word in words[after + 1:after + 1 + _THROUGH_SPAN]:
        if word & 0xFC000000 == 0x94000000:                     # bl: the argument registers are x0-x7
            return register < 8
        if word & 0x0A000000 == 0x08000000:                     # a load or a store
            if (word >> 5) & 31 == register:
                return True
            if word & 31 == register and word >> 22 & 1:        # a load into it
                return False
        elif word & 31 == register:
            return False
    return False


def address_refs(code: bytes, at: int) -> list[CodeRef]:
    """Every 64-bit address computed or 64-bit word read relative to the program counter; a word read is
    INDIRECT when the code then loads or stores through it or passes it to a call (a GOT slot)."""
    words = _words(code)
    return [_ref(o, t, kind == "add", r, kind == "ldr64" and _used_as_address(words, o // 4, r))
            for o, kind, t, r in _refs(code, at) if kind in ("add", "ldr64")]


def loads32(code: bytes, at: int) -> list[CodeRef]:
    """Every 32-bit word read relative to the program counter."""
    return [_ref(o, t, False, r) for o, kind, t, r in _refs(code, at) if kind == "ldr32"]


def all_refs(code: bytes, at: int) -> list[CodeRef]:
    """Every address computed or read relative to the program counter, any width, in order."""
    words = _words(code)
    return [CodeRef(o, t, kind == "add", 4, None, o + 4, kind == "ldr64" and _used_as_address(words, o // 4, r))
            for o, kind, t, r in _refs(code, at) if kind != "strb"]


def byte_stores(code: bytes, at: int) -> list[int]:
    """The globals whose byte the code stores (``strb`` through an ``adrp`` base)."""
    return [t for _, kind, t, _ in _refs(code, at) if kind == "strb"]


def byte_loads(code: bytes, at: int) -> list[int]:
    """The globals the code reads one byte of, in order."""
    return [t for _, kind, t, _ in _refs(code, at) if kind == "ldrb"]


def calls(code: bytes, at: int) -> list[int]:
    """The targets of every ``bl``, in order."""
    return [(at + 4 * i + _signed(w & 0x3FFFFFF, 26) * 4) & (2**64 - 1)
            for i, w in enumerate(_words(code)) if w & 0xFC000000 == 0x94000000]


def first_shift_right(code: bytes) -> int | None:
    """The count of the first right shift of a 64-bit register by a constant: ``lsr Xd, Xn, #count``, or the
    ``ubfx Xd, Xn, #count, #width`` that shifts and masks at once (both ``ubfm`` with imms >= immr)."""
    return next(((w >> 16) & 63 for w in _words(code)
                 if w & 0xFFC00000 == 0xD3400000 and (w >> 10) & 63 >= (w >> 16) & 63), None)


def first_address(code: bytes, at: int) -> int | None:
    """The first address the code computes relative to the program counter."""
    return next((r.target for r in address_refs(code, at) if r.computes), None)


def tls_slot(code: bytes, at: int) -> int | None:
    """The GOT slot of the first initial-exec TLS access: a 64-bit word read through ``adrp``, then added to
    (or used as the index from) the register ``mrs Xt, tpidr_el0`` read."""
    by_offset = {o // 4: (r, t) for o, kind, t, r in _refs(code, at) if kind == "ldr64"}
    holders: dict[int, int] = {}          # register -> the GOT slot whose TLS offset it holds
    thread = set()
    for i, word in enumerate(_words(code)):
        if i in by_offset:
            holders[by_offset[i][0]] = by_offset[i][1]
            continue
        if word & 0xFFFFFFE0 == 0xD53BD040:
            thread.add(word & 31)
            continue
        if word & 0xFFE0FC00 in (0xF8606800, 0x8B000000):   # ldr Xt, [Xn, Xm] / add Xd, Xn, Xm
            rn, rm = (word >> 5) & 31, (word >> 16) & 31
            for a, b in ((rn, rm), (rm, rn)):
                if a in thread and b in holders:
                    return holders[b]
    return None


def frame_body(code: bytes) -> int | None:
    """Where the body of an unoptimised function ends (its ``ldp x29, x30, [sp], #n``), None when CODE does not
    start as unoptimised code does (``stp x29, x30, [sp, #-n]!; mov x29, sp``, past ``bti``/``paciasp``)."""
    words = _words(code)
    first = next((i for i, w in enumerate(words) if w not in _BTI_PAC), len(words))
    if first + 1 >= len(words) or words[first] & 0xFFC07FFF != 0xA9807BFD or words[first + 1] != _MOV_FP_SP:
        return None
    return next((4 * i for i, w in enumerate(words) if i > first and w & 0xFFC07FFF == 0xA8C07BFD), None)


def call_at(code: bytes, offset: int) -> bool:
    """Whether a ``bl`` starts at OFFSET of CODE."""
    return offset % 4 == 0 and len(code) >= offset + 4 and \
        struct.unpack_from("<I", code, offset)[0] & 0xFC000000 == 0x94000000


def first_load(code: bytes, at: int) -> int | None:
    """The global the function's first instructions (past ``bti``/``paciasp``) read: ``adrp`` then ``ldr``."""
    words = _words(code)
    first = next((i for i, w in enumerate(words) if w not in _BTI_PAC), len(words))
    refs = _refs(code, at)
    if refs and refs[0][1] == "ldr64" and refs[0][0] in (4 * first, 4 * first + 4):
        return refs[0][2]
    return None


def returned_constant(code: bytes) -> int | None:
    """The 32-bit constant a function that does nothing else returns (``mov w0, #imm``, maybe ``movk``,
    then ``ret``)."""
    words = [w for w in _words(code[:16]) if w not in _BTI_PAC]
    if not words or words[0] & 0xFFE0001F != 0x52800000:
        return None
    value = (words[0] >> 5) & 0xFFFF
    rest = words[1:]
    if rest and rest[0] & 0xFFE0001F == 0x72A00000:          # movk w0, #imm, lsl 16
        value |= ((rest[0] >> 5) & 0xFFFF) << 16
        rest = rest[1:]
    return value if rest[:1] == [_RET] else None


def _store_to_stack(word: int) -> tuple[int, int, int] | None:
    """(source register, slot, bytes) of a store WORD of a register to a frame or stack slot (``str``/``strb``/
    ``strh`` with an unsigned offset from sp or x29, or ``stur`` from x29), or None."""
    rn = (word >> 5) & 31
    if rn not in (31, 29):
        return None
    size = 1 << (word >> 30)
    if word & 0x3FC00000 == 0x39000000:                          # str (unsigned offset)
        return word & 31, ((word >> 10) & 0xFFF) * size + (rn << 32), size
    if word & 0x3FE00C00 == 0x38000000:                          # stur (unscaled, signed 9 bits)
        return word & 31, _signed((word >> 12) & 0x1FF, 9) + (rn << 32), size
    return None


def _returned_slots(words: list[int]) -> set[int]:
    """The slots unoptimised code loads w0 from (the one it returns: the error code, not a constant)."""
    out = set()
    for w in words:
        if w & 0xFFC0001F == 0xB9400000 and (w >> 5) & 31 in (31, 29):
            out.add(((w >> 10) & 0xFFF) * 4 + (((w >> 5) & 31) << 32))
        elif w & 0xFFE00C1F == 0xB8400000 and (w >> 5) & 31 == 29:
            out.add(_signed((w >> 12) & 0x1FF, 9) + (29 << 32))
    return out


def stored_constant(code: bytes) -> int | None:
    """The constant a function that reports one stores to its stack slot before copying it out: the first store
    to the frame of a register a move set to a constant (``movz``/``movn``, then ``movk``) or of the zero
    register; a store to the slot unoptimised code returns in w0 (its error code) does not count."""
    words = _words(code)
    returned = _returned_slots(words)
    known: dict[int, int] = {}
    for w in words:
        rd = w & 31
        if w & 0x7F800000 == 0x52800000:                         # movz
            known[rd] = ((w >> 5) & 0xFFFF) << (16 * ((w >> 21) & 3))
            continue
        if w & 0x7F800000 == 0x12800000:                         # movn
            known[rd] = ~(((w >> 5) & 0xFFFF) << (16 * ((w >> 21) & 3))) & (2**64 - 1 if w >> 31 else 2**32 - 1)
            continue
        if w & 0x7F800000 == 0x72800000 and rd in known:        # movk
            shift = 16 * ((w >> 21) & 3)
            known[rd] = known[rd] & ~(0xFFFF << shift) | ((w >> 5) & 0xFFFF) << shift
            continue
        store = _store_to_stack(w)
        if store is not None:
            source, slot, size = store
            if slot not in returned and (source == 31 or source in known):
                return 0 if source == 31 else known[source] & ((1 << 8 * size) - 1)
            continue
        known.pop(rd, None)
    return None


class _Reader:
    """AArch64's `CodeReader`."""

    address_refs = staticmethod(address_refs)
    loads32 = staticmethod(loads32)
    all_refs = staticmethod(all_refs)
    byte_stores = staticmethod(byte_stores)
    byte_loads = staticmethod(byte_loads)
    calls = staticmethod(calls)
    first_shift_right = staticmethod(first_shift_right)
    first_address = staticmethod(first_address)
    tls_slot = staticmethod(tls_slot)
    frame_body = staticmethod(frame_body)
    call_at = staticmethod(call_at)
    first_load = staticmethod(first_load)
    returned_constant = staticmethod(returned_constant)
    stored_constant = staticmethod(stored_constant)


READER = _Reader()
