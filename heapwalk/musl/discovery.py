"""Where mallocng's context (__malloc_context) is: from the program's symbol table when gdb has it (a static
program not stripped), else by its shape in the writable data of the object that holds musl.  The shape: a
nonzero secret; init_done 1; the first and last meta areas 4 KiB-aligned, and the first one's check word equal
to the secret, which is random per process.  Both ways must agree where both work."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from heapwalk.common.errors import CannotDecode, HeapwalkError
from heapwalk.inferior.elf import writable_words
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.musl.find import MuslImage
from heapwalk.musl.layout import AREA_SIZE, Ctx

__all__ = ["MuslUnknown", "MuslUnused", "locate_context", "context_shape"]

_SYMBOL = "__malloc_context"


class MuslUnknown(CannotDecode):
    """musl is there, and its malloc cannot be decoded: the message says why."""


class MuslUnused(HeapwalkError):
    """musl's malloc has not been used in the process: it holds nothing."""


def context_shape(mem: Memory, address: int) -> str:
    """What is wrong with the context at ADDRESS ("" when it has mallocng's shape in use)."""
    try:
        raw = mem.read(address, Ctx.size)
    except ReadError:
        return "unreadable"
    secret, head, tail = (int.from_bytes(raw[at:at + 8], "little") for at in (Ctx.secret, Ctx.meta_area_head,
                                                                               Ctx.meta_area_tail))
    if int.from_bytes(raw[Ctx.init_done:Ctx.init_done + 4], "little") != 1:
        return "init_done is not 1"
    if not secret or not head or head % AREA_SIZE or not tail or tail % AREA_SIZE:
        return "its meta areas are not 4 KiB-aligned"
    try:
        if u64(mem, head) != secret:
            return "its first meta area's check word is not its secret"
    except ReadError:
        return "its first meta area is unreadable"
    return ""


def locate_context(mem: Memory, found: MuslImage, symbol: Callable[[str], int | None]) -> tuple[int, str]:
    """(the context's address, how it was found).  SYMBOL(name) gives a symbol's address, or None."""
    by_shape = _by_shape(mem, found)
    named = symbol(_SYMBOL)
    if named:
        wrong = context_shape(mem, named)
        if not wrong:
            if by_shape and by_shape != named:
                raise MuslUnknown(f"heapwalk: {_SYMBOL} is at {named:#x} by the symbol table, yet mallocng's context "
                                  f"has its shape at {by_shape:#x}: they must agree")
            return named, "symbol __malloc_context" + (", its shape confirmed" if by_shape else "")
        if _never_used(mem, named):
            raise MuslUnused("musl's malloc has not been used in this process: it holds nothing")
        raise MuslUnknown(f"heapwalk: {_SYMBOL} at {named:#x} (by the symbol table) does not have mallocng's shape: "
                          f"{wrong}")
    if by_shape:
        return by_shape, f"its shape in {found.path}'s data (no symbol)"
    raise MuslUnknown(f"heapwalk: mallocng's context (__malloc_context) was not found in {found.path}'s data: no "
                      "word there has its shape (a secret, its meta areas, the first one checked by the secret); "
                      "if malloc was never called in the process, it holds nothing")


def _never_used(mem: Memory, address: int) -> bool:
    try:
        return not any(mem.read(address, Ctx.size))
    except ReadError:
        return False


def _by_shape(mem: Memory, found: MuslImage) -> int:
    """The only place in the image's writable data with the context's shape (0: none, or more than one)."""
    lo, words = writable_words(mem, found.image)
    n = Ctx.size // 8
    if len(words) < n:
        return 0
    head, tail = words[Ctx.meta_area_head // 8:], words[Ctx.meta_area_tail // 8:]
    k = len(words) - n + 1
    mask = np.uint64(AREA_SIZE - 1)
    hits = np.flatnonzero((words[:k] != 0) & (head[:k] != 0) & ((head[:k] & mask) == 0) & (tail[:k] != 0)
                          & ((tail[:k] & mask) == 0))
    shaped = [lo + 8 * int(i) for i in hits if not context_shape(mem, lo + 8 * int(i))]
    return shaped[0] if len(shaped) == 1 else 0
