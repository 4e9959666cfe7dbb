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
from dataclasses import dataclass

from heapwalk.glibc.chunks import Account, ChunkState, Listing, list_states
from heapwalk.glibc.chunkwalk import account
from heapwalk.glibc.mmapped import find_mmapped, find_mmapped_in_pages, main_regions
from heapwalk.glibc.trim import TrimEstimate, TrimSimulation
from heapwalk.glibc.aborts import Candidate, check_for, explain
from heapwalk.glibc.discovery import Discovery, MallocUnused, main_memory_start
from heapwalk.glibc.layout import MP_INT_FIELDS, NBINS, SIZE_BITS, Layout
from heapwalk.target.memory import Memory, ReadError, u64
from heapwalk.glibc.model import Arena, BinKind, BinList, Heap, HeapState, MallocPar, Thread, thread_numbers
from heapwalk.findings import Fact, Finding, Kind, Severity
from heapwalk.glibc import headless
from heapwalk.glibc.heuristics import arenas_by_heaps
from heapwalk.glibc.tcachescan import scan_tcaches
from heapwalk.target.threads import FATAL_SIGNALS, ThreadRegs
from heapwalk.glibc.lists import ListWalk, walk_bin, walk_fastbin, walk_tcache
from heapwalk.glibc.ring import walk_arena_ring, walk_heaps

__all__ = ["collect", "walk_arenas", "read_mp", "read_arena", "mmapped_agree"]


_STACK_WINDOW = 1 << 15


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


def _tls_intact(mem: Memory, fs_base: int) -> bool:
    """Does the core hold the thread's TLS?  On x86-64 the thread control block at $fs_base starts with a
    pointer to itself; a stack written as zeros (where a thread's TLS lives) or left out fails this."""
    try:
        return u64(mem, fs_base) == fs_base
    except ReadError:
        return False


def _thread(mem: Memory, disc: Discovery, regs: ThreadRegs, fill_count: int | None) -> tuple[Thread, list[Finding]]:
    findings: list[Finding] = []
    arena = tcache_ptr = None
    tcache = None
    if regs.fs_base and not _tls_intact(mem, regs.fs_base):
        return Thread(regs.number, regs.lwp, regs.fs_base, None, None, None, tls_lost=True), findings
    if regs.fs_base:
        for attr, name in (("thread_arena_tpoff", "thread_arena"), ("tcache_tpoff", "tcache")):
            tpoff = getattr(disc, attr)
            if tpoff is None:
                continue
            try:
                value = u64(mem, regs.fs_base + tpoff)
            except ReadError:
                findings.append(Finding(Severity.WARNING, regs.fs_base + tpoff, f"thread {regs.number}",
                                        f"cannot read the {name} TLS variable", Kind.UNMAPPED))
                continue
            if name == "tcache":
                tcache_ptr = value
            else:
                arena = value
    if tcache_ptr and not disc.is_libc_address(tcache_ptr):
        tcache = walk_tcache(mem, disc.layout, tcache_ptr, fill_count)
    return Thread(regs.number, regs.lwp, regs.fs_base or 0, arena or None, tcache_ptr or None, tcache), findings


def _scan_for_tcaches(mem: Memory, disc: Discovery, state: HeapState) -> HeapState:
    """STATE with the tcaches found by scanning the arenas, when some threads' tcaches cannot be reached
    through TLS (TLS missing from the core, or tcache's TLS offset unknown); else STATE as it is."""
    lost = [t for t in state.threads if t.tls_lost]
    unreachable = disc.tcache_tpoff is None and any(t.fs_base for t in state.threads)
    notes: tuple[Finding, ...] = ()
    if lost:
        notes += (_tls_lost(mem, lost),)
    if not disc.layout.has_tcache or not (lost or unreachable):
        return dataclasses.replace(state, findings=state.findings + notes)
    known = {tc.address for _, tc in state.tcaches()}
    fill = state.mp.get("tcache_count") if state.mp else None
    scan = scan_tcaches(mem, disc.layout, list(state.arenas), Listing.of_state(state), fill, known)
    why = (f"the TLS of {len(lost)} thread{'s' if len(lost) > 1 else ''} is not in the core" if lost
           else "tcache's TLS offset is unknown")
    text = (f"{why}: the arenas were scanned for tcache structs instead, and {len(scan.tcaches)} found "
            f"({sum(tc.count for tc in scan.tcaches)} entries); which thread owns each is unknown")
    if scan.ambiguous:
        text += (f"; {scan.ambiguous} more in-use chunk{'s' if scan.ambiguous > 1 else ''} of the struct's size "
                 "hold only zeros: empty tcaches or program data, not counted")
    notes += (Finding(Severity.INFO, 0, "tcache scan", text, Kind.TLS_LOST),)
    return dataclasses.replace(state, scanned_tcaches=scan.tcaches, findings=state.findings + notes)


