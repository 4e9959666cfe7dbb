"""mimalloc's state found in the writable memory of the object that holds it and in the process's anonymous
memory, without symbols, by shapes no other data has:

- the main heap (``_mi_heap_main``): a heap whose page queues carry the bins' block sizes (8, 8, 16, 24, 32, 40,
  48, 56, 64... one queue every 24 bytes), whose thread-local data names it as its thread's backing heap, and
  whose cookie is set (mimalloc was initialised);
- the segments: every address aligned to a segment (32 MiB) in the process's anonymous memory whose header
  holds its own address xor the main heap's cookie, as mimalloc stamps each segment it makes;
- the segment map: the bitmap (one bit per 32 MiB of address space) whose set bits are exactly the live
  segments found; a segment that holds its stamp but is not in the map was freed (cached or left behind);
- each thread's default heap: the thread-local pointer the exported ``mi_heap_get_default`` loads (its GOT
  slot holds the variable's offset from each thread's thread pointer);
- the cache of thread data: the words of the object's data that point to a heap and its thread-local data
  taken from the system (a page-aligned heap whose thread data names it), left by threads that exited.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heapwalk.common.errors import CannotDecode, HeapwalkError
from heapwalk.inferior.elf import Mapping, readable_runs, writable_words
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.arenas import arena_segment, find_arenas
from heapwalk.mimalloc.find import MiImage
from heapwalk.mimalloc.heaps import is_meta_theap
from heapwalk.mimalloc.layout import MiLayout, queue_shape
from heapwalk.mimalloc.options import find_options
from heapwalk.mimalloc.segcache import find_segment_cache
from heapwalk.mimalloc.segmap import MAP_LIMIT, find_map_parts, flat_segment_map, pages_in_use, unstamped_blocks
from heapwalk.arch import USER_SPACE_END

__all__ = ["MiDiscovery", "MimallocUnknown", "MimallocUnused", "discover_mimalloc2", "NoLayoutFits", "BIN_SIZES", "main_heap",
           "default_tpoff", "read_tpoff", "data_unread"]

#: the block sizes of the first page queues of every heap (bins 0 to 8, in bytes)
BIN_SIZES = (8, 8, 16, 24, 32, 40, 48, 56, 64)
_QUEUE = 3          # words of a page queue: first, last, block_size
_TOP = USER_SPACE_END     # user-space addresses end below this


class MimallocUnknown(CannotDecode):
    """mimalloc is mapped, but its state does not show the shapes of any build heapwalk knows."""


class NoLayoutFits(MimallocUnknown):
    """No layout of those tried fits the object's data: FAILED says why each did not."""

    def __init__(self, failed: list[str]):
        self.failed = failed
        super().__init__("; ".join(failed))


class MimallocUnused(CannotDecode):
    """mimalloc is mapped but was never initialised: it holds nothing."""


@dataclass(frozen=True)
class MiDiscovery:
    """Where mimalloc's state is, with how each part was found."""

    layout: MiLayout
    version: tuple[int, int, int] | None
    library: str
    main_heap: int
    cookie: int                           # the main heap's cookie: a segment holds its address xor it
    segments: tuple[int, ...]             # every segment in the map (or stamped, when the map is not found)
    freed: tuple[int, ...]                # stamped segments the map does not hold (freed)
    segment_map: int | None               # the map's address (None: not found)
    default_tpoff: int | None             # each thread's default heap pointer, from its thread pointer
    thread_data_cache: tuple[int, ...]    # thread data of exited threads, kept for new ones
    facts: tuple[tuple[str, str], ...] = ()
    unstamped: tuple[int, ...] = ()       # segments the map holds whose header does not hold its stamp
    options: dict = field(default_factory=dict)   # option name -> MiOption, as the process holds them
    arenas: tuple = ()                    # the arenas (`mimalloc.arenas.MiArena`), from 2.1
    page_map: object = None               # mimalloc 3: the page map (`mimalloc.v3.pagemap.PageMap`)
    subproc: int = 0                      # mimalloc 3: the subprocess its arenas belong to
    os_pages: tuple[int, ...] = ()        # mimalloc 3: its pages taken from the system (outside its arenas)
    tpoff_unread: tuple[int, str] | None = None   # where the default heaps' offset could not be read, and why
    data_unread: tuple[tuple[int, int], ...] = ()  # the parts of the object's data that could not be read
    map_parts: object = None              # from 2.1.8: the segment map's parts (`mimalloc.segmap.MapParts`)
    map_parts_lost: int = 0               # from 2.1.8: segments from the system below 48 TiB no part was found for
    own_figures: tuple[int, int] | None = None    # 3.6: mimalloc's own current (reserved, committed) figures
    cache_at: int | None = None           # to 2.0.9: the segment cache's table (None: not found, or empty)
    cache_slots: tuple = ()               # its slots in use (`mimalloc.segcache.CacheSlot`)


