"""Builds a `HeapState` from a target's memory and a `Discovery`.

This is where the walkers are put together: mp_, the arena ring, each arena's
heaps and free lists, the arena free list, and each thread's arena and tcache.
Reads that fail become findings; whatever could be decoded is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from types import MappingProxyType

from heapwalk.analysis.pages import PagesSeen
from heapwalk.arch import DEFAULT, Architecture
from heapwalk.glibc.walk.arenas import ArenaHead, arena_head, decode_arena, walk_free_list
from heapwalk.glibc.walk.chunks import Listing
from heapwalk.glibc.walk.chunkwalk import account
from heapwalk.glibc.forensics.links import cut_outside
from heapwalk.glibc.locate.mpshape import MP_SETTABLE, mp_impossible
from heapwalk.glibc.forensics.crash import abort_message, crash_findings
from heapwalk.glibc.walk.mmapped import mmapped_agree, mmapped_of_state, with_main_regions
from heapwalk.glibc.walk.threads import decode_thread, fill_from_tcaches, scan_for_tcaches
from heapwalk.glibc.walk.trim import TrimSimulation, trim_settings
from heapwalk.glibc.locate.discovery import Discovery, MallocUnused
from heapwalk.glibc.locate.mainarena import main_memory_start
from heapwalk.glibc.bulk.onepass import OnePass
from heapwalk.glibc.locate.layout import MP_INT_FIELDS, Layout
from heapwalk.inferior.gcpause import gc_paused
from heapwalk.inferior.memory import Memory, ReadError, drop_cached, u64
from heapwalk.inferior.residency import Residency
from heapwalk.glibc.model import Account, Arena, ChunkWalk, HeapState, MallocPar, TrimEstimate
from heapwalk.common.findings import Fact, Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate import headless
from heapwalk.glibc.locate.heuristics import arenas_by_heaps
from heapwalk.inferior.threads import ThreadRegs
from heapwalk.glibc.walk.ring import ring_shortcut, walk_arena_ring

__all__ = ["collect", "walk_arenas", "read_mp"]


def read_mp(mem: Memory, layout: Layout, address: int) -> MallocPar:
    """Reads every field of mp_ that this layout has."""
    raw = mem.read(address, layout.mp_size)
    values = {}
    for name, off in layout.mp.items():
        fmt = "<i" if name in MP_INT_FIELDS else "<Q"
        values[name] = struct.unpack_from(fmt, raw, off)[0]
    return MallocPar(address, values)


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
            walk_chunks: bool = False, regions: list[tuple[int, int]] | None = None, progress=None,
            sweep: bool = True, residency: Residency | None = None, keep_used: bool = False,
            keep_chunks: bool = False, keep_pages: bool = False, arch: Architecture = DEFAULT) -> HeapState:
    """Decodes the whole malloc state: every arena in ring order, every thread's tcache (each thread's TLS read
    as ARCH lays it out).

    WALK_CHUNKS also walks every chunk of every heap and accounts for each arena's bytes, and looks
    for mmapped chunks at the start of the target's memory REGIONS.  It does so in one pass over each
    arena's heaps (`onepass`) unless SWEEP is False, or the pass finds anything a sound heap does not
    have: then the careful walkers follow the lists through memory and walk the heaps after them.  Without
    WALK_CHUNKS only arenas bigger than `onepass.LISTS_SWEPT_FROM` are swept for their lists.  RESIDENCY,
    when known, says which pages were in RAM (the trim estimates count those).  KEEP_USED keeps each swept
    arena's in-use chunks in the walk (`ChunkWalk.used`), for the leak scan; KEEP_CHUNKS all its chunks and their
    states (`ChunkWalk.chunks`), for the heap maps; KEEP_PAGES which whole pages the sweep read hold anything
    (`ChunkWalk.pages`), for a plain core's contents.
    """
    with gc_paused():
        return _collect(mem, disc, threads, target, walk_chunks, regions, progress, sweep, residency, keep_used,
                        keep_chunks, keep_pages, arch)


def _threads(mem: Memory, disc: Discovery, threads: list[ThreadRegs], fill, arch: Architecture
             ) -> tuple[list, list[Finding]]:
    """Every thread decoded (its tcache walked), in the order of their numbers, and what was found on the way.  The
    pages the walks cached, about one a tcache entry, are let go: the arenas' walks read their own."""
    decoded, findings = [], []
    for regs in sorted(threads, key=lambda t: t.number):
        thread, t_findings = decode_thread(mem, disc, regs, fill, arch)
        decoded.append(thread)
        findings.extend(t_findings)
    drop_cached(mem)
    return decoded, findings


