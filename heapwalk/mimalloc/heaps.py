"""mimalloc's heaps: the main heap, each thread's default heap (its thread-local pointer), every heap a page
names, and every heap on those heaps' threads' lists; each with the thread it belongs to (its thread pointer)."""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.layout import MiLayout, queue_shape

__all__ = ["MiHeap", "find_heaps", "is_meta_theap", "visit_order", "HEAP"]

HEAP = Kind("mi_heap", "heap unreadable")
_MAX_PAGES = 1 << 20


@dataclass
class MiHeap:
    """One heap: the thread it belongs to (its thread pointer), its thread data (the system memory its heap and
    thread-local data live in; 0 for the main heap, in the library's data), its pages."""

    address: int
    thread_id: int
    tld: int
    backing: bool               # its thread's backing (default) heap
    main: bool
    pages: int = 0
    delayed: int = 0            # blocks on its delayed-free list
    meta: bool = False          # 3.6: the theap mimalloc allocates its own data with (theaps, thread data)


def find_heaps(mem: Memory, found, segments: list, threads, findings: list[Finding]) -> list[MiHeap]:
    """The heaps: the main heap, each thread's default heap (its thread-local pointer), every heap a page names,
    and every heap on those heaps' threads' lists."""
    lay = found.layout
    wanted = [found.main_heap]
    for lo, hi in found.data_unread:
        findings.append(Finding(Severity.ERROR, lo, "mimalloc data", f"{hi - lo} bytes of mimalloc's data from "
                                f"{lo:#x} cannot be read: what it keeps there (its cache of thread data, its "
                                "tables) is not seen, and its figures may miss it", HEAP))
    if found.tpoff_unread is not None:
        at, why = found.tpoff_unread
        findings.append(Finding(Severity.WARNING, at, "mi_heap_t", f"each thread's default heap was not read: {why}; "
                                "heaps are found through their pages only (a thread's heap that holds none is not "
                                "listed)", HEAP))
    if found.default_tpoff is not None:
        for t in threads:
            if t.thread_pointer:
                at = (t.thread_pointer + found.default_tpoff) & ((1 << 64) - 1)
                try:
                    wanted.append(u64(mem, at))
                except ReadError as exc:
                    findings.append(Finding(Severity.WARNING, at, "mi_heap_t", f"the default heap pointer of the "
                                            f"thread at {t.thread_pointer:#x} cannot be read ({exc}): its heap is listed "
                                            "only if it holds pages", HEAP))
    counts: dict[int, int] = {}
    v3 = getattr(lay, "family", 2) == 3         # an abandoned page keeps its heap's address (from 3.2): not its
    for seg in segments:                        # heap's any more, which may be gone
        for page in seg.pages if seg.live and (seg.thread_id or not v3) else ():
            counts[page.heap] = counts.get(page.heap, 0) + 1
    wanted += [h for h in counts if h]
    out: dict[int, MiHeap] = {}
    for at in wanted:
        if at in out or not at:
            continue
        try:
            tld = u64(mem, at + lay.heap_tld)
            first = u64(mem, tld + lay.tld_heaps) if tld else 0
        except ReadError:
            findings.append(Finding(Severity.ERROR, at, "mi_heap_t", "the heap cannot be read", HEAP))
            continue
        for heap in _chain(mem, lay, first or at):
            if heap not in out:
                out[heap] = _heap(mem, lay, heap, found.main_heap)
    for heap in out.values():
        heap.pages = counts.get(heap.address, 0)
    return sorted(out.values(), key=lambda h: (not h.main, h.address))


def _chain(mem: Memory, lay: MiLayout, first: int) -> list[int]:
    """The heaps of a thread's list from FIRST (next links), as far as it can be read, without loops."""
    out, at = [], first
    while at and at not in out and len(out) < 1 << 12:
        out.append(at)
        try:
            at = u64(mem, at + lay.heap_next)
        except ReadError:
            break
    return out


def _heap(mem: Memory, lay: MiLayout, at: int, main: int) -> MiHeap:
    try:
        tld = u64(mem, at + lay.heap_tld)
        backing = bool(tld) and u64(mem, tld + lay.tld_heap_backing) == at
        thread = u64(mem, at + lay.heap_thread_id) if lay.heap_thread_id is not None else \
            u64(mem, tld + lay.tld_thread_id) if tld else 0
        return MiHeap(at, thread, tld, backing, at == main, meta=bool(tld) and is_meta_theap(mem, lay, tld, at))
    except ReadError:
        return MiHeap(at, 0, 0, False, at == main)


def is_meta_theap(mem: Memory, lay, tld: int, heap: int) -> bool:
    """Whether HEAP (of thread data TLD) is the theap mimalloc allocates its own data with (3.6: its
    subprocess names it)."""
    meta = getattr(lay, "sub_theap_meta", None)
    return meta is not None and u64(mem, u64(mem, tld + lay.tld_subproc) + meta) == heap


def visit_order(mem: Memory, lay: MiLayout, heap: int) -> list[tuple[int, bool]]:
    """HEAP's pages as mi_collect visits them (its queues in turn, the full queue last, each from its first
    page), each with whether the heap retired it (its retire count set), as far as they can be read."""
    out, seen = [], set()
    q = queue_shape(lay)[0]
    for n in range(lay.bin_huge + 2):
        try:
            at = u64(mem, heap + lay.heap_pages + 8 * q * n)
            while at and at not in seen and len(seen) < _MAX_PAGES:
                seen.add(at)
                out.append((at, mem.read(at + lay.page_flags + 1, 1)[0] >> 1 != 0))
                at = u64(mem, at + lay.page_next)
        except ReadError:
            continue
    return out
