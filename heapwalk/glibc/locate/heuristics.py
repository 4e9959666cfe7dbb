"""Finding malloc's state in memory without debug symbols.

Each function here looks at raw memory and libc's image and returns
candidates that pass structural checks; `heapwalk.glibc.locate.discovery` decides between
them and records how each fact was found.

- main_arena: bin 127 is never used, so once malloc is initialised its two
  slots point at its own bin header (slot address - 16).  The highest such pair
  in libc's writable segment is main_arena's bin 127; the arena start follows
  from the layout family, and the arena ring must close on it.
- mp_: `heapwalk.glibc.locate.mpshape`.
- TLS offsets: libc reaches ``tcache`` and ``thread_arena`` through GOT slots
  holding their (negative) offsets from the thread pointer; every negative
  word of libc's writable segment is a candidate, and the one whose per-thread
  values are all tcache structs (or ring arenas) wins.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from heapwalk.inferior.elf import ElfImage
from heapwalk.glibc.locate.layout import SIZE_BITS, Layout, layout_for
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.glibc.locate.arenashape import plausible_arena

__all__ = ["ARENA_FAMILIES", "MP_VARIANTS", "MP_FOR_FAMILY", "tcache_safe_linking", "tcache_link_votes", "decisive",
           "ArenaCandidate", "scan_bin127", "find_main_arena", "arenas_by_heaps", "tls_candidates", "pick_tls_offset",
           "TCACHE_CHUNK_SIZES", "heap_info_size_of", "tcache_struct_chunk", "read_segment"]

#: one representative version per malloc_state layout, newest first
ARENA_FAMILIES = ((2, 43), (2, 27), (2, 23), (2, 17))
#: one representative version per mp_ layout, newest first
MP_VARIANTS = ((2, 43), (2, 35), (2, 26), (2, 24), (2, 17))
#: the mp_ layouts that go with each malloc_state layout family
MP_FOR_FAMILY = {(2, 43): ((2, 43),), (2, 27): ((2, 35), (2, 26)), (2, 23): ((2, 26), (2, 24), (2, 17)),
                 (2, 17): ((2, 17),)}
#: tcache_perthread_struct chunk size -> (layout name, a version with that struct)
TCACHE_CHUNK_SIZES = {0x250: (2, 29), 0x290: (2, 30), 0x300: (2, 42)}
_BIN127_SLOT = 16 * 126
_PAGE = 4096
_SCAN_LIMIT = 64 << 20


def read_segment(mem: Memory, start: int, size: int) -> bytes:
    """SIZE bytes from START, with unreadable pages as zeros (a truncated core still scans)."""
    size = min(size, _SCAN_LIMIT)
    try:
        return mem.read(start, size)
    except ReadError:
        pass
    out = bytearray(size)
    for off in range(0, size, _PAGE):
        n = min(_PAGE, size - off)
        try:
            out[off:off + n] = mem.read(start + off, n)
        except ReadError:
            continue
    return bytes(out)


def scan_bin127(mem: Memory, image: ElfImage) -> list[int]:
    """Addresses Y in libc's writable segments with *Y == *(Y+8) == Y-16 (empty, self-linked bins), ascending."""
    found = []
    for seg in image.writable():
        start = seg.address & ~7
        data = read_segment(mem, start, seg.end - start)
        words = struct.unpack_from(f"<{len(data) // 8}Q", data)
        for i in range(len(words) - 1):
            y = start + 8 * i
            if words[i] == y - 16 and words[i + 1] == y - 16:
                found.append(y)
    return found


@dataclass(frozen=True)
class ArenaCandidate:
    """A main_arena that validated, and the malloc_state layout it validated with."""

    address: int
    family: tuple[int, int]
    ring: tuple[int, ...]


