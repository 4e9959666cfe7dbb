"""mimalloc's segments as the strips of a heap map (`view.HeapStrip`): one strip per segment, its header slices,
then each page and free span in address order.  A page is drawn as the bytes of its blocks the program holds
(then those the leak scan found leaked), its free blocks (on its lists), what it reserved but has not cut into
blocks yet, and what it loses to rounding: the bytes are exact, their order inside the page is not.  A free span
is what a purge decommits once its delay has passed; a huge segment's tail is the system's rounding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.inferior.residency import Residency
from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.mimalloc.bits import bit_runs
from heapwalk.mimalloc.decode import MiSegment, MiState
from heapwalk.common.view import HeapStrip

__all__ = ["segment_strips", "BAND", "KIND", "page_runs", "strip_of", "leaked_bytes"]

for _kind in (MapKind("mi_free", "free blocks (page lists)", "#aec7e8", "f", 131, FREE),
              MapKind("mi_uncut", "reserved in a page, not cut into blocks yet", "#dbdb8d", "u", 132, FREE),
              MapKind("mi_rounding", "lost to rounding", "#c7c7c7", "z", 134),
              MapKind("mi_span", "free spans (decommitted after the purge delay)", "#f7b6d2", "p", 141, FREE, True)):
    add_map_kind(_kind)
KIND = {name: i for i, name in enumerate(MAP_KINDS)}

#: what a heap map calls the runs a purge decommits
BAND = "a purge decommits"


def segment_strips(state: MiState, owner_of: dict[int, tuple[int, str]], residency: Residency | None = None,
                   leaked: np.ndarray | None = None) -> list[HeapStrip]:
    """Each live segment as a strip (OWNER_OF: segment -> its owner's number and name); the blocks at LEAKED
    (the leak scan's) drawn as leaked."""
    lost = leaked_bytes(state, leaked)
    out = []
    if state.arenas_whole:
        out += [_arena_strip(state, a, owner_of, lost) for a in state.discovery.arenas]
    for seg in sorted(state.live(), key=lambda s: s.address):
        number, name = owner_of.get(seg.address, (0, ""))
        if seg.arena is not None and state.arenas_whole:
            continue
        what = state.huge_label if seg.huge else ""
        out.append(_strip(seg, number, f"{name} {state.unit} at {seg.address:#x}{what}", lost))
    if residency is None:
        return out
    known = residency.covering([(s.start, s.end) for s in out])
    return [replace(s, resident=known.within(s.start, s.end).astype(np.uint64)) for s in out]


def leaked_bytes(state: MiState, leaked: np.ndarray | None) -> dict[int, int]:
    """Page address -> the bytes of its blocks at LEAKED."""
    if leaked is None or not len(leaked):
        return {}
    pages = sorted(state.pages(), key=lambda p: p.start)
    starts = np.array([p.start for p in pages], dtype=np.uint64)
    rows = np.searchsorted(starts, np.asarray(leaked, dtype=np.uint64), side="right") - 1
    out: dict[int, int] = {}
    for row in rows[rows >= 0].tolist():
        page = pages[row]
        out[page.address] = out.get(page.address, 0) + page.block_size
    return out


def page_runs(page, at: int, lost: dict[int, int]) -> list[tuple[int, int, int]]:
    """PAGE's runs from AT (its first slice): its header, its blocks by use, what it has not cut, its rounding."""
    runs = []
    leaked = min(lost.get(page.address, 0), page.in_use * page.block_size)
    for length, kind in ((page.start - at, KIND["overhead"]),
                         (page.in_use * page.block_size - leaked, KIND["in_use"]), (leaked, KIND["leaked"]),
                         (page.free_cut * page.block_size, KIND["mi_free"]),
                         ((page.room - page.cut) * page.block_size, KIND["mi_uncut"])):
        if length > 0:
            runs.append((at, min(at + length, page.end), kind))
            at = min(at + length, page.end)
    if page.end > at:
        runs.append((at, page.end, KIND["mi_rounding"]))
    return runs


def strip_of(number: int, label: str, start: int, end: int, runs: list[tuple[int, int, int]],
             spans: list[tuple[int, int]]) -> HeapStrip:
    """A strip of RUNS (sorted here) from START to END, SPANS the runs a purge decommits."""
    runs.sort()
    starts = np.array([a for a, _, _ in runs], dtype=np.uint64)
    ends = np.array([b for _, b, _ in runs], dtype=np.uint64)
    kinds = np.array([k for _, _, k in runs], dtype=np.uint8)
    return HeapStrip(number, label, start, end, starts, ends, kinds,
                     trimmable=np.array(spans, dtype=np.uint64).reshape(-1, 2), band=BAND)


def _arena_strip(state: MiState, arena, owner_of: dict, lost: dict[int, int]) -> HeapStrip:
    """mimalloc 3: ARENA's strip: its own slices (description, bitmaps, meta pages), its pages, its free slices
    (what a purge decommits once its delay has passed)."""
    end = arena.start + arena.reserved
    number, _ = owner_of.get("arenas", (0, ""))
    runs = [(arena.start, end, KIND["overhead"])]
    pages = [s for s in state.live() if s.arena is arena]
    for seg in pages:
        runs += page_runs(seg.pages[0], seg.address, lost)
    spans = [(arena.start + a * arena.block_size, arena.start + b * arena.block_size)
             for a, b in bit_runs(arena.free)]
    runs += [(a, b, KIND["mi_span"]) for a, b in spans]
    runs = _cut_under(runs)
    owners = len({owner_of.get(s.address, (0, ""))[0] for s in pages})
    return strip_of(number, f"arena {arena.id} at {arena.start:#x} ({len(pages)} pages of {owners} owners)",
                    arena.start, end, runs, spans)


def _cut_under(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """RUNS with the first (the whole arena, its own) cut to the gaps the others leave."""
    base, rest = runs[0], sorted(runs[1:])
    out, at = [], base[0]
    for a, b, k in rest:
        if a > at:
            out.append((at, a, base[2]))
        at = max(at, b)
    if base[1] > at:
        out.append((at, base[1], base[2]))
    return out + rest


def _strip(seg: MiSegment, number: int, label: str, lost: dict[int, int]) -> HeapStrip:
    """SEG's strip: header, pages by use, free spans, the system's rounding after it."""
    runs: list[tuple[int, int, int]] = [(seg.address, seg.address + seg.info_slices * 65536, KIND["overhead"])]
    for page in seg.pages:
        runs += page_runs(page, seg.address + page.index * 65536, lost)
    spans = [(seg.address + sp.index * 65536, seg.address + (sp.index + sp.slices) * 65536) for sp in seg.spans]
    runs += [(a, b, KIND["mi_span"]) for a, b in spans]
    end = seg.address + seg.reserved
    last = max((b for _, b, _ in runs), default=seg.address)
    if end > last:
        runs.append((last, end, KIND["overhead"]))
    return strip_of(number, label, seg.address, end, runs, spans)
