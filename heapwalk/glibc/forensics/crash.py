"""A crash core's last words: the message glibc's abort left, the chunk it aborted on, and the heap pointers
in a crashed thread's registers and stack."""

from __future__ import annotations

import dataclasses
import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.forensics.aborts import Candidate, check_for, explain
from heapwalk.glibc.walk.chunks import list_states
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.locate.discovery import Discovery
from heapwalk.glibc.model import HeapState
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.inferior.threads import FATAL_SIGNALS, ThreadRegs

__all__ = ["abort_message", "crash_pointers", "crash_findings"]


_STACK_WINDOW = 1 << 15


def abort_message(mem: Memory, disc: Discovery) -> Finding | None:
    """glibc's last words: the message of a glibc abort ("double free or corruption (!prev)"), which
    __libc_message leaves in a mapping that __abort_msg points to (struct abort_msg_s: size, then text)."""
    if disc.abort_msg_address is None:
        return None
    try:
        pointer = u64(mem, disc.abort_msg_address)
        if not pointer:
            return None
        size = struct.unpack("<I", mem.read(pointer, 4))[0]
        text = mem.read(pointer + 4, max(0, min(size - 4, 4096) if size > 4 else 256))
    except ReadError:
        return None
    text = text.split(b"\0", 1)[0].decode(errors="replace").strip()
    if not text:
        return None
    return Finding(Severity.ERROR, pointer, "glibc", f"glibc aborted the process: \"{text}\"", Kind.ABORT,
                   found=text)


def _stack_words(mem: Memory, sp: int) -> tuple[int, ...]:
    """The words of a stack from SP up to _STACK_WINDOW bytes (fewer where the stack ends)."""
    data = b""
    for at in range(sp, sp + _STACK_WINDOW, 4096):
        try:
            data += mem.read(at, min(4096, sp + _STACK_WINDOW - at) if at == sp else 4096)
        except ReadError:
            break
    return struct.unpack_from("<%dQ" % (len(data) // 8), data)


def crash_pointers(mem: Memory, state: HeapState, threads: list[ThreadRegs], limit: int = 3) -> list[Finding]:
    """For a thread killed by a fatal signal: the free chunks whose user pointers its stack holds, nearest
    first.  After a glibc abort in free() or malloc(), the chunk being freed or handed out is usually among
    them (in a saved register or a local of the caller)."""
    free = {c: st for c, st in list_states(state).items() if st is not ChunkState.TCACHE_STRUCT}
    out: list[Finding] = []
    for regs in threads:
        if regs.signal not in FATAL_SIGNALS or not regs.sp:
            continue
        seen: set[int] = set()
        for i, word in enumerate(_stack_words(mem, regs.sp)):
            chunk = word - 16
            if chunk in free and chunk not in seen:
                seen.add(chunk)
                out.append(Finding(Severity.INFO, chunk, f"thread {regs.number} ({FATAL_SIGNALS[regs.signal]})",
                                   f"the crashing thread's stack at {regs.sp + 8 * i:#x} holds {word:#x}, the user "
                                   f"pointer of chunk {chunk:#x}, which is free ({free[chunk].value}): likely "
                                   "the chunk glibc was freeing or handing out", Kind.CRASH_POINTER,
                                   found=f"{word:#x}"))
                if len(seen) >= limit:
                    break
    return out


def _crash_candidates(mem: Memory, threads: list[ThreadRegs]) -> list[Candidate]:
    """The pointers each thread killed by a fatal signal holds: the arguments of malloc's functions in its
    frames (with libc's symbols), its registers, then its stack from the top."""
    out = []
    for regs in threads:
        if regs.signal not in FATAL_SIGNALS:
            continue
        out += [Candidate(value, f"{where} in thread {regs.number}") for where, value in regs.arguments]
        out += [Candidate(value, f"register {name} of thread {regs.number}") for name, value in regs.registers]
        if regs.sp:
            out += [Candidate(word, f"the stack of thread {regs.number} at {regs.sp + 8 * i:#x}")
                    for i, word in enumerate(_stack_words(mem, regs.sp))]
    return out


def crash_findings(mem: Memory, state: HeapState, disc: Discovery, threads: list[ThreadRegs],
                    last_words: Finding | None) -> tuple[Finding, ...]:
    """What a crash core says about its crash: the chunks that fail the check glibc's abort message names
    (`aborts.explain`); failing that, glibc's message and the free chunks the crashing thread's stack points
    at (`crash_pointers`)."""
    if last_words is not None:
        named = explain(mem, state, disc.layout, last_words.found, _crash_candidates(mem, threads))
        if named:
            return tuple(named)
        check = check_for(last_words.found)
        if check is not None:
            hint = "" if any(t.arguments for t in threads) else \
                " (with libc's debug symbols the arguments of free and malloc are tried too)"
            last_words = dataclasses.replace(last_words, expected=check.tested, message=(
                f"{last_words.message}: {check.tested}; no chunk the crashing thread points at fails that "
                f"check{hint}"))
    clues = tuple(crash_pointers(mem, state, threads)) if any(t.signal in FATAL_SIGNALS for t in threads) else ()
    return ((last_words,) if last_words is not None else ()) + clues