def arenas_by_heaps(mem: Memory, layout: Layout, regions: list[tuple[int, int]], heap_max_size: int) -> list[int]:
    """Thread arenas found from their first heaps, whatever the arena ring says: a heap starts at a
    HEAP_MAX_SIZE-aligned address inside a mapping, and the first heap of an arena holds the arena right
    after its heap_info, at which heap_info.ar_ptr points.  Ascending."""
    found = []
    for start, end in regions:
        at = (start + heap_max_size - 1) & ~(heap_max_size - 1)
        while at < end:
            arena = at + layout.heap_info_size
            try:
                ar_ptr = u64(mem, at)
            except ReadError:
                ar_ptr = None
            if ar_ptr == arena and plausible_arena(mem, layout, arena):
                found.append(arena)
            at += heap_max_size
    return found


def _valid_arena(mem: Memory, layout: Layout, address: int, image: ElfImage) -> tuple[int, ...] | None:
    """The arena ring from ADDRESS if ADDRESS looks like main_arena under LAYOUT, else None."""
    if not plausible_arena(mem, layout, address):
        return None
    ring = [address]
    current = address
    for _ in range(1 << 12):
        try:
            nxt = u64(mem, current + layout.off_next)
        except ReadError:
            return None
        if nxt == address:
            return tuple(ring)
        if nxt == 0 or nxt % 16 or nxt in ring or image.contains(nxt):
            return None
        ring.append(nxt)
        current = nxt
    return None


def find_main_arena(mem: Memory, image: ElfImage, preferred: tuple[int, int] | None = None
                    ) -> ArenaCandidate | None:
    """main_arena from the bin-127 self-links, trying PREFERRED's layout family first."""
    families = list(ARENA_FAMILIES)
    if preferred is not None:
        own = next(f for f in families if preferred >= f)
        families.remove(own)
        families.insert(0, own)
    ys = scan_bin127(mem, image)
    for family in families:
        layout = layout_for(family)
        for y in reversed(ys):
            address = y - _BIN127_SLOT - layout.off_bins
            ring = _valid_arena(mem, layout, address, image)
            if ring is not None:
                return ArenaCandidate(address, family, ring)
    return None


def tcache_safe_linking(mem: Memory, tcaches: list[int], off_entries: int, nbins: int) -> bool | None:
    """Whether tcache ``next`` links are mangled (safe-linking, 2.32+), from the first entries of TCACHES, by
    the majority of `tcache_link_votes`; None when no tcache has an entry to tell by, or the votes tie."""
    plain, mangled = tcache_link_votes(mem, tcaches, off_entries, nbins)
    return None if plain == mangled else mangled > plain


#: how many votes, and how many times the other side's, a layout known from the version needs to be corrected
#: (one poisoned tcache head is one vote: it is a finding, never the layout)
DECISIVE_VOTES, DECISIVE_RATIO = 3, 3


def decisive(votes: tuple[int, int]) -> bool | None:
    """Whether links are mangled, by VOTES (plain, mangled) strong enough to correct a known version's layout;
    None when they are not."""
    plain, mangled = votes
    win, lose = max(plain, mangled), min(plain, mangled)
    return None if win < DECISIVE_VOTES or win < DECISIVE_RATIO * lose else mangled > plain


def tcache_link_votes(mem: Memory, tcaches: list[int], off_entries: int, nbins: int) -> tuple[int, int]:
    """(plain, mangled): how many of the first entries of TCACHES' bins have a link that reads as a plain
    pointer, and as one mangled by safe-linking (pointer XOR (entry address >> 12); entry >> 12 at a list's
    end)."""
    votes = [0, 0]  # plain, mangled
    for tcache in tcaches:
        try:
            heads = struct.unpack(f"<{nbins}Q", mem.read(tcache + off_entries, 8 * nbins))
        except ReadError:
            continue
        for entry in heads:
            if not entry or entry % 16:
                continue
            try:
                link = u64(mem, entry)
            except ReadError:
                continue
            key = entry >> 12
            if link == 0:
                votes[0] += 1
            elif link == key:
                votes[1] += 1
            elif (link ^ key) % 16 == 0 and abs((link ^ key) - entry) < 1 << 32:
                votes[1] += 1
            elif link % 16 == 0 and abs(link - entry) < 1 << 32:
                votes[0] += 1
            if sum(votes) >= 16:
                break
    return votes[0], votes[1]