def _collect(mem: Memory, disc: Discovery, threads: list[ThreadRegs], target: str, walk_chunks: bool,
             regions: list[tuple[int, int]] | None, progress, sweep: bool, residency: Residency | None,
             keep_used: bool = False, keep_chunks: bool = False, keep_pages: bool = False,
             arch: Architecture = DEFAULT) -> HeapState:
    findings: list[Finding] = list(disc.findings)
    last_words = abort_message(mem, disc)
    mp = _read_mp(mem, disc, findings)
    ring = _ring(mem, disc, regions, findings)
    free_list, fl_findings, fl_how = walk_free_list(mem, disc, [a for a in ring if a is not None])
    findings.extend(fl_findings)
    facts = (*disc.facts, Fact("arena_free_list", sorted(free_list), fl_how))
    fill_seen = fill_from_tcaches(mem, disc, threads)
    fill = mp.get("tcache_count") if mp else fill_seen
    decoded_threads, thread_findings = _threads(mem, disc, threads, fill, arch)
    one_pass = _one_pass(mem, disc, mp, ring, decoded_threads, progress, not walk_chunks, residency, keep_used,
                         keep_chunks, keep_pages) \
        if sweep else None
    arenas, stopped = _decode_arenas(mem, disc, ring, mp, free_list, findings, one_pass)
    if one_pass is not None:
        one_pass.swept_all()
    if regions is not None and stopped is None and not (arenas and arenas[0].is_main):
        main = _main_by_its_heap(mem, disc, regions, arenas)
        arenas[:0] = [main] if main is not None else []
    if regions is not None and arenas and arenas[0].is_main and arenas[0].noncontiguous:
        arenas[0] = with_main_regions(mem, disc, arenas[0], arenas, regions)
    findings.extend(thread_findings)
    state = HeapState(target=target, glibc_version=disc.version, glibc_label=disc.version_label,
                      heap_max_size=disc.heap_max_size, layout_name=disc.layout.name,
                      main_arena=disc.main_arena, mp=mp, arenas=tuple(arenas), threads=tuple(decoded_threads),
                      facts=facts, findings=tuple(findings), lists_stopped=stopped is not None, residency=residency,
                      page_size=disc.page_size)
    if stopped is not None:
        return dataclasses.replace(state, stop_findings=(stopped,) + ((last_words,) if last_words else ()),
                                   walk=_unwalked(state.arenas) if walk_chunks else None)
    state = cut_outside(scan_for_tcaches(mem, disc, state, arch), mem, disc.layout)
    state = dataclasses.replace(state, findings=crash_findings(mem, state, disc, threads, last_words)
                                + state.findings)
    if not walk_chunks:
        return state if mp is None else dataclasses.replace(
            state, facts=state.facts + (_mp_pinned(mem, disc, state, mp, fill_seen, False),))
    swept = None if one_pass is None or state.scanned_tcaches else one_pass.results(state.arenas)
    walk = walk_arenas(mem, disc.layout, state, progress, swept)
    if swept and keep_used:
        walk = dataclasses.replace(walk, used=_of_swept(one_pass.used, swept))
    if keep_pages and one_pass is not None and one_pass.pages is not None:
        walk = dataclasses.replace(walk, pages=one_pass.pages.seen())
    if swept and keep_chunks:
        walk = dataclasses.replace(walk, chunks=_of_swept(one_pass.chunks, swept))
    if regions is not None and not walk.interrupted:
        mmapped, disagree = mmapped_of_state(mem, disc, state, regions)
        walk = dataclasses.replace(walk, mmapped=tuple(mmapped),
                                   findings=walk.findings + ((disagree,) if disagree else ()))
    state = dataclasses.replace(state, walk=walk)
    if mp is not None:
        checked = regions is not None and not walk.interrupted
        state = dataclasses.replace(state, facts=state.facts + (
            _mp_pinned(mem, disc, state, mp, fill_seen, checked),))
    return state


def _of_swept(kept: dict, swept: dict) -> MappingProxyType:
    """What the one pass KEPT of the arenas whose walk it stands for (SWEPT)."""
    return MappingProxyType({address: kept[address] for address in swept if address in kept})


def _read_mp(mem: Memory, disc: Discovery, findings: list[Finding]) -> MallocPar | None:
    """mp_, or None (not found, or unreadable: a finding says so, and what is derived otherwise); raises
    MallocUnused when malloc was never called."""
    mp = None
    if disc.mp_address is not None:
        try:
            mp = read_mp(mem, disc.layout, disc.mp_address)
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, disc.mp_address, "mp_", f"cannot read: {exc}", Kind.UNMAPPED))
    _require_initialised(mem, disc)
    if mp is None:
        findings.append(_without_mp(disc))
        return mp
    return _settable(mp, disc.layout, findings)


#: what glibc starts mp_'s tcache fields with (64 bins, requests up to 1032 bytes); the count is the layout's
_MP_DEFAULTS = {"tcache_bins": 64, "tcache_max_bytes": 1032}


