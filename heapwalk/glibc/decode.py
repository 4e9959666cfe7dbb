"""Builds a `HeapState` from a target's memory and a `Discovery`.

This is where the walkers are put together: mp_, the arena ring, each arena's
heaps and free lists, the arena free list, and each thread's arena and tcache.
Reads that fail become findings; whatever could be decoded is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import struct

from heapwalk.glibc.chunks import Account, Listing
from heapwalk.glibc.chunkwalk import account
from heapwalk.glibc.crash import abort_message, crash_findings
from heapwalk.glibc.mmapped import mmapped_agree, mmapped_of_state, with_main_regions
from heapwalk.glibc.threads import decode_thread, fill_from_tcaches, scan_for_tcaches
from heapwalk.glibc.trim import TrimEstimate, TrimSimulation
from heapwalk.glibc.discovery import Discovery, MallocUnused
from heapwalk.glibc.mainarena import main_memory_start
from heapwalk.glibc.layout import MP_INT_FIELDS, NBINS, SIZE_BITS, Layout
from heapwalk.target.memory import Memory, ReadError, u64
from heapwalk.glibc.model import Arena, BinKind, BinList, Heap, HeapState, MallocPar
from heapwalk.findings import Fact, Finding, Kind, Severity
from heapwalk.glibc import headless
from heapwalk.glibc.heuristics import arenas_by_heaps
from heapwalk.target.threads import ThreadRegs
from heapwalk.glibc.lists import ListWalk, walk_bin, walk_fastbin
from heapwalk.glibc.ring import ring_shortcut, walk_arena_ring, walk_heaps

__all__ = ["collect", "walk_arenas", "read_mp", "read_arena"]


def read_mp(mem: Memory, layout: Layout, address: int) -> MallocPar:
    """Reads every field of mp_ that this layout has."""
    raw = mem.read(address, layout.mp_size)
    values = {}
    for name, off in layout.mp.items():
        fmt = "<i" if name in MP_INT_FIELDS else "<Q"
        values[name] = struct.unpack_from(fmt, raw, off)[0]
    return MallocPar(address, values)


def read_arena(mem: Memory, layout: Layout, address: int) -> dict[str, int | None]:
    """The scalar fields of the malloc_state at ADDRESS."""
    raw = mem.read(address, layout.arena_size)

    def word(off: int | None) -> int | None:
        return None if off is None else struct.unpack_from("<Q", raw, off)[0]

    def i32(off: int | None) -> int | None:
        return None if off is None else struct.unpack_from("<i", raw, off)[0]

    return dict(mutex=i32(layout.off_mutex), flags=i32(layout.off_flags),
                have_fastchunks=i32(layout.off_have_fastchunks), top=word(layout.off_top),
                last_remainder=word(layout.off_last_remainder), next=word(layout.off_next),
                next_free=word(layout.off_next_free), attached_threads=word(layout.off_attached_threads),
                system_mem=word(layout.off_system_mem), max_system_mem=word(layout.off_max_system_mem))


def _empty_bin(kind: BinKind, index: int, head: int) -> BinList:
    return BinList(kind, index, head, (), (), complete=False)


def _blank_arena(address: int, number: int, is_main: bool, free_list: set[int]) -> Arena:
    """An arena whose memory reads as zeros (its pages are missing from the core, or were never written):
    one finding instead of one per bin, and empty lists marked as cut."""
    finding = Finding(Severity.ERROR, address, f"arena {address:#x}", "the arena reads as all zeros: its pages are "
                      "missing from the core (or it was overwritten); nothing of it can be decoded", Kind.ARENA,
                      "an initialised malloc_state", "zeros")
    return Arena(address=address, number=number, is_main=is_main, mutex=0, flags=0, have_fastchunks=None, top=0,
                 top_size=0, last_remainder=0, next=0, next_free=0, attached_threads=None, system_mem=0,
                 max_system_mem=0, heaps=(), fastbins=(), unsorted=_empty_bin(BinKind.UNSORTED, 1, address),
                 bins=(), on_free_list=address in free_list, findings=(finding,))


def _decode_arena(mem: Memory, disc: Discovery, address: int, number: int, mp: MallocPar | None,
                  free_list: set[int]) -> Arena:
    layout = disc.layout
    is_main = address == disc.main_arena
    findings: list[Finding] = []
    if not any(mem.read(address, layout.arena_size)):
        return _blank_arena(address, number, is_main, free_list)
    f = read_arena(mem, layout, address)
    top = f["top"] or 0
    top_lost = False
    try:
        top_size = u64(mem, top + 8) & ~SIZE_BITS if top else 0
    except ReadError:
        top_lost = True
        findings.append(Finding(Severity.ERROR, address + layout.off_top, f"arena {address:#x}",
                                f"top {top:#x} is not in the target's memory", Kind.UNMAPPED,
                                "a pointer into the heap", f"{top:#x}"))
        top_size = 0
    if f["mutex"]:
        findings.append(Finding(Severity.WARNING, address, f"arena {address:#x}",
                                "the arena mutex was held at snapshot time: its lists may be mid-update",
                                Kind.MUTEX_HELD, "0", str(f["mutex"])))
    system_mem = f["system_mem"] or 0
    if top_size > max(system_mem, 0):
        findings.append(Finding(Severity.ERROR, top, f"arena {address:#x}", f"top's size {top_size:#x} is more than "
                                f"the arena's system_mem {system_mem:#x}: the size (or system_mem) is damaged",
                                Kind.TOP_SIZE, f"at most {system_mem:#x}", f"{top_size:#x}"))
        sbrk = (mp.get("sbrk_base") or 0) if (is_main and mp) else 0
        top_size = max(0, sbrk + system_mem - top) if sbrk and sbrk <= top < sbrk + system_mem else 0
    if is_main:
        heaps: list[Heap] = []
        sbrk_base = mp.get("sbrk_base") if mp else main_memory_start(mem, address, top, f["flags"] or 0,
                                                                     system_mem, layout)
        if sbrk_base and top:
            end = top + top_size
            if top_lost and top < sbrk_base + system_mem:  # up to where system_mem says: the walk names the gap
                end = sbrk_base + system_mem
            contiguous = not (f["flags"] or 0) & 2  # NONCONTIGUOUS_BIT: top may be in an mmap'd piece
            if contiguous and not sbrk_base <= top <= end <= sbrk_base + 2 * system_mem + (64 << 20):
                findings.append(Finding(Severity.ERROR, address + layout.off_top, f"arena {address:#x}",
                                        f"top {top:#x} (size {top_size:#x}) is not within the sbrk region that "
                                        f"starts at {sbrk_base:#x} and holds {system_mem:#x} bytes",
                                        Kind.TOP_SIZE, f"within {sbrk_base:#x}..{sbrk_base + system_mem:#x}",
                                        f"{top:#x}"))
                end = sbrk_base + max(system_mem, 0)
            heaps.append(Heap(sbrk_base, end - sbrk_base, end - sbrk_base, address, 0, None))
    else:
        heaps, heap_findings = walk_heaps(mem, layout, address, top, disc.heap_max_size)
        findings.extend(heap_findings)

    fastbins: list[BinList] = []
    for i in range(layout.nfastbins):
        fb, fb_findings = walk_fastbin(mem, layout, address, i, system_mem)
        fastbins.append(fb)
        findings.extend(fb_findings)
    unsorted, u_findings = walk_bin(mem, layout, address, 1, system_mem)
    findings.extend(u_findings)
    bins: list[BinList] = []
    for i in range(2, NBINS):
        b, b_findings = walk_bin(mem, layout, address, i, system_mem)
        bins.append(b)
        findings.extend(b_findings)
    return Arena(address=address, number=number, is_main=is_main, mutex=f["mutex"] or 0, flags=f["flags"] or 0,
                 have_fastchunks=f["have_fastchunks"], top=top, top_size=top_size,
                 last_remainder=f["last_remainder"] or 0, next=f["next"] or 0, next_free=f["next_free"] or 0,
                 attached_threads=f["attached_threads"], system_mem=system_mem,
                 max_system_mem=f["max_system_mem"] or 0, heaps=tuple(heaps), fastbins=tuple(fastbins),
                 unsorted=unsorted, bins=tuple(bins), on_free_list=address in free_list, findings=tuple(findings))


def _walk_free_list(mem: Memory, disc: Discovery, arenas: list[int]) -> tuple[set[int], list[Finding], str]:
    """Arenas on glibc's free_list (threads exited): from the free_list variable, else attached_threads == 0."""
    layout = disc.layout
    if disc.free_list_address is not None:
        walk = ListWalk("arena free_list", len(arenas) + 1)
        members: set[int] = set()
        try:
            a = u64(mem, disc.free_list_address)
            while a:
                if not walk.admit(a, "arena", disc.free_list_address, alignment=8):
                    break
                if a not in arenas:
                    walk.fail(a, f"free_list holds {a:#x}, which is not in the arena ring", Kind.ARENA_RING)
                    break
                members.add(a)
                a = u64(mem, a + layout.off_next_free)
        except ReadError as exc:
            walk.fail(disc.free_list_address, f"cannot read the free list: {exc}", Kind.ARENA_RING)
        return members, walk.findings, f"symbol free_list at {disc.free_list_address:#x}"
    if layout.off_attached_threads is None:
        return set(), [], "unknown"
    members = set()
    for a in arenas:
        if a == disc.main_arena:
            continue
        try:
            if u64(mem, a + layout.off_attached_threads) == 0:
                members.add(a)
        except ReadError:
            pass
    return members, [], "attached_threads == 0"


