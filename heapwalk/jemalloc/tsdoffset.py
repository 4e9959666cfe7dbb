"""Where each thread's tsd (jemalloc's thread state) is: its offset from the thread's thread pointer
the same for every thread, found without symbols.

- jemalloc as a shared object: its one initial-exec TLS relocation (a TPOFF64 relocation against no symbol) is
  the GOT slot that holds its TLS block's offset, and the block is the tsd;
- jemalloc linked into the program: the program's TLS block lies just below each thread pointer, and the tsd
  is somewhere in it; a library built with --disable-initial-exec-tls and loaded at start has no initial-exec
  slot, but its block (the tsd) is in the static TLS area below the thread pointer.  The offset is the one that separates the thread pointers from the tsds whose thread
  caches the arenas list (their cache-bin descriptors sit in the tsd), else the one at which the threads'
  blocks hold a pointer to an arena where the tsd keeps its arena.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Sequence

import numpy as np

from heapwalk.arch import DEFAULT, Architecture
from heapwalk.inferior.elf import ElfImage
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.jemalloc.layout import JeLayout

__all__ = ["tsd_offset", "tsd_module", "dynamic_tsd", "static_module_offset"]

_MAX_TCACHES = 4096
_STATIC_TLS = 1 << 24     # how far from the thread pointer the static TLS of the libraries loaded at start may lie


def tsd_offset(mem: Memory, image: ElfImage, layout: JeLayout, arenas: int, count: int,
               thread_pointers: Sequence[int]) -> tuple[int | None, str, list[tuple[int, str]]]:
    """The tsd's offset from the thread pointer, how it was found, and (address, what) when the slot that
    holds it is there but unreadable."""
    slots = [slot for slot, sym, addend in image.relocations(image.arch.reloc_tpoff64) if sym == 0 and addend == 0]
    if slots and image.tls_size() == layout.tsd_size:
        try:
            values = {u64(image.mem, slot) for slot in slots}
        except ReadError as exc:
            how = f"not determined: the GOT slot {exc.address:#x} is unreadable ({exc.reason})"
            return None, how, [(exc.address, f"the tsd's TLS offset: {how}")]
        if len(values) == 1:
            value = values.pop()
            return value - (1 << 64) if value >> 63 else value, \
                f"GOT slot {slots[0]:#x} of the TPOFF64 relocation" + (f" (and {len(slots) - 1} more slot(s) "
                                                                       "of the same)" if len(slots) > 1 else ""), []
    tls = image.tls_size()
    if tls is None:
        return None, f"not determined: {image.path} has no TLS segment", []
    if not image.is_program and tls != layout.tsd_size:
        return None, f"not determined: its TLS block is {tls:#x} bytes, not {layout.name}'s tsd " \
                     f"({layout.tsd_size:#x})", []
    pointers = _arena_pointers(mem, arenas, count)
    thread_pointers = [fs for fs in thread_pointers if fs]
    # a program's TLS block lies just below the thread pointer; a library loaded at start (one built with
    # --disable-initial-exec-tls has no TPOFF64 slot) has its block further down in the static TLS area
    span = tls + 4096 if image.is_program else _STATIC_TLS
    arch = image.arch
    tsds = _cached_tsds(mem, layout, pointers)
    windows = [(fs, *arch.static_tls(fs, span)) for fs in thread_pointers]
    offsets = Counter(tsd - fs for tsd in tsds for fs, lo, hi in windows if lo <= tsd < hi)
    if not image.is_program and offsets and offsets.most_common(1)[0][1] < len(tsds):
        return None, f"not determined: the {len(tsds)} tsds the arenas list do not sit at one offset from the " \
                     "thread pointers (a library loaded with dlopen keeps its TLS apart for each thread)", []
    how = "thread(s) whose thread cache an arena lists sit at {offset} from their thread pointer"
    threads = offsets
    if not offsets:
        offsets, threads = _arena_slots(mem, layout, pointers, [(lo, hi) for _, lo, hi in windows], thread_pointers)
        offsets = Counter({offset: score for offset, score in offsets.items()
                           if _states_plausible(mem, layout, [fs + offset for fs in thread_pointers])})
        how = "thread(s) hold a pointer to an arena at {offset} from their thread pointer, where the tsd keeps it"
    if not offsets:
        return None, f"not determined: no thread's TLS block holds a tsd heapwalk can recognise ({len(tsds)} " \
                     f"thread caches listed, {len(thread_pointers)} thread pointers)", []
    (offset, hits), *rest = offsets.most_common()
    if rest and rest[0][1] == hits:
        return None, f"not determined: the tsds may sit at {offset} or {rest[0][0]} from the thread pointers", []
    where = "jemalloc is linked into the program" if image.is_program else "its library's TLS is in the static " \
        "TLS block, without an initial-exec slot"
    return offset, f"{threads[offset]} " + how.format(offset=offset) + f" ({where})", []


#: the most modules a process is taken to have loaded with TLS
_MAX_MODULES = 1 << 16
#: a DTV entry glibc has not allocated yet (the thread never touched the module's TLS)
_UNALLOCATED = (1 << 64) - 1


def tsd_module(mem: Memory, image: ElfImage, layout: JeLayout) -> tuple[int | None, str]:
    """The TLS module id of a jemalloc library loaded with dlopen (built --disable-initial-exec-tls), whose tsd
    is then each thread's block of that module: ld.so writes the id into the GOT slot of its one DTPMOD64
    relocation (against no symbol: the module's own block, which is the tsd)."""
    slots = [slot for slot, sym, _addend in image.relocations(image.arch.reloc_dtpmod64) if sym == 0]
    if len(slots) != 1 or image.tls_size() != layout.tsd_size:
        return None, "not determined: no one module-id slot for a TLS block the size of the tsd"
    try:
        module = u64(mem, slots[0])
    except ReadError as exc:
        return None, f"not determined: the GOT slot {slots[0]:#x} is unreadable ({exc.reason})"
    if not 0 < module < _MAX_MODULES:
        return None, f"not determined: the GOT slot {slots[0]:#x} holds {module}, not a module id"
    return module, f"GOT slot {slots[0]:#x} of the DTPMOD64 relocation: each thread's block of TLS module {module}"


def dynamic_tsd(mem: Memory, thread_pointer: int, module: int, arch: Architecture = DEFAULT) -> int | None:
    """Where the thread whose thread pointer is THREAD_POINTER keeps its block of TLS module MODULE: its dynamic
    thread vector (the word ARCH's thread control block keeps at ``dtv_at``) holds, 16 bytes an entry, each
    module's block;
    None when the thread has none (it never touched the module's TLS) or the vector is unreadable."""
    try:
        vector = u64(mem, thread_pointer + arch.dtv_at)
        if not vector or module > u64(mem, vector - 16):     # its length, in the entry before the generation
            return None
        block = u64(mem, vector + 16 * module)
    except ReadError:
        return None
    return None if block in (0, _UNALLOCATED) else block


def _arena_pointers(mem: Memory, arenas: int, count: int) -> list[int]:
    try:
        return [p for p in struct.unpack("<%dQ" % count, mem.read(arenas, 8 * count)) if p]
    except ReadError:
        return []


def _cached_tsds(mem: Memory, layout: JeLayout, pointers: list[int]) -> set[int]:
    """The tsds whose thread caches the arenas' lists of cache-bin descriptors hold (each descriptor's first
    array is its tsd's tcache's); none in a build without statistics, which keeps no such list."""
    out: set[int] = set()
    for arena in pointers:
        try:
            first = u64(mem, arena + layout.tcache_descriptors)
            at, seen = first, 0
            while at and seen < _MAX_TCACHES:
                out.add(u64(mem, at + layout.descriptor_bins[0]) - layout.tsd_tcache_bins[0])
                seen += 1
                at = u64(mem, at)
                if at == first:
                    break
        except ReadError:
            continue
    return out


def _arena_slots(mem: Memory, layout: JeLayout, pointers: list[int], windows: list[tuple[int, int]],
                 thread_pointers: list[int]) -> tuple[Counter, Counter]:
    """For each offset from the thread pointer, its score and how many threads' TLS blocks hold a pointer to an
    arena where a tsd at that offset keeps its arena, each searched in its window of static TLS (WINDOWS, by
    thread); the score counts a thread twice where the tsd's thread
    cache names an arena too (the tsd keeps its internal arena just before its arena, often the same one: the
    thread cache tells them apart)."""
    wanted = np.array(sorted(set(pointers)), dtype=np.uint64)
    known = set(pointers)
    scores: Counter = Counter()
    threads: Counter = Counter()
    for fs, (start, end) in zip(thread_pointers, windows):
        start &= ~7
        try:
            words = np.frombuffer(mem.read(start, (end - start) & ~7), dtype=np.uint64)
        except ReadError:
            continue
        for index in np.flatnonzero(np.isin(words, wanted)).tolist():
            tsd = start + 8 * index - layout.tsd_arena
            scores[tsd - fs] += 1 + _names_arena(mem, tsd + layout.tsd_tcache_arena, known)
            threads[tsd - fs] += 1
    return scores, threads


#: the most a tsd's state byte holds (5.2's numbering: 6, uninitialized; 5.1.0's has fewer)
_MAX_STATE = 6


def _states_plausible(mem: Memory, layout: JeLayout, tsds: list[int]) -> bool:
    """Whether every one of TSDS holds a tsd state jemalloc sets (a thread that never allocated keeps the TLS
    image's, uninitialized): an arena pointer found elsewhere in a thread's TLS names no tsd."""
    for tsd in tsds:
        try:
            if mem.read(tsd + layout.tsd_state, 1)[0] > _MAX_STATE:
                return False
        except ReadError:
            return False
    return True


def static_module_offset(mem: Memory, module: int, thread_pointers: Sequence[int], arch: Architecture = DEFAULT
                         ) -> int | None:
    """The one offset from the thread pointer at which every thread keeps its block of TLS module MODULE, when
    the module's TLS is static (a library loaded at start); None when some thread's block is elsewhere (a
    library loaded with dlopen: each thread's block was allocated apart) or not allocated."""
    offsets = set()
    for fs in thread_pointers:
        block = dynamic_tsd(mem, fs, module, arch)
        start, end = arch.static_tls(fs, _STATIC_TLS)
        if block is None or not start <= block < end:
            return None
        offsets.add(block - fs)
    return offsets.pop() if len(offsets) == 1 else None


def _names_arena(mem: Memory, slot: int, arenas: set[int]) -> bool:
    """Whether SLOT holds the address of one of ARENAS."""
    try:
        return u64(mem, slot) in arenas
    except ReadError:
        return False
