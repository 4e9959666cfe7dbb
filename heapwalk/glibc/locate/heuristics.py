"""Finding malloc's state in memory without debug symbols.

Each function here looks at raw memory and libc's image and returns
candidates that pass structural checks; `heapwalk.glibc.locate.discovery` decides between
them and records how each fact was found.

- main_arena: bin 127 is never used, so once malloc is initialised its two
  slots point at its own bin header (slot address - 16).  The highest such pair
  in libc's writable segment is main_arena's bin 127; the arena start follows
  from the layout family, and the arena ring must close on it.
- mp_: a malloc_par whose fields are all in range, near main_arena, ranked by
  what else agrees with it (sbrk_base where the main arena's memory starts,
  malloc_stats's code reading its mmapped_mem); no field is expected to hold
  glibc's default, since programs and tunables change every one of them.
- TLS offsets: libc reaches ``tcache`` and ``thread_arena`` through GOT slots
  holding their (negative) offsets from the thread pointer; every negative
  word of libc's writable segment is a candidate, and the one whose per-thread
  values are all tcache structs (or ring arenas) wins.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from heapwalk.inferior.elf import LibcImage
from heapwalk.glibc.locate.layout import MP_INT_FIELDS, SIZE_BITS, Layout, layout_for
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.glibc.walk.ring import plausible_arena

__all__ = ["ARENA_FAMILIES", "MP_VARIANTS", "MP_FOR_FAMILY", "mp_variant_at", "mp_plausible", "mp_evidence", "MpAnchors",
           "MpCandidate", "tcache_safe_linking", "ArenaCandidate", "scan_bin127", "find_main_arena", "find_mp", "arenas_by_heaps",
           "tls_candidates", "pick_tls_offset", "TCACHE_CHUNK_SIZES", "heap_info_size_of", "tcache_struct_chunk"]

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


def _read_segment(mem: Memory, start: int, size: int) -> bytes:
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


def scan_bin127(mem: Memory, image: LibcImage) -> list[int]:
    """Addresses Y in libc's writable segments with *Y == *(Y+8) == Y-16 (empty, self-linked bins), ascending."""
    found = []
    for seg in image.writable():
        start = seg.address & ~7
        data = _read_segment(mem, start, seg.end - start)
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


def _valid_arena(mem: Memory, layout: Layout, address: int, image: LibcImage) -> tuple[int, ...] | None:
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