def _settable(mp: MallocPar, layout: Layout, findings: list[Finding]) -> MallocPar:
    """MP with each field no setting of glibc's can give (`mpshape.MP_SETTABLE`: a stray write) named as an
    error at its address and taken as glibc's default for the decode."""
    bad = mp_impossible(mp.values)
    if not bad:
        return mp
    values = dict(mp.values)
    for name in bad:
        default = _MP_DEFAULTS.get(name, layout.tcache_fill_count)
        findings.append(Finding(Severity.ERROR, mp.address + layout.mp[name], "mp_",
                                f"mp_.{name} is {values[name]:#x}, more than glibc lets it be "
                                f"({MP_SETTABLE[name]:#x}): a stray write; malloc would use it (tcache_bins past the "
                                f"tcache's {layout.tcache_bins} bins reaches outside the tcache struct); the decode "
                                f"takes glibc's default, {default}", Kind.MP_FIELD,
                                f"at most {MP_SETTABLE[name]:#x}", f"{values[name]:#x}"))
        values[name] = default
    return MallocPar(mp.address, values)


def _ring(mem: Memory, disc: Discovery, regions: list[tuple[int, int]] | None,
          findings: list[Finding]) -> list[int | None]:
    """The arenas in ring order, then those the ring no longer reaches, found by their heaps in REGIONS;
    None in main_arena's place when where it is cannot be told."""
    ring, ring_findings = walk_arena_ring(mem, disc.layout, disc.main_arena) if disc.main_arena is not None \
        else ([], [])
    findings.extend(ring_findings)
    if regions is None:
        return ring
    lost = [a for a in arenas_by_heaps(mem, disc.layout, regions, disc.heap_max_size) if a not in ring]
    if lost and not ring:
        return [None] + lost  # main_arena's place: where it is, discovery has said it cannot tell
    if lost:
        if not ring_findings:
            ring_findings = [ring_shortcut(mem, disc.layout, ring, lost)]
            findings.extend(ring_findings)
        findings.append(Finding(Severity.WARNING, ring_findings[0].address, "arena ring", (
            f"the arena ring is broken, and {len(lost)} arena(s) it no longer reaches were found by their "
            f"heaps ({', '.join(f'{a:#x}' for a in lost)}): they are listed after the ring, numbered on "
            "from it, so their numbers are not malloc_info's"), Kind.ARENA_RING))
    return ring + lost


def _decode_arenas(mem: Memory, disc: Discovery, ring: list[int | None], mp: MallocPar | None,
                   free_list: set[int], findings: list[Finding], one_pass: OnePass | None = None
                   ) -> tuple[list[Arena], Finding | None]:
    """Each arena of RING with its heaps and lists, and where Ctrl-C stopped the reading (None: it was not);
    through ONE_PASS when given (see `onepass`), each arena's heaps swept ahead while the arena before's lists are
    followed, where it sweeps ahead."""
    arenas = []
    ahead = one_pass is not None and one_pass.sweeps_ahead
    heads: dict[int, ArenaHead | ReadError] = {}
    numbers = [number for number, address in enumerate(ring) if address is not None]
    for at, number in enumerate(numbers):
        address = ring[number]
        try:
            for later in numbers[at:at + 2] if ahead else ():
                if later not in heads:
                    heads[later] = _head(mem, disc, ring[later], later, mp, free_list, one_pass)
            head = heads.pop(number, None)
            if isinstance(head, ReadError):
                raise head
            arenas.append(decode_arena(mem, disc, address, number, mp, free_list, one_pass, head))
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, address, f"arena {number}", f"cannot read the arena: {exc}",
                                    Kind.ARENA))
        except KeyboardInterrupt:
            return arenas, Finding(Severity.WARNING, address, f"arena {number}", "reading the free lists was "
                                   f"interrupted (Ctrl-C) in arena {number}: it and the {len(ring) - number - 1} "
                                   "arena(s) after it are left out, and no chunk is walked", Kind.INTERRUPTED)
    return arenas, None


def _head(mem: Memory, disc: Discovery, address: int, number: int, mp: MallocPar | None, free_list: set[int],
          one_pass: OnePass) -> ArenaHead | ReadError:
    """The arena at ADDRESS read but for its lists (`arena_head`), its sweep started ahead by ONE_PASS; the
    ReadError that stops it, raised in its turn."""
    try:
        head = arena_head(mem, disc, address, number, mp, free_list)
    except ReadError as exc:
        return exc
    if not head.blank:
        one_pass.ahead(head.arena)
    return head