def _without_mp(disc: Discovery) -> Finding:
    """What is derived otherwise when mp_ is not found (or unreadable)."""
    parts = ["the main arena's memory is taken to start at its top's end minus its system_mem",
             "mmapped chunks are those found in memory, not checked against mp_'s counters"]
    if disc.layout.tcache_counts_down:
        parts.append("tcache counts use the fill count the tcache structs show")
    return Finding(Severity.INFO, 0, "mp_", "mp_ (malloc_par) was not found: " + "; ".join(parts),
                   Kind.DISCOVERY)


def _require_initialised(mem: Memory, disc: Discovery) -> None:
    """Raises MallocUnused when main_arena is still all zeros where malloc_init_state writes (top and the
    bin heads): glibc's malloc was never called, so there is no heap to walk."""
    lay = disc.layout
    if disc.main_arena is None:
        return
    try:
        top = u64(mem, disc.main_arena + lay.off_top)
        heads = mem.read(lay.bin_header(disc.main_arena, 1) + 16, 16 * 8)
    except ReadError:
        return  # unreadable: the walkers report it
    if top == 0 and not any(heads):
        raise MallocUnused(f"glibc's malloc was never used in this process: main_arena ({disc.main_arena:#x}) "
                           "is not initialised, so there is no glibc heap to walk")