def find_main_arena(mem: Memory, image: LibcImage, preferred: tuple[int, int] | None = None
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


def _mp_values(raw: bytes, layout: Layout, at: int) -> dict[str, int]:
    return {name: struct.unpack_from("<i" if name in MP_INT_FIELDS else "<Q", raw, at + off)[0]
            for name, off in layout.mp.items()}


def _pow2_or_zero(v: int) -> bool:
    return v == 0 or (v >= _PAGE and v & (v - 1) == 0)


@dataclass(frozen=True)
class MpAnchors:
    """What the rest of memory says mp_ must hold, so that a candidate is pinned down by agreement instead of
    by default values (which programs, mallopt, tunables and glibc's dynamic threshold all change).

    MAIN_START: where the main arena's contiguous memory begins (its top's end minus system_mem), which is
    mp_.sbrk_base; 0 when the main arena never grew; None when it is not contiguous or unreadable.
    MAIN_TOP: main_arena's top pointer.  STATS_LOADS: the addresses malloc_stats's code reads with 64-bit
    loads, one of which is mp_.mmapped_mem (empty when libc's code is not readable).
    """

    main_start: int | None = None
    main_top: int | None = None
    stats_loads: frozenset[int] = frozenset()


def mp_plausible(v: dict[str, int]) -> bool:
    """Could V be a malloc_par of any program?  Only what no parameter can change is required: field types
    and ranges, and the invariants between the mmap counters (glibc 2.43 counts 16 bytes too many in
    mmapped_mem for each mremap'd chunk, so it need not be page-granular)."""
    if not (1 <= v["arena_test"] < 1 << 40 and v["arena_max"] < 1 << 40 and v["mmap_threshold"] <= 1 << 33):
        return False
    if not (0 <= v["n_mmaps"] <= v["max_n_mmaps"] and v["no_dyn_threshold"] in (0, 1)):
        return False
    if v["mmapped_mem"] % 16 or v["max_mmapped_mem"] % 16 or not v["mmapped_mem"] <= v["max_mmapped_mem"] < 1 << 47:
        return False
    if v["mmapped_mem"] < v["n_mmaps"] * _PAGE or v["sbrk_base"] >= 1 << 47:
        return False
    if "tcache_bins" in v and not (v["tcache_bins"] <= 76 and v["tcache_max_bytes"] < 1 << 32
                                   and v["tcache_count"] <= 0xFFFF):
        return False
    if "hp_pagesize" in v and not (_pow2_or_zero(v["hp_pagesize"]) and _pow2_or_zero(v["thp_pagesize"])
                                   and v["hp_flags"] >= 0):
        return False
    return "thp_mode" not in v or 0 <= v["thp_mode"] <= 3


def mp_evidence(v: dict[str, int], address: int, layout: Layout, anchors: MpAnchors) -> tuple[str, ...] | None:
    """What else in memory agrees with the malloc_par V at ADDRESS under LAYOUT, strongest first; None when
    something contradicts it (its sbrk_base is not where the main arena's memory starts)."""
    out = []
    if address + layout.mp["mmapped_mem"] in anchors.stats_loads:
        out.append("malloc_stats reads its mmapped_mem")
    if anchors.main_start is not None:
        if v["sbrk_base"] != anchors.main_start:
            return None
        out.append("its sbrk_base is where the main arena's memory starts" if anchors.main_start
                   else "its sbrk_base is 0 and the main arena never grew")
    elif anchors.main_top and v["sbrk_base"] and v["sbrk_base"] <= anchors.main_top < v["sbrk_base"] + (1 << 40):
        out.append("its sbrk_base lies below main_arena's top")
    return tuple(out)


#: how much each kind of agreement counts when candidates are ranked
_EVIDENCE_WEIGHT = {"malloc_stats": 4, "its sbrk_base is where": 4, "its sbrk_base is 0": 2, "its sbrk_base lies": 1}


def _weight(evidence: tuple[str, ...]) -> int:
    return sum(w for e in evidence for prefix, w in _EVIDENCE_WEIGHT.items() if e.startswith(prefix))


@dataclass(frozen=True)
class MpCandidate:
    """A malloc_par that fits, the mp_ layout it fits under, and what agrees with it."""

    address: int
    variant: tuple[int, int]
    evidence: tuple[str, ...]


def find_mp(mem: Memory, image: LibcImage, main_arena: int, variants: list[tuple[int, int]],
            anchors: MpAnchors, window: int = 0x4000) -> MpCandidate | None:
    """The malloc_par within WINDOW bytes of main_arena that most of memory agrees with; among equals, the
    nearest to main_arena (glibc defines them side by side) and the first of VARIANTS."""
    best: tuple[tuple[int, int, int], MpCandidate] | None = None
    for seg in image.writable():
        lo = max(seg.address, main_arena - window) & ~7
        hi = min(seg.end, main_arena + window)
        if lo >= hi:
            continue
        raw = _read_segment(mem, lo, hi - lo)
        for rank, variant in enumerate(variants):
            layout = layout_for(variant)
            for at in range(0, len(raw) - layout.mp_size + 1, 8):
                address = lo + at
                if address <= main_arena < address + layout.mp_size:
                    continue
                v = _mp_values(raw, layout, at)
                if not mp_plausible(v):
                    continue
                evidence = mp_evidence(v, address, layout, anchors)
                if evidence is None:
                    continue
                key = (_weight(evidence), -abs(main_arena - address), -rank)
                if best is None or key > best[0]:
                    best = (key, MpCandidate(address, variant, evidence))
    return best[1] if best else None


def mp_variant_at(mem: Memory, address: int, variants, anchors: MpAnchors) -> MpCandidate | None:
    """Which of VARIANTS (mp_ layouts) the malloc_par at ADDRESS fits best (first wins a tie); None if none fits."""
    best = None
    for rank, variant in enumerate(variants):
        layout = layout_for(variant)
        try:
            raw = mem.read(address, layout.mp_size)
        except ReadError:
            continue
        v = _mp_values(raw, layout, 0)
        if not mp_plausible(v):
            continue
        evidence = mp_evidence(v, address, layout, anchors)
        key = (-1 if evidence is None else _weight(evidence), -rank)
        if best is None or key > best[0]:
            best = (key, MpCandidate(address, variant, evidence or ()))
    return best[1] if best else None


def tcache_safe_linking(mem: Memory, tcaches: list[int], off_entries: int, nbins: int) -> bool | None:
    """Whether tcache ``next`` links are mangled (safe-linking, 2.32+), from the first entries of TCACHES.

    An entry's link is either a plain pointer (0 at the list end) or the
    pointer XOR (entry address >> 12) (entry >> 12 at the list end).  None when
    no tcache has an entry to tell by.
    """
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
    if votes[0] == votes[1]:
        return None
    return votes[1] > votes[0]


def tls_candidates(mem: Memory, image: LibcImage, limit: int = 1 << 20) -> list[int]:
    """Possible TLS offsets of libc's variables: every distinct negative 8-aligned word above -LIMIT in its
    writable segments (the GOT), and, for a static program, every slot of its own TLS block (local-exec
    code uses immediate offsets, and the block ends at the thread pointer)."""
    out: set[int] = set()
    if image.is_executable:
        size = image.tls_size() or 0
        out.update(range(-((size + 63) & ~63), 0, 8))
    for seg in image.writable():
        start = seg.address & ~7
        data = _read_segment(mem, start, seg.end - start)
        for (word,) in struct.iter_unpack("<q", data[:len(data) // 8 * 8]):
            if -limit < word < 0 and word % 8 == 0:
                out.add(word)
    return sorted(out, reverse=True)


def pick_tls_offset(mem: Memory, fs_bases: list[int], candidates: list[int], classify) -> tuple[int, int] | None:
    """The candidate offset under which the most threads' values classify as 'valid' and none as 'invalid'.

    CLASSIFY(value) returns 'valid', 'none' (a value the variable may hold
    when unused, like NULL) or 'invalid'.  Returns (offset, threads valid).
    """
    best = None
    for tpoff in candidates:
        valid = 0
        for fs in fs_bases:
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
