"""glibc's JSON documents (schema in docs/json.md): the state's (arenas, bins, tcaches, threads, discovery),
the report's, the check's, a chunk's and the chunks' listing, written a chunk at a time."""

from __future__ import annotations

import json
from typing import Any, Iterable

from heapwalk.glibc.model import Arena, BinKind, BinList, HeapState, Tcache, Thread
from heapwalk.output.jsondoc import SCHEMA_VERSION, dump, finding_json, report_json
from heapwalk.glibc.show.notes import partial_sentences

__all__ = ["KINDS", "state_to_json", "report_document", "check_document", "chunk_document", "ChunksWriter",
           "header", "dump"]

KINDS = ("fast", "unsorted", "small", "large")


def bin_json(b: BinList) -> dict[str, Any]:
    """One free list: counts and masked sizes, plus malloc_info's raw size-field figures."""
    raw = b.raw_sizes
    return {
        "index": b.index,
        "count": b.count,
        "bytes": b.total,
        "min_size": b.min_size,
        "max_size": b.max_size,
        "size_field_total": sum(raw),
        "size_field_min": min(raw) if raw else 0,
        "size_field_max": max(raw) if raw else 0,
        "complete": b.complete,
        "chunks": list(b.chunks),
    }


def chunk_json(arena: Arena, chunk) -> dict[str, Any]:
    return {"address": chunk.address, "size": chunk.size, "flags": chunk.flags, "state": chunk.state.value,
            "arena": arena.address, "heap": chunk.extent}


def header(state: HeapState) -> dict[str, Any]:
    """The fields every document starts with: schema, target, the allocator, glibc and main_arena."""
    return {"schema_version": SCHEMA_VERSION, "target": state.target, "allocator": "glibc",
            "glibc": {"version": state.version_text, "layout": state.layout_name,
                      "decoded_as": "%d.%d" % state.glibc_version, "page_size": state.page_size},
            "main_arena": state.main_arena}