def _tls_lost(mem: Memory, lost: list[Thread]) -> Finding:
    """One warning for the threads whose TLS the core lacks, at the first one's thread control block."""
    first = lost[0].fs_base
    try:
        seen = f"{u64(mem, first):#x}"
    except ReadError:
        seen = "nothing (not in the core)"
    names = thread_numbers([t.number for t in lost])
    return Finding(Severity.WARNING, first, f"thread{'s' if len(lost) > 1 else ''} {names}",
                   f"the core holds no copy of the TLS of {len(lost)} thread{'s' if len(lost) > 1 else ''} "
                   f"({names}): the thread control block at $fs_base ({first:#x} for thread {lost[0].number}) "
                   f"reads {seen}, not a pointer to itself, as when gcore writes threads' stacks as zeros or leaves "
                   "them out; their arenas and tcaches are unknown", Kind.TLS_LOST, f"{first:#x}", seen)


def _with_main_regions(mem: Memory, disc: Discovery, main: Arena, arenas: list[Arena],
                       regions: list[tuple[int, int]]) -> Arena:
    """MAIN with one heap per piece of its non-contiguous memory (else it keeps its sbrk_base..top heap)."""
    skip = [(h.address, h.address + disc.heap_max_size) for a in arenas[1:] for h in a.heaps]
    if disc.libc_range:
        skip.append(disc.libc_range)
    pieces = main_regions(mem, main, regions, skip)
    if not pieces or sum(e - s for s, e in pieces) != main.system_mem:
        return main
    heaps = tuple(Heap(s, e - s, e - s, main.address, 0, None) for s, e in pieces)
    return dataclasses.replace(main, heaps=heaps)


def _mmapped(mem: Memory, disc: Discovery, state: HeapState, regions: list[tuple[int, int]]):
    """The mmapped chunks in REGIONS outside heaps and libc, checked against mp_'s counters."""
    skip = [(h.address, h.address + (disc.heap_max_size if not a.is_main else h.size))
            for a in state.arenas for h in a.heaps]
    if disc.libc_range:
        skip.append(disc.libc_range)
    found = find_mmapped(mem, disc.layout, regions, skip)
    mp = state.mp
    if mp is not None and len(found) < (mp.get("n_mmaps") or 0):
        # some chunk does not start its region: look at every page outside the chunks found; keep what
        # that finds only when it makes the totals mp_'s
        more = find_mmapped_in_pages(mem, disc.layout, regions, skip + [(c.address, c.address + c.span) for c in found])
        if mmapped_agree(disc.layout, mp, found + more):
            found = sorted(found + more, key=lambda c: c.address)
    if mp is not None and not mmapped_agree(disc.layout, mp, found):
        state.findings_extra.append(Finding(
            Severity.WARNING, 0, "mmapped chunks",
            f"found {len(found)} mmapped chunks of {sum(c.span for c in found)} bytes; mp_ counts "
            f"{mp.get('n_mmaps')} of {mp.get('mmapped_mem')} (chunks with front padding, or regions "
            "missing from the core, are not found)", Kind.MMAPPED))
    return found


def mmapped_agree(layout: Layout, mp: MallocPar, chunks) -> bool:
    """Do CHUNKS (mmapped chunks found in memory) make mp_'s n_mmaps and mmapped_mem?  From glibc 2.43 each
    mremap of a mmapped chunk (realloc) counts 16 bytes too many in mmapped_mem, for good: the count must
    match, and the bytes may exceed the mappings' by a multiple of 16."""
    if len(chunks) != mp.get("n_mmaps"):
        return False
    drift = (mp.get("mmapped_mem") or 0) - sum(c.span for c in chunks)
    return drift == 0 or (layout.mmap_chunk_rule_243 and drift > 0 and drift % 16 == 0)


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