def _one_pass(mem: Memory, disc: Discovery, mp: MallocPar | None, ring: list[int | None], threads: list,
              progress, lists_only: bool, residency: Residency | None, keep_used: bool = False,
              keep_chunks: bool = False, keep_pages: bool = False) -> OnePass:
    """The one-pass path of a decode: the threads' tcaches, mp_'s page sizes, and the bytes the arenas of
    RING hold (for PROGRESS); LISTS_ONLY for a decode without the chunk walk; RESIDENCY for the trim estimates;
    KEEP_USED keeps the in-use chunks; KEEP_PAGES notes which pages the sweep held hold anything
    (`pages.PagesSeen`), as it always does where RESIDENCY is not known: the trim estimates then take them from
    there instead of reading the pages again."""
    thp, contiguous = trim_settings(mp)
    total = 0
    for address in ring:
        with contextlib.suppress(ReadError):
            total += u64(mem, address + disc.layout.off_system_mem) if address is not None else 0
    tcaches = [t.tcache for t in threads if t.tcache is not None]
    keep_pages = keep_pages or residency is None    # a plain core: the trim estimates ask which pages hold anything
    pages = PagesSeen() if keep_pages and not lists_only else None
    return OnePass(mem, disc.layout, tcaches, thp, contiguous, progress, total, lists_only, residency, keep_used,
                   keep_chunks, pages, disc.page_size)


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


def walk_arenas(mem: Memory, layout: Layout, state: HeapState, progress=None, swept=None) -> ChunkWalk:
    """Walks every chunk of every arena of STATE: their accounts and trim estimates (see `_walk_arenas`), with
    the garbage collector paused; SWEPT, when given, has them already for some arenas or all
    (`OnePass.results`): the careful walkers take only the others."""
    swept = swept or {}
    if all(a.address in swept for a in state.arenas):
        return ChunkWalk(MappingProxyType({a.address: swept[a.address][0] for a in state.arenas}),
                         MappingProxyType({a.address: swept[a.address][1] for a in state.arenas}))
    with gc_paused():
        return _walk_arenas(mem, layout, state, progress, swept)


def _unwalked(arenas, accounts=None, trims=None, stopped: Finding | None = None) -> ChunkWalk:
    """ACCOUNTS and TRIMS, with ARENAS' accounts all unwalked bytes and no trim estimate: a walk stopped short
    of them (where STOPPED says)."""
    accounts, trims = dict(accounts or {}), dict(trims or {})
    for b in arenas:
        accounts[b.address] = Account(b.address, b.system_mem, unwalked=b.system_mem)
        trims[b.address] = TrimEstimate(b.address)
    return ChunkWalk(MappingProxyType(accounts), MappingProxyType(trims), findings=(stopped,) if stopped else (),
                     interrupted=stopped is not None)


def _walk_arenas(mem: Memory, layout: Layout, state: HeapState, progress=None, swept=None) -> ChunkWalk:
    """Walks every chunk of every arena of STATE not in SWEPT (address: its account and trim estimate, taken
    as they are): their accounts and trim estimates.

    PROGRESS(done, total), when given, hears the bytes walked so far.  Ctrl-C (KeyboardInterrupt) ends the
    walk: the arenas not walked to the end get an account with all their bytes unwalked, and a finding
    says where it stopped, so every command prints what it has, marked partial.
    """
    listing = Listing.of_state(state)
    mp = state.mp
    thp, contiguous = trim_settings(mp)
    swept = swept or {}
    accounts = {address: account_and_trim[0] for address, account_and_trim in swept.items()}
    trims = {address: account_and_trim[1] for address, account_and_trim in swept.items()}
    walked = [a for a in state.arenas if a.address not in swept]
    total = sum(a.system_mem for a in walked)
    done = 0
    for i, a in enumerate(walked):  # one walk per arena feeds both the accounting and the trim simulation
        sim = TrimSimulation(mem, layout, a, thp, contiguous and not a.noncontiguous, state.residency,
                             page=state.page_size)
        tick = None if progress is None else (lambda walked, base=done: progress(base + walked, total))
        try:
            accounts[a.address] = account(mem, layout, a, listing, sim, tick)
            trims[a.address] = sim.result()
        except KeyboardInterrupt:
            stopped = _unwalked(walked[i:], accounts, trims, Finding(
                Severity.WARNING, a.address, f"arena {a.number}", f"the chunk walk was interrupted (Ctrl-C) in arena "
                f"{a.number}: it and the {len(walked) - i - 1} arena(s) after it are not walked, so their "
                "in-use and free bytes are unknown", Kind.INTERRUPTED))
            return dataclasses.replace(stopped, **_in_order(state.arenas, stopped.accounts, stopped.trims))
        done += a.system_mem
    return ChunkWalk(**_in_order(state.arenas, accounts, trims))


def _in_order(arenas, accounts, trims) -> dict:
    """ACCOUNTS and TRIMS (by arena address) in the order of ARENAS, as `ChunkWalk` takes them."""
    return {"accounts": MappingProxyType({a.address: accounts[a.address] for a in arenas}),
            "trims": MappingProxyType({a.address: trims[a.address] for a in arenas})}