def collect(mem: Memory, disc: Discovery, threads: list[ThreadRegs], target: str = "",
            walk_chunks: bool = False, regions: list[tuple[int, int]] | None = None, progress=None) -> HeapState:
    """Decodes the whole malloc state: every arena in ring order, every thread's tcache.

    WALK_CHUNKS also walks every chunk of every heap and accounts for each arena's bytes, and looks
    for mmapped chunks at the start of the target's memory REGIONS.
    """
    with gc_paused():
        return _collect(mem, disc, threads, target, walk_chunks, regions, progress)


def _collect(mem: Memory, disc: Discovery, threads: list[ThreadRegs], target: str,
             walk_chunks: bool, regions: list[tuple[int, int]] | None, progress) -> HeapState:
    findings: list[Finding] = list(disc.findings)
    last_words = abort_message(mem, disc)
    mp = None
    if disc.mp_address is not None:
        try:
            mp = read_mp(mem, disc.layout, disc.mp_address)
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, disc.mp_address, "mp_", f"cannot read: {exc}", Kind.UNMAPPED))
    _require_initialised(mem, disc)
    if mp is None:
        findings.append(_without_mp(disc))
    ring, ring_findings = walk_arena_ring(mem, disc.layout, disc.main_arena) if disc.main_arena is not None \
        else ([], [])
    findings.extend(ring_findings)
    if regions is not None:
        lost = [a for a in arenas_by_heaps(mem, disc.layout, regions, disc.heap_max_size) if a not in ring]
        if lost and not ring:
            ring = [None] + lost  # main_arena's place: where it is, discovery has said it cannot tell
        elif lost:
            if not ring_findings:
                ring_findings = [ring_shortcut(mem, disc.layout, ring, lost)]
                findings.extend(ring_findings)
            ring = ring + lost
            findings.append(Finding(Severity.WARNING, ring_findings[0].address, "arena ring", (
                f"the arena ring is broken, and {len(lost)} arena(s) it no longer reaches were found by their "
                f"heaps ({', '.join(f'{a:#x}' for a in lost)}): they are listed after the ring, numbered on "
                "from it, so their numbers are not malloc_info's"), Kind.ARENA_RING))
    free_list, fl_findings, fl_how = _walk_free_list(mem, disc, [a for a in ring if a is not None])
    findings.extend(fl_findings)
    facts = list(disc.facts)
    facts.append(Fact("arena_free_list", sorted(free_list), fl_how))
    arenas = []
    stopped = None
    for number, address in enumerate(ring):
        if address is None:
            continue
        try:
            arenas.append(_decode_arena(mem, disc, address, number, mp, free_list))
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, address, f"arena {number}", f"cannot read the arena: {exc}",
                                    Kind.ARENA))
        except KeyboardInterrupt:
            stopped = Finding(Severity.WARNING, address, f"arena {number}", "reading the free lists was "
                              f"interrupted (Ctrl-C) in arena {number}: it and the {len(ring) - number - 1} "
                              "arena(s) after it are left out, and no chunk is walked", Kind.INTERRUPTED)
            break
    if regions is not None and stopped is None and not (arenas and arenas[0].is_main):
        main = _main_by_its_heap(mem, disc, regions, arenas)
        arenas[:0] = [main] if main is not None else []
    fill_seen = fill_from_tcaches(mem, disc, threads)
    fill = mp.get("tcache_count") if mp else fill_seen
    decoded_threads = []
    for regs in sorted(threads, key=lambda t: t.number):
        thread, t_findings = decode_thread(mem, disc, regs, fill)
        decoded_threads.append(thread)
        findings.extend(t_findings)
    state = HeapState(target=target, glibc_version=disc.version, glibc_label=disc.version_label,
                      heap_max_size=disc.heap_max_size,
                      layout_name=disc.layout.name,
                      main_arena=disc.main_arena, mp=mp, arenas=tuple(arenas), threads=tuple(decoded_threads),
                      facts=tuple(facts), findings=tuple(findings), lists_stopped=stopped is not None)
    if walk_chunks and regions is not None and arenas and arenas[0].is_main and arenas[0].noncontiguous:
        arenas[0] = with_main_regions(mem, disc, arenas[0], arenas, regions)
        state = dataclasses.replace(state, arenas=tuple(arenas))
    if stopped is not None:
        state.findings_extra.append(stopped)
        if last_words is not None:
            state.findings_extra.append(last_words)
        if walk_chunks:
            _leave_unwalked(state, state.arenas)
        return state
    state = scan_for_tcaches(mem, disc, state)
    state = dataclasses.replace(state, findings=crash_findings(mem, state, disc, threads, last_words)
                                + state.findings)
    if walk_chunks:
        walk_arenas(mem, disc.layout, state, progress)
        if regions is not None and not state.interrupted:
            state.mmapped.extend(mmapped_of_state(mem, disc, state, regions))
    if mp is not None:
        checked = walk_chunks and regions is not None and not state.interrupted
        state = dataclasses.replace(state, facts=state.facts + (
            _mp_pinned(mem, disc, state, mp, fill_seen, checked),))
    return state