def _without_mp(disc: Discovery) -> Finding:
    """What is derived otherwise when mp_ is not found (or unreadable)."""
    parts = ["the main arena's memory is taken to start at its top's end minus its system_mem",
             "mmapped chunks are those found in memory, not checked against mp_'s counters"]
    if disc.layout.tcache_counts_down:
        parts.append("tcache counts use the fill count the tcache structs show")
    return Finding(Severity.INFO, 0, "mp_", "mp_ (malloc_par) was not found: " + "; ".join(parts),
                   Kind.DISCOVERY)


def _fill_from_tcaches(mem: Memory, disc: Discovery, threads: list[ThreadRegs]) -> int | None:
    """mp_.tcache_count as the tcache structs show it, for glibc 2.42+ whose num_slots count down from it:
    every bin starts at the fill count, so the largest num_slots of any thread's tcache is it (a tcache whose
    every bin holds something shows less).  None when no tcache is readable or counts go up."""
    layout = disc.layout
    if not layout.tcache_counts_down or disc.tcache_tpoff is None:
        return None
    best = None
    for regs in threads:
        try:
            pointer = u64(mem, regs.fs_base + disc.tcache_tpoff) if regs.fs_base else 0
            if not pointer or pointer % 16 or disc.is_libc_address(pointer):
                continue
            slots = struct.unpack_from(f"<{layout.tcache_bins}H", mem.read(pointer, 2 * layout.tcache_bins))
        except ReadError:
            continue
        best = max(best or 0, max(slots))
    return best


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


def _crash_findings(mem: Memory, state: HeapState, disc: Discovery, threads: list[ThreadRegs],
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


def _next_of(mem: Memory, layout: Layout, arena: int) -> int | None:
    try:
        return u64(mem, arena + layout.off_next)
    except ReadError:
        return None


def _shortcut(mem: Memory, layout: Layout, ring: list[int], lost: list[int]) -> Finding:
    """The link of a ring that closes but skips LOST arenas (found by their heaps): the ring arena whose next
    is also a lost arena's next (it jumps over the lost ones to where they lead), else the ring's last arena
    (its next closes the ring early)."""
    lost_next = {_next_of(mem, layout, a): a for a in lost}
    culprit, skipped = ring[-1], lost[0]
    for arena in ring:
        nxt = _next_of(mem, layout, arena)
        if nxt in lost_next:
            culprit, skipped = arena, lost_next[nxt]
            break
    found = _next_of(mem, layout, culprit)
    where = "arena 0 (main_arena)" if culprit == ring[0] else f"arena {ring.index(culprit)}"
    return Finding(Severity.ERROR, culprit, where, (
        f"arena.next is {found:#x}: the ring closes after {len(ring)} arena(s), skipping {len(lost)} arena(s) "
        f"whose heaps say they exist (such as {skipped:#x}); the ring is broken"), Kind.ARENA_RING,
        expected=f"{skipped:#x} or an arena before it", found=f"{found:#x}")


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
                ring_findings = [_shortcut(mem, disc.layout, ring, lost)]
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
    fill_seen = _fill_from_tcaches(mem, disc, threads)
    fill = mp.get("tcache_count") if mp else fill_seen
    decoded_threads = []
    for regs in sorted(threads, key=lambda t: t.number):
        thread, t_findings = _thread(mem, disc, regs, fill)
        decoded_threads.append(thread)
        findings.extend(t_findings)
    state = HeapState(target=target, glibc_version=disc.version, glibc_label=disc.version_label,
                      heap_max_size=disc.heap_max_size,
                      layout_name=disc.layout.name,
                      main_arena=disc.main_arena, mp=mp, arenas=tuple(arenas), threads=tuple(decoded_threads),
                      facts=tuple(facts), findings=tuple(findings), lists_stopped=stopped is not None)
    if walk_chunks and regions is not None and arenas and arenas[0].is_main and arenas[0].noncontiguous:
        arenas[0] = _with_main_regions(mem, disc, arenas[0], arenas, regions)
        state = dataclasses.replace(state, arenas=tuple(arenas))
    if stopped is not None:
        state.findings_extra.append(stopped)
        if last_words is not None:
            state.findings_extra.append(last_words)
        if walk_chunks:
            _leave_unwalked(state, state.arenas)
        return state
    state = _scan_for_tcaches(mem, disc, state)
    state = dataclasses.replace(state, findings=_crash_findings(mem, state, disc, threads, last_words)
                                + state.findings)
    if walk_chunks:
        walk_arenas(mem, disc.layout, state, progress)
        if regions is not None and not state.interrupted:
            state.mmapped.extend(_mmapped(mem, disc, state, regions))
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
