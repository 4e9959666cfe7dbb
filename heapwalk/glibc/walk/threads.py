"""Each thread's arena and tcache, read through its TLS; and the tcaches of threads whose TLS the core lacks,
found by scanning the arenas."""

from __future__ import annotations

import dataclasses
import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.walk.chunks import Listing
from heapwalk.glibc.locate.discovery import Discovery
from heapwalk.glibc.walk.lists import walk_tcache
from heapwalk.glibc.model import HeapState, Thread, thread_numbers
from heapwalk.glibc.walk.tcachescan import scan_tcaches
from heapwalk.arch import DEFAULT, Architecture
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.inferior.threads import ThreadRegs

__all__ = ["decode_thread", "scan_for_tcaches", "fill_from_tcaches"]


def _tls_intact(mem: Memory, thread_pointer: int, arch: Architecture) -> bool:
    """Does the core hold the thread's TLS?  Its thread control block looks whole (`Architecture.tcb_intact`);
    a stack written as zeros (where a thread's TLS lives) or left out fails this."""
    try:
        return arch.tcb_intact(lambda at: u64(mem, at), thread_pointer)
    except ReadError:
        return False


def decode_thread(mem: Memory, disc: Discovery, regs: ThreadRegs, fill_count: int | None,
                  arch: Architecture = DEFAULT) -> tuple[Thread, list[Finding]]:
    findings: list[Finding] = []
    arena = tcache_ptr = None
    tcache = None
    if regs.thread_pointer and not _tls_intact(mem, regs.thread_pointer, arch):
        return Thread(regs.number, regs.lwp, regs.thread_pointer, None, None, None, tls_lost=True, name=regs.name), findings
    if regs.thread_pointer:
        for attr, name in (("thread_arena_tpoff", "thread_arena"), ("tcache_tpoff", "tcache")):
            tpoff = getattr(disc, attr)
            if tpoff is None:
                continue
            try:
                value = u64(mem, regs.thread_pointer + tpoff)
            except ReadError:
                findings.append(Finding(Severity.WARNING, regs.thread_pointer + tpoff, f"thread {regs.number}",
                                        f"cannot read the {name} TLS variable", Kind.UNMAPPED))
                continue
            if name == "tcache":
                tcache_ptr = value
            else:
                arena = value
    if tcache_ptr and not disc.is_libc_address(tcache_ptr):
        tcache = walk_tcache(mem, disc.layout, tcache_ptr, fill_count)
    return (Thread(regs.number, regs.lwp, regs.thread_pointer or 0, arena or None, tcache_ptr or None, tcache, name=regs.name),
            findings)


def scan_for_tcaches(mem: Memory, disc: Discovery, state: HeapState, arch: Architecture = DEFAULT) -> HeapState:
    """STATE with the tcaches found by scanning the arenas, when some threads' tcaches cannot be reached
    through TLS (TLS missing from the core, or tcache's TLS offset unknown; threads of ARCH); else STATE as it
    is."""
    lost = [t for t in state.threads if t.tls_lost]
    unreachable = disc.tcache_tpoff is None and any(t.thread_pointer for t in state.threads)
    notes: tuple[Finding, ...] = ()
    if lost:
        notes += (_tls_lost(mem, lost, arch),)
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


def _tls_lost(mem: Memory, lost: list[Thread], arch: Architecture) -> Finding:
    """One warning for the threads whose TLS the core lacks, at the first one's thread control block."""
    first = lost[0].thread_pointer
    try:
        seen = f"{u64(mem, first):#x}"
    except ReadError:
        seen = "nothing (not in the core)"
    names = thread_numbers([t.number for t in lost])
    return Finding(Severity.WARNING, first, f"thread{'s' if len(lost) > 1 else ''} {names}",
                   f"the core holds no copy of the TLS of {len(lost)} thread{'s' if len(lost) > 1 else ''} "
                   f"({names}): the thread control block at ${arch.thread_pointer} ({first:#x} for thread "
                   f"{lost[0].number}) reads {seen}, not {arch.tcb_holds}, as when gcore writes threads' stacks as zeros or leaves "
                   "them out; their arenas and tcaches are unknown", Kind.TLS_LOST, f"{first:#x}", seen)


def fill_from_tcaches(mem: Memory, disc: Discovery, threads: list[ThreadRegs]) -> int | None:
    """mp_.tcache_count as the tcache structs show it, for glibc 2.42+ whose num_slots count down from it:
    every bin starts at the fill count, so the largest num_slots of any thread's tcache is it (a tcache whose
    every bin holds something shows less).  None when no tcache is readable or counts go up."""
    layout = disc.layout
    if not layout.tcache_counts_down or disc.tcache_tpoff is None:
        return None
    best = None
    for regs in threads:
        try:
            pointer = u64(mem, regs.thread_pointer + disc.tcache_tpoff) if regs.thread_pointer else 0
            if not pointer or pointer % 16 or disc.is_libc_address(pointer):
                continue
            slots = struct.unpack_from(f"<{layout.tcache_bins}H", mem.read(pointer, 2 * layout.tcache_bins))
        except ReadError:
            continue
        best = max(best or 0, max(slots))
    return best
