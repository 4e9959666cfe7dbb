"""The JSON documents heapwalk writes (schema in docs/json.md), each built here, and the reader that takes a
report back for `heapwalk diff`.

Bump SCHEMA_VERSION on any change that renames or removes a field or changes
its meaning; adding a field keeps the version.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from heapwalk.analysis.diff import ArenaTotals, Diff, Signatures
from heapwalk.analysis.report import Bucket
from heapwalk.errors import HeapwalkError
from heapwalk.glibc.model import Arena, BinKind, BinList, HeapState, Tcache, Thread
from heapwalk.findings import Finding
from heapwalk.output.inusedoc import in_use_json, leaks_totals_json
from heapwalk.output.notes import partial_sentences

__all__ = ["SCHEMA_VERSION", "KINDS", "DocumentError", "state_to_json", "report_document", "check_document",
           "chunk_document", "ChunksWriter", "header", "read_snapshot", "read_signatures", "diff_json", "dump"]

SCHEMA_VERSION = 1
KINDS = ("fast", "unsorted", "small", "large")


def _finding(f: Finding) -> dict[str, Any]:
    return {"severity": f.severity.value, "kind": f.kind.ident, "address": f.address, "structure": f.structure,
            "message": f.message, "expected": f.expected, "found": f.found}


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
                      "decoded_as": "%d.%d" % state.glibc_version},
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
        "findings": [_finding(f) for f in acc.findings],
    }


def trim_json(t) -> dict[str, Any]:
    """What malloc_trim(0) would release from an arena (see heapwalk/glibc/trim.py)."""
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
        "findings": [_finding(f) for f in a.findings],
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
        "findings": [_finding(f) for f in tc.findings],
    }
    if tc.arena is not None:
        out["arena"] = tc.arena
    return out


def _thread_json(t: Thread) -> dict[str, Any]:
    return {"number": t.number, "lwp": t.lwp, "fs_base": t.fs_base, "arena": t.arena,
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
        "findings": [_finding(f) for f in (*state.findings, *state.loose_findings())],
    }


def report_document(state: HeapState, rep, notes) -> dict[str, Any]:
    """'heapwalk report --json': the whole state's document with the report (and its partial NOTES) in it."""
    document = state_to_json(state)
    document["report"] = {**report_json(rep), "partial": partial_sentences(notes)}
    return document


def report_json(rep) -> dict[str, Any]:
    """The report's numbers and verdict (see heapwalk/analysis/report.py)."""
    return {
        "arenas": [{"number": a.number, "address": a.address, "kind": a.kind, "threads": a.threads, "heaps": a.heaps,
                    "system": a.system, "in_use": a.in_use, "free": dict(a.free), "top": a.top, "overhead": a.overhead,
                    "trim": a.reclaim, "balanced": a.balanced, "rss": a.resident, "free_resident": a.free_resident,
                    "top_resident": a.top_resident} for a in rep.arenas],
        "totals": {"system": rep.system, "in_use": rep.in_use, "free": rep.free, "top": rep.top,
                   "overhead": rep.overhead, "trim": rep.trim, "rss": rep.resident,
                   "free_resident": rep.idle_resident},
        "residency": rep.residency or None,
        "mmapped": {"count": rep.mmapped_count, "bytes": rep.mmapped_bytes, "resident": rep.mmapped_resident},
        "histogram": [{"low": b.low, "high": b.high, "count": b.count, "bytes": b.bytes} for b in rep.histogram],
        "histogram_by_arena": {str(n): [{"low": b.low, "high": b.high, "count": b.count, "bytes": b.bytes}
                                        for b in buckets] for n, buckets in rep.per_arena.items()},
        "by_glibc_class": [{"class": name, "count": c, "bytes": b} for name, c, b in rep.classes],
        "free_chunks": rep.free_chunks,
        "free_listed": rep.free_listed,
        "lists_match_walk": rep.lists_match_walk,
        "largest_free": rep.largest_free,
        "fragmentation": round(rep.fragmentation, 4),
        "trim_total": rep.trim_total,
        "trim_kept": rep.trim_kept,
        "arena_limit": rep.arena_limit,
        "arenas_on_free_list": rep.arenas_on_free_list,
        "in_use": in_use_json(rep.in_use_groups),
        "leaks": leaks_totals_json(rep.leaks),
        "verdict": rep.verdict,
    }


class DocumentError(HeapwalkError, ValueError):
    """A JSON document that is not what a reader expects; the message says what is missing."""