def chunks_document(state: HeapState, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """'heapwalk chunks --json': the header fields of the main document and the matching chunks."""
    return {**header(state), "chunks": rows}


def chunk_document(state: HeapState, address: int, located=None, mmapped=None,
                   listed: str | None = None, reach: str | None = None) -> dict[str, Any]:
    """'heapwalk chunk ADDRESS --json': the chunk holding ADDRESS (a `chunkinfo.Located` in a heap, or a
    mmapped chunk and the list that holds it, if any) with its list and neighbours; for a chunk in use, REACH:
    whether the leak scan reached it and how."""
    if located is not None:
        c = located.chunk
        chunk = {**chunk_json(located.arena, c), "listed": located.listed, "mmapped": False, "span": c.size}
        neighbours = {label: None if n is None else chunk_json(located.arena, n)
                      for label, n in (("previous", located.previous), ("next", located.following))}
    else:
        chunk = {"address": mmapped.address, "size": mmapped.size, "flags": 2,
                 "state": "in_use" if listed is None else "tcache", "arena": None, "heap": None, "listed": listed,
                 "mmapped": True, "span": mmapped.span}
        neighbours = {"previous": None, "next": None}
    if reach is not None:
        chunk["reached"] = reach.startswith("reached")
        chunk["reach"] = reach
    return {**header(state), "address": address, "offset": address - chunk["address"], "chunk": chunk,
            **neighbours}


class ChunksWriter:
    """Writes `chunks_document` to PATH a chunk at a time, so millions of chunks take no memory."""

    def __init__(self, path: str, state: HeapState):
        head = json.dumps(chunks_document(state, []), indent=None)
        self.file = open(path, "w", encoding="utf-8")
        self.file.write(head[:head.rindex("[") + 1] + "\n")
        self.tail = head[head.rindex("]"):]
        self.count = 0

    def add(self, arena: Arena, chunk) -> None:
        self.file.write(("," if self.count else "") + json.dumps(chunk_json(arena, chunk)) + "\n")
        self.count += 1

    def close(self) -> None:
        self.file.write(self.tail + "\n")
        self.file.close()


def account_json(acc) -> dict[str, Any]:
    """An arena's accounting: bytes and chunk counts per state, overhead, and whether it balances."""
    return {
        "system_mem": acc.system_mem,
        "bytes": {s.value: n for s, n in acc.bytes.items()},
        "chunks": {s.value: n for s, n in acc.counts.items()},
        "overhead": acc.overhead,
        "unwalked": acc.unwalked,
        "free": acc.free,
        "balanced": acc.balanced,
        "findings": [finding_json(f) for f in acc.findings],
    }


def trim_json(t) -> dict[str, Any]:
    """What malloc_trim(0) would release from an arena (see heapwalk/glibc/walk/trim.py)."""
    return {"total": t.total, "resident": t.resident, "madvise": t.madvise, "madvise_resident": t.madvise_resident,
            "systrim": t.systrim, "systrim_resident": t.systrim_resident, "kept_free": t.kept_free,
            "kept": dict(t.kept)}


def _heap_json(a: Arena, h, heap_max: int) -> dict[str, Any]:
    """A heap with its three sizes: in use by the arena, made read-write so far, and reserved."""
    out = {"address": h.address, "size": h.size, "mprotect_size": h.mprotect_size, "prev": h.prev,
           "pagesize": h.pagesize}
    if not a.is_main:
        out.update(reservation=heap_max, mapped_unused=max(0, h.mprotect_size - h.size),
                   reserved_unmapped=max(0, heap_max - h.mprotect_size))
    return out


def _arena_json(a: Arena, kinds: Iterable[str], acc=None, trim=None, heap_max: int = 64 << 20) -> dict[str, Any]:
    kinds = set(kinds)
    bins: dict[str, Any] = {}
    if "fast" in kinds:
        bins["fast"] = [bin_json(b) for b in a.fastbins]
    if "unsorted" in kinds:
        bins["unsorted"] = bin_json(a.unsorted)
    if "small" in kinds:
        bins["small"] = [bin_json(b) for b in a.bins if b.kind is BinKind.SMALL and b.count]
    if "large" in kinds:
        bins["large"] = [bin_json(b) for b in a.bins if b.kind is BinKind.LARGE and b.count]
    return {
        "number": a.number,
        "address": a.address,
        "kind": a.kind,
        "mutex": a.mutex,
        "flags": a.flags,
        "have_fastchunks": a.have_fastchunks,
        "attached_threads": a.attached_threads,
        "on_free_list": a.on_free_list,
        "system_mem": a.system_mem,
        "max_system_mem": a.max_system_mem,
        "top": {"address": a.top, "size": a.top_size},
        "last_remainder": a.last_remainder,
        "next": a.next,
        "heaps": [_heap_json(a, h, heap_max) for h in a.heaps],
        "bins": bins,
        "accounting": None if acc is None else account_json(acc),
        "trim": None if trim is None else trim_json(trim),
        "findings": [finding_json(f) for f in a.findings],
    }


def _tcache_bin_json(b) -> dict[str, Any]:
    out = {"index": b.index, "chunk_size": b.chunk_size, "count": b.count, "bytes": b.total,
           "entries": list(b.entries), "complete": b.complete}
    if b.sizes:
        out["sizes"] = list(b.sizes)
    return out


def _tcache_json(tc: Tcache) -> dict[str, Any]:
    out = {
        "address": tc.address,
        "count": tc.count,
        "bytes": tc.total,
        "bins": [_tcache_bin_json(b) for b in tc.bins],
        "findings": [finding_json(f) for f in tc.findings],
    }
    if tc.arena is not None:
        out["arena"] = tc.arena
    return out


def _thread_json(t: Thread) -> dict[str, Any]:
    return {"number": t.number, "lwp": t.lwp, "name": t.name, "fs_base": t.thread_pointer, "arena": t.arena,
            "tcache_pointer": t.tcache_pointer, "tcache": None if t.tcache is None else _tcache_json(t.tcache),
            "tls_intact": not t.tls_lost}


def state_to_json(state: HeapState, arenas: Iterable[int] | None = None, kinds: Iterable[str] = KINDS,
                  threads: Iterable[int] | None = None) -> dict[str, Any]:
    """The JSON document; ARENAS (addresses), KINDS and THREADS (gdb numbers) filter it."""
    wanted_arenas = set(arenas) if arenas is not None else None
    wanted_threads = set(threads) if threads is not None else None
    facts = {f.name: {"value": f.value, "found_by": f.found_by} for f in state.facts}
    return {
        **header(state),
        "discovery": facts,
        "mp": None if state.mp is None else {"address": state.mp.address, **state.mp.values},
        "arenas": [_arena_json(a, kinds, state.accounts.get(a.address), state.trims.get(a.address),
                               state.heap_max_size)
                   for a in state.arenas
                   if wanted_arenas is None or a.address in wanted_arenas],
        "threads": [_thread_json(t) for t in state.threads
                    if wanted_threads is None or t.number in wanted_threads],
        "scanned_tcaches": [_tcache_json(tc) for tc in state.scanned_tcaches],
        "mmapped": None if not state.accounts else {
            "count": len(state.mmapped), "bytes": sum(c.span for c in state.mmapped),
            "chunks": [{"address": c.address, "size": c.size, "span": c.span} for c in state.mmapped]},
        "findings": [finding_json(f) for f in (*state.findings, *state.loose_findings())],
    }


def report_document(state: HeapState, rep, notes) -> dict[str, Any]:
    """'heapwalk report --json': the whole state's document with the report (and its partial NOTES) in it."""
    document = state_to_json(state)
    document["report"] = {**report_json(rep), "partial": partial_sentences(notes)}
    return document


def check_document(state: HeapState, result, checked: dict[str, int]) -> dict[str, Any]:
    """'heapwalk check --json': whether the heap is clean, the counts, and every finding."""
    return {**header(state), "clean": result.clean, "errors": len(result.errors),
            "warnings": len(result.warnings), "by_kind": result.by_kind(), "checked": checked,
            "partial": partial_sentences(result.partial), "findings": [finding_json(f) for f in result.findings]}