def discover_mimalloc2(mem: Memory, found: MiImage, regions: list[tuple[int, int]], mappings: list[Mapping],
                       readable: list[tuple[int, int]] | None, layouts: list[MiLayout]) -> MiDiscovery:
    """mimalloc 2's state in the object FOUND names and the anonymous REGIONS (READABLE: what can be read
    without touching a page the process never used; None: all), the first of LAYOUTS its data fits;
    NoLayoutFits when none does, MimallocUnknown when its shapes are not there."""
    base, words = writable_words(mem, found.image)
    if not len(words):
        raise MimallocUnknown(f"{found.path} has no writable segment")
    failed = []
    for layout in layouts:
        try:
            main = main_heap(mem, base, words, layout)
        except MimallocUnknown as exc:
            failed.append(f"{layout.versions}: {exc}")
            continue
        break
    else:
        raise NoLayoutFits(failed)
    cookie = u64(mem, main + layout.heap_cookie)
    if not cookie:
        raise MimallocUnused("mimalloc was never initialised in this process (its main heap has no cookie)")
    stamped = _stamped_segments(mem, _anonymous(regions, mappings, readable), layout, cookie)
    if not stamped:
        raise MimallocUnused("mimalloc holds no segment in this process")
    parts, lost = None, 0
    if layout.segment_map_parts:
        at, arenas, segments, freed, parts, lost = _by_arenas(mem, base, words, layout, stamped, found)
        in_map, unstamped = set(segments), unstamped_blocks(mem, layout, arenas, segments)
    else:
        at, in_map, arenas, segments, freed, unstamped = _by_map(mem, base, words, layout, stamped, found)
    tpoff, unread = read_tpoff(mem, found)
    cache_at, slots = find_segment_cache(base, words, layout, set(segments)) if layout.segment_cache else (None, ())
    cache = _thread_data_cache(mem, base, words, layout)
    options = find_options(mem, base, words)
    facts = (("layout", f"mimalloc {layout.versions}'s" + _unmeasured(found, layout)),
             ("main heap", f"at {main:#x} (its page queues carry the bins' sizes; cookie {cookie:#x})"),
             ("segments", f"{len(stamped)} stamped with their address xor the cookie, in the anonymous memory"),
             ("segment map", f"at {at:#x} ({len(in_map)} segments)" if at is not None else
              f"none for arenas' segments: {len(segments)} live by their arenas' blocks in use or its parts, "
              f"{len(freed)} freed" + _parts_said(parts, lost)
              if layout.segment_map_parts else _no_map(layout, stamped)),
             ("default heaps", f"thread-local, {tpoff - (1 << 64) if tpoff and tpoff >> 63 else tpoff:#x} from "
              f"${found.image.arch.thread_pointer} (mi_heap_get_default's GOT slot)" if tpoff is not None else "not found"),
             ("thread data cache", f"{len(cache)} kept"),
             *_cache_said(layout, cache_at, slots),
             ("arenas", f"{len(arenas)}, the table at the place of the arena a segment names" if arenas else
              "none (segments taken from the system)"),
             ("options", f"{len(options)}, from their table (each entry carries its index)" if options else
              "not found: the report does not say which options the process runs with"))
    return MiDiscovery(layout, found.version, found.path, main, cookie, segments, freed, at, tpoff, cache, facts,
                       unstamped, options, arenas, tpoff_unread=unread, data_unread=data_unread(mem, found),
                       map_parts=parts, map_parts_lost=lost, cache_at=cache_at, cache_slots=slots)


def _parts_said(parts, lost: int) -> str:
    """What the facts say of the segment map's parts (from 2.1.8)."""
    if parts is not None:
        return (f"; its table of parts at {parts.table:#x}: {len(parts.parts)} parts, "
                f"{len(parts.held)} segments from the system")
    return f"; no table of parts holds the {lost} segments from the system below 48 TiB" if lost else ""


def _unmeasured(found: MiImage, layout: MiLayout) -> str:
    return "" if found.version else " (the build does not say its version; its data has this layout's shapes)"