def tls_candidates(mem: Memory, image: ElfImage, limit: int = 1 << 20) -> list[int]:
    """Possible TLS offsets of libc's variables, nearest the thread pointer first: every distinct 8-aligned
    word of its writable segments (the GOT) within LIMIT on the side of the thread pointer its architecture
    keeps TLS on (below it in TLS variant II, above its control block in variant I), and, for a static
    program, every slot of its own TLS block (local-exec code uses immediate offsets).  Where TLS lies above
    the thread pointer, also every slot of libc's own TLS block, placed by its TLS relocations: code there
    reaches a variable from an anchor (one GOT slot for all of malloc's variables), so no GOT word names it."""
    below, tcb = image.arch.tls_below_thread_pointer, image.arch.tcb_size
    lowest, highest = (-limit + 8, 0) if below else (tcb, limit)
    out: set[int] = set() if below else set(_own_block(mem, image))
    if image.is_executable:
        size = (image.tls_size() or 0) + 63 & ~63
        out.update(range(-size, 0, 8) if below else range(tcb, tcb + size, 8))
    for seg in image.writable():
        start = seg.address & ~7
        data = read_segment(mem, start, seg.end - start)
        for (word,) in struct.iter_unpack("<q", data[:len(data) // 8 * 8]):
            if lowest <= word < highest and word % 8 == 0 and word:
                out.add(word)
    return sorted(out, key=abs)


def _own_block(mem: Memory, image: ElfImage) -> list[int]:
    """The TLS offsets of every 8-byte slot of IMAGE's own TLS block, from its TLS relocations against no
    symbol (each slot holds the block's offset plus the relocation's addend); empty when none is read."""
    size = image.tls_size()
    for slot, symbol, addend in image.relocations(image.arch.reloc_tpoff64):
        if symbol or not size:
            continue
        try:
            start = u64(mem, slot) - addend
        except ReadError:
            continue
        return list(range(start, start + size, 8))
    return []


def pick_tls_offset(mem: Memory, thread_pointers: list[int], candidates: list[int], classify) -> tuple[int, int] | None:
    """The candidate offset under which the most threads' values classify as 'valid' and none as 'invalid'.

    CLASSIFY(value) returns 'valid', 'none' (a value the variable may hold
    when unused, like NULL) or 'invalid'.  Returns (offset, threads valid).
    """
    best = None
    for tpoff in candidates:
        valid = 0
        for fs in thread_pointers:
            try:
                verdict = classify(u64(mem, fs + tpoff))
            except ReadError:
                verdict = "invalid"
            if verdict == "invalid":
                valid = -1
                break
            valid += verdict == "valid"
        if valid > 0 and (best is None or valid > best[1]):
            best = (tpoff, valid)
    return best


def tcache_chunk_size(mem: Memory, pointer: int) -> int | None:
    """Chunk size of the allocation whose user memory starts at POINTER (None if unreadable)."""
    try:
        return u64(mem, pointer - 8) & ~SIZE_BITS
    except ReadError:
        return None


def tcache_struct_chunk(size: int | None) -> int | None:
    """The tcache struct chunk size (a `TCACHE_CHUNK_SIZES` key) that a chunk of SIZE can hold, if any.

    malloc hands out a whole free chunk when the remainder would be smaller
    than MINSIZE, so the struct's chunk may be up to 16 bytes larger.
    """
    if size is None:
        return None
    return next((base for base in TCACHE_CHUNK_SIZES if base <= size < base + 32), None)


def heap_info_size_of(arena: int) -> int:
    """sizeof(heap_info) implied by a thread arena's address (it sits right after its heap's heap_info)."""
    return arena % _PAGE