def _main_by_its_heap(mem: Memory, disc: Discovery, regions: list[tuple[int, int]], arenas: list[Arena]
                      ) -> Arena | None:
    """The main arena, when its own memory is missing, as the heap found by its chunks shows it (or None)."""
    skip = [(h.address, h.address + disc.heap_max_size) for a in arenas for h in a.heaps]
    heap = headless.main_heap(mem, regions, skip)
    return None if heap is None else headless.main_arena_of_heap(disc.main_arena or 0, heap)


def _mp_pinned(mem: Memory, disc: Discovery, state: HeapState, mp: MallocPar, fill_seen: int | None,
               mmapped_checked: bool) -> Fact:
    """Which of mp_'s fields the rest of memory confirms, and which are read as they are: sbrk_base against
    where the main arena's memory starts, n_mmaps and mmapped_mem against the mmapped chunks found (when
    they were looked for), tcache_count (2.42+) against the fill count the tcache structs show."""
    confirmed: dict[str, str] = {}
    main = state.arenas[0] if state.arenas and state.arenas[0].is_main else None
    if main is not None and main.system_mem:
        start = main_memory_start(mem, main.address, main.top, main.flags, main.system_mem, disc.layout)
        if start is not None and start == mp.get("sbrk_base"):
            confirmed["sbrk_base"] = "where the main arena's memory starts"
    if mmapped_checked and mmapped_agree(disc.layout, mp, state.mmapped):
        confirmed["n_mmaps"] = confirmed["mmapped_mem"] = "the mmapped chunks found in memory"
    if fill_seen is not None and fill_seen == mp.get("tcache_count"):
        confirmed["tcache_count"] = "the fill count the tcache structs show"
    unconfirmed = [name for name in mp.values if name not in confirmed]
    how = "; ".join(f"{name}: {why}" for name, why in confirmed.items()) or "nothing confirms a field"
    return Fact("mp_fields", {"confirmed": sorted(confirmed), "unconfirmed": unconfirmed},
                f"{how}; the others are read as they are")


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a while: decoding and walking make millions of short-lived
    tuples and no cycles, and the collector's passes over everything alive cost a sixth of a large walk."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def walk_arenas(mem: Memory, layout: Layout, state: HeapState, progress=None) -> None:
    """Walks every chunk of every arena into STATE's accounts and trim estimates (see `_walk_arenas`), with
    the garbage collector paused."""
    with gc_paused():
        _walk_arenas(mem, layout, state, progress)