def main_heap(mem: Memory, base: int, words: np.ndarray, layout: MiLayout) -> int:
    """_mi_heap_main: the heap in the object's data whose page queues carry the bins' sizes and whose thread
    data names it as the backing heap (from 3.6 not the theap mimalloc allocates its own data with, which its
    subprocess names)."""
    sizes = np.array(BIN_SIZES, dtype=np.uint64)
    q, k = queue_shape(layout)
    span = q * (len(sizes) - 1) + 1
    if len(words) < span + q:
        raise MimallocUnknown("its data is too small to hold a heap")
    hits = np.flatnonzero(words[k:len(words) - span + 1] == sizes[0])
    heaps = []
    for i in hits.tolist():
        if (words[i + k:i + k + span:q] == sizes).all():
            heap = base + 8 * i - layout.heap_pages
            tld = int(words[(heap - base) // 8 + layout.heap_tld // 8]) if heap >= base else 0
            try:
                backing = tld and u64(mem, tld + layout.tld_heap_backing) == heap
                if backing and not is_meta_theap(mem, layout, tld, heap):
                    heaps.append(heap)
            except ReadError:
                continue
    if len(heaps) != 1:
        raise MimallocUnknown(f"its main heap was not found in its data ({len(heaps)} heaps have its shape)")
    return heaps[0]


def _anonymous(regions: list[tuple[int, int]], mappings: list[Mapping],
               readable: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """REGIONS less the files mapped (a segment is anonymous memory), and within READABLE when given."""
    files = sorted((m.start, m.end) for m in mappings if m.path.startswith("/"))
    out = []
    for lo, hi in sorted(regions):
        pieces = [(lo, hi)]
        for a, b in files:
            pieces = [p for x, y in pieces for p in ((x, min(y, a)), (max(x, b), y)) if p[1] > p[0]]
        out.extend(pieces)
    if readable is None:
        return out
    keep = sorted(readable)
    return [(max(a, c), min(b, d)) for a, b in out for c, d in keep if min(b, d) > max(a, c)]


def _stamped_segments(mem: Memory, anonymous: list[tuple[int, int]], layout: MiLayout, cookie: int) -> list[int]:
    """The segment-aligned addresses of ANONYMOUS whose header holds the address xor COOKIE."""
    size = layout.segment_size
    out = set()
    for lo, hi in anonymous:
        at = (lo + size - 1) & ~(size - 1)
        while at + layout.seg_cookie + 8 <= hi and at < _TOP:
            try:
                if u64(mem, at + layout.seg_cookie) == at ^ cookie:
                    out.add(at)
            except ReadError:
                pass
            at += size
    return sorted(out)


def data_unread(mem: Memory, found: MiImage) -> tuple[tuple[int, int], ...]:
    """The ranges of the object's writable data that cannot be read (a core cut short): what mimalloc keeps there
    (its thread data cache, its tables) is not seen."""
    out = []
    for seg in found.image.writable():
        at = seg.address
        for start, data in readable_runs(mem, seg.address, seg.memsz):
            if start > at:
                out.append((at, start))
            at = start + len(data)
        if at < seg.address + seg.memsz:
            out.append((at, seg.address + seg.memsz))
    return tuple(out)


def _by_map(mem: Memory, base: int, words: np.ndarray, layout: MiLayout, stamped: list[int], found: MiImage):
    """To 2.1.7: (the segment map's address or None, the segments it holds, the arenas, the live segments, the
    freed ones, those the map holds whose stamp is lost).  A segment above the addresses the map covers is in no
    map (mimalloc's hints reach 30 TiB): it is live while mapped."""
    covered = [s for s in stamped if s < layout.segment_map_limit]
    above = [s for s in stamped if s >= layout.segment_map_limit]      # no map holds them: live while mapped
    used = [s for s in covered if pages_in_use(mem, layout, s)]
    at, in_map = flat_segment_map(base, words, covered, layout, used) if covered else (None, set())
    if at is None and covered and not found.version:
        raise MimallocUnknown(f"a mimalloc that does not say its version: {layout.versions}'s layout finds its "
                              "main heap and segments, but not its segment map, so the layout is not confirmed")
    freed = tuple(s for s in covered if s not in in_map) if at is not None else ()
    segments = tuple(sorted((in_map & set(covered)) | set(above))) if at is not None else tuple(stamped)
    unstamped = tuple(sorted(in_map - set(stamped))) if at is not None else ()
    arenas = find_arenas(mem, base, words, layout, arena_segment(mem, layout, segments))
    if arena_segment(mem, layout, segments) is not None and not arenas:
        raise MimallocUnknown(f"{found.named}: its segments come from arenas, and its table of "
                              "arenas was not found in its data")
    return at, in_map, arenas, segments, freed, unstamped


def _by_arenas(mem: Memory, base: int, words: np.ndarray, layout: MiLayout, stamped: list[int], found: MiImage):
    """From 2.1.8 the segment map holds no segment taken from an arena: (no map, the arenas, the live segments, the
    freed ones, the map's parts or None, how many segments from the system below 48 TiB no part holds).  A
    stamped segment in an arena is live when the arena's block under it is in use; one taken from the system
    when the map's part holds its bit (above 48 TiB, or when no part is found: while it is mapped)."""
    first = arena_segment(mem, layout, stamped)
    arenas = find_arenas(mem, base, words, layout, first)
    if first is not None and not arenas:
        raise MimallocUnknown(f"{found.named}: its segments come from arenas, and its table of arenas was not found "
                              "in its data")
    if not arenas and not found.version:
        raise MimallocUnknown(f"a mimalloc that does not say its version: {layout.versions}'s layout finds its main "
                              "heap and segments, but no arena, so the layout is not confirmed")
    arena_of = {at: next((a for a in arenas if a.start <= at < a.start + a.reserved), None) for at in stamped}
    own = [at for at, arena in arena_of.items() if arena is None]
    parts = find_map_parts(mem, base, words, layout, own)
    live = []
    for at, arena in arena_of.items():
        if arena is not None:
            if arena.inuse >> arena.block_of(at) & 1:
                live.append(at)
        elif parts is None or at >= MAP_LIMIT or at in parts.held:
            live.append(at)
    lost = 0 if parts is not None else sum(1 for at in own if at < MAP_LIMIT)
    return None, arenas, tuple(live), tuple(s for s in stamped if s not in live), parts, lost


def default_tpoff(mem: Memory, found: MiImage, function: str = "mi_heap_get_default") -> int | None:
    """The TLS offset (from the thread pointer, as a 64-bit word) of each thread's default heap pointer: what the GOT slot
    FUNCTION's code (mi_heap_get_default; from 3.2 mi_theap_get_default) loads before its %fs access holds.
    None when the object exports no such function (linked in); TpoffUnread when its code or slot cannot be
    read."""
    at = found.image.dynamic_symbol(function)
    if at is None:
        return None
    try:
        slot = found.image.code.tls_slot(mem.read(at, 48), at)
    except ReadError as exc:
        raise TpoffUnread(at, f"the code of {function} cannot be read ({exc})") from None
    if slot is None:
        return None
    try:
        return u64(mem, slot)
    except ReadError as exc:
        raise TpoffUnread(slot, f"the GOT slot {function}'s code loads cannot be read ({exc})") from None


class TpoffUnread(HeapwalkError):
    """Where the thread-local default heap's offset should have been read, and why it could not."""

    def __init__(self, address: int, why: str):
        super().__init__(why)
        self.address, self.why = address, why


def read_tpoff(mem: Memory, found: MiImage, function: str = "mi_heap_get_default"
               ) -> tuple[int | None, tuple[int, str] | None]:
    """(default_tpoff's offset, None), or (None, (address, why)) when it could not be read."""
    try:
        return default_tpoff(mem, found, function), None
    except TpoffUnread as exc:
        return None, (exc.address, exc.why)


def _no_map(layout: MiLayout, stamped: list[int]) -> str:
    """What discovery says of a segment map (to 2.1.7) it did not find."""
    if any(s < layout.segment_map_limit for s in stamped):
        return "not found: every stamped segment is taken as live"
    return f"not looked for: every segment lies above the {layout.segment_map_tib} TiB it covers (live while mapped)"


def _cache_said(layout: MiLayout, at: int | None, slots: tuple) -> tuple:
    """Discovery's fact on the segment cache (to 2.0.9), or none."""
    if not layout.segment_cache:
        return ()
    return (("segment cache", f"at {at:#x}, {len(slots)} segments kept" if at is not None else
             "none found (the cache is empty, or its table cannot be read): a freed segment whose stamp is left "
             "would be taken as cached"),)


def _thread_data_cache(mem: Memory, base: int, words: np.ndarray, layout: MiLayout) -> tuple[int, ...]:
    """The thread data kept for reuse: page-aligned words of the object's data that point to a heap whose
    thread-local data follows it and names it as its backing heap, and whose page queues carry the bins'
    sizes."""
    candidates = np.flatnonzero(((words & np.uint64(0xFFF)) == 0) & (words > np.uint64(0x10000))
                                & (words < np.uint64(_TOP)))
    out = []
    for i in candidates.tolist():
        heap = int(words[i])
        try:
            if u64(mem, heap + layout.heap_tld) != heap + layout.heap or \
                    u64(mem, heap + layout.heap + layout.tld_heap_backing) != heap:
                continue
            queues = mem.read(heap + layout.heap_pages, _QUEUE * 8 * len(BIN_SIZES))
        except ReadError:
            continue
        got = np.frombuffer(queues, dtype=np.uint64)[2::_QUEUE]
        if tuple(got.tolist()) == BIN_SIZES:
            out.append((base + 8 * i, heap))
    if out and out[-1][0] - out[0][0] > 64:        # the cache is 8 words: pointers further apart are not it
        return ()
    return tuple(heap for _, heap in out)