def read_snapshot(doc: dict[str, Any]) -> list[ArenaTotals]:
    """The arenas of a 'heapwalk report --json' document (`report_document`), read back for the diff and
    the capture's resident-memory lines."""
    if not isinstance(doc, dict) or not isinstance(doc.get("report"), dict):
        raise DocumentError("it has no report: write it with 'heapwalk report --json FILE'")
    heaps = {a["address"]: tuple((h["address"], h["size"]) for h in a["heaps"]) for a in doc.get("arenas", [])}
    by_arena = doc["report"].get("histogram_by_arena", {})
    in_use = doc["report"].get("in_use")
    try:
        used = in_use["histogram_by_arena"] if in_use else None
        return [ArenaTotals(r["address"], r["number"], r.get("system") or 0, r.get("in_use") or 0,
                            sum((r.get("free") or {}).values()), r.get("top") or 0,
                            _buckets(by_arena.get(str(r["number"]), [])), r.get("trim") or 0,
                            heaps.get(r["address"], ()), r.get("rss"),
                            None if used is None else _buckets(used.get(str(r["number"]), [])))
                for r in doc["report"]["arenas"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise DocumentError(f"its report is not heapwalk's ({type(exc).__name__}: {exc})") from None


def _buckets(rows: list[dict[str, Any]]) -> tuple[Bucket, ...]:
    return tuple(Bucket(h["low"], h["high"], h["count"], h["bytes"]) for h in rows)


def read_signatures(doc: dict[str, Any]) -> Signatures | None:
    """The chunks in use by signature of a 'heapwalk report --json' document, or None when its report has
    none (no leak scan, or another allocator)."""
    in_use = (doc.get("report") or {}).get("in_use") if isinstance(doc, dict) else None
    if not in_use or in_use.get("by_signature") is None:
        return None
    try:
        return Signatures({g["signature"]: (g["count"], g["bytes"]) for g in in_use["by_signature"]},
                          bool(in_use.get("signatures_truncated")))
    except (KeyError, TypeError, AttributeError) as exc:
        raise DocumentError(f"its signatures are not heapwalk's ({type(exc).__name__}: {exc})") from None


def diff_json(d: Diff) -> dict[str, Any]:
    """'heapwalk diff --json': each arena's figures in A and B and their growth, the size classes whose free
    pieces and chunks in use changed, the totals, which arenas grew, and the signatures whose chunks in use
    changed."""
    arenas = []
    for e in d.arenas:
        entry: dict[str, Any] = {"address": e.address, "number": e.number, "status": e.status}
        for figure in e.figures:
            entry[figure] = list(e.figures[figure])
            entry[figure + "_growth"] = e.growth(figure)
        entry["free_classes"] = [_class_json(c) for c in e.free_classes]
        entry["in_use_classes"] = [_class_json(c) for c in e.in_use_classes]
        arenas.append(entry)
    return {"arenas": arenas, "growth": d.growth, "grew": d.grew, "restarted": d.restarted,
            "arena_counts": list(d.arena_counts),
            "signatures": [{"signature": c.name, "count": list(c.count), "bytes": list(c.bytes),
                            "bytes_growth": c.bytes_growth} for c in d.signatures]}


def _class_json(c) -> dict[str, Any]:
    return {"low": c.low, "high": c.high, "count": list(c.count), "bytes": list(c.bytes),
            "bytes_growth": c.bytes_growth}


def dump(document: dict[str, Any], path: str) -> None:
    """Writes DOCUMENT to PATH ('-' is not supported inside gdb: give a file), laid out by `layout`."""
    with open(path, "w", encoding="utf-8") as fh:
        for piece in layout(document):
            fh.write(piece)
        fh.write("\n")


#: how deep `layout` puts each member on a line of its own
LAID_OUT = 3


def layout(value: Any, depth: int = 0):
    """VALUE as JSON, in pieces: objects and arrays down to LAID_OUT levels a member a line (indented one space
    a level), anything deeper on one line.  Python's json module indents only in Python, ten times slower than
    its compact C encoder: a report of millions of listed chunks took seconds to write."""
    if depth >= LAID_OUT or not isinstance(value, (dict, list)) or not value:
        yield json.dumps(value)
        return
    inner = "\n" + " " * (depth + 1)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    yield opening
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for i, (key, member) in enumerate(items):
        yield ("," if i else "") + inner + (json.dumps(_key(key)) + ": " if isinstance(value, dict) else "")
        yield from layout(member, depth + 1)
    yield "\n" + " " * depth + closing


def _key(key: Any) -> str:
    """An object's key as json writes it: a string as it is, a number or a constant as its JSON text."""
    return key if isinstance(key, str) else json.dumps(key)


def check_document(state: HeapState, result, checked: dict[str, int]) -> dict[str, Any]:
    """'heapwalk check --json': whether the heap is clean, the counts, and every finding."""
    return {**header(state), "clean": result.clean, "errors": len(result.errors),
            "warnings": len(result.warnings), "by_kind": result.by_kind(), "checked": checked,
            "partial": partial_sentences(result.partial), "findings": [_finding(f) for f in result.findings]}


def together(documents: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """One command's document for a process with one allocator or more, from each one's (name, key, document),
    the program's allocator first: the first document, holding each other's under its key (without the fields
    the first already has), and "allocators" naming them all."""
    (_, _, first), *rest = documents
    if not rest:
        return first
    out = {**first, "allocators": [name for name, _, _ in documents]}
    for name, key, doc in rest:
        out[key] = {"allocator": name, **{k: v for k, v in doc.items() if k not in ("schema_version", "target")}}
    return out


def allocator_parts(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each allocator's part of a document (`together`): (its name, "" for a document that names none, and its
    document), the program's allocator first."""
    beside = [(v["allocator"], v) for v in doc.values() if isinstance(v, dict) and "allocator" in v]
    return [(doc.get("allocator") or "", doc), *beside]