def _leave_unwalked(state: HeapState, arenas) -> None:
    """ARENAS' accounts with all their bytes unwalked, and no trim estimate: a walk stopped short of them."""
    for b in arenas:
        acc = state.accounts[b.address] = Account(b.address, b.system_mem)
        acc.unwalked = b.system_mem
        state.trims[b.address] = TrimEstimate(b.address)


def _walk_arenas(mem: Memory, layout: Layout, state: HeapState, progress=None) -> None:
    """Walks every chunk of every arena into STATE's accounts and trim estimates.

    PROGRESS(done, total), when given, hears the bytes walked so far.  Ctrl-C (KeyboardInterrupt) ends the
    walk: the arenas not walked to the end get an account with all their bytes unwalked, and a finding
    says where it stopped, so every command prints what it has, marked partial.
    """
    listing = Listing.of_state(state)
    mp = state.mp
    thp = (mp.get("thp_pagesize") or 0) if mp else 0
    contiguous = not (mp and mp.get("hp_pagesize"))
    total = sum(a.system_mem for a in state.arenas)
    done = 0
    for i, a in enumerate(state.arenas):  # one walk per arena feeds both the accounting and the trim simulation
        sim = TrimSimulation(mem, layout, a, thp, contiguous and not a.noncontiguous)
        tick = None if progress is None else (lambda walked, base=done: progress(base + walked, total))
        try:
            state.accounts[a.address] = account(mem, layout, a, listing, sim, tick)
            state.trims[a.address] = sim.result()
        except KeyboardInterrupt:
            _leave_unwalked(state, state.arenas[i:])
            state.findings_extra.append(Finding(
                Severity.WARNING, a.address, f"arena {a.number}", f"the chunk walk was interrupted (Ctrl-C) in arena "
                f"{a.number}: it and the {len(state.arenas) - i - 1} arena(s) after it are not walked, so their "
                "in-use and free bytes are unknown", Kind.INTERRUPTED))
            return
        done += a.system_mem
