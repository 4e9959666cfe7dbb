"""Where the process's resident memory is, by owner: each allocator's heaps, the threads' stacks, the other
anonymous mappings, shared memory, the files mapped (code and read-only data; writable data), and the rest.

The address space is cut into pieces at every boundary of a mapping and of what an owner claims (an
allocator's heaps, a thread's stack); each piece is measured once (resident bytes from the page map, or the
bytes a core holds) and given to the first claim that covers it, else to its mapping's kind.  The rows
therefore add up to the measure of the whole address space, exactly.  Pure Python and numpy, no gdb.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.common.arrays import distinct

__all__ = ["Claim", "Span", "RssRow", "RssBreakdown", "spans_of", "rss_by_owner", "rss_of_target", "rss_change",
           "KINDS", "IN_CORE"]

#: the measure of a breakdown of a core that does not say which pages were resident: the bytes it holds
IN_CORE = "in the core"
#: the kinds of owner, in the order a breakdown lists them
KINDS = ("heap", "stack", "anonymous", "shared", "file code", "file data", "other")
#: mapping names that are shared memory (POSIX shm, System V, memfd; and MAP_SHARED|MAP_ANONYMOUS memory, which
#: the kernel names "/dev/zero (deleted)")
_SHARED = ("/dev/shm/", "/SYSV", "/memfd:", "memfd:")
#: the kernel's own mappings in every process
_KERNEL = ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]")


@dataclass(frozen=True)
class Span:
    """A stretch of the address space and what it is when no owner claims it: KIND of `KINDS` and NAME (the
    file, "[heap]", "[anon:NAME]", or for an unnamed anonymous mapping "at ADDRESS")."""

    start: int
    end: int
    kind: str
    name: str


@dataclass(frozen=True)
class Claim:
    """Memory an owner holds: KIND "heap" (NAME: the allocator's words, "glibc's arenas") or "stack" (NAME: the
    thread); COUNT: how many of the owner's pieces it stands for (an allocator's adjacent extents, one claim)."""

    start: int
    end: int
    kind: str
    name: str
    count: int = 1


@dataclass(frozen=True)
class RssRow:
    """One owner's bytes: KIND, NAME, the measured bytes, the address space it holds and how many mappings or
    claims it is."""

    kind: str
    name: str
    bytes: int
    mapped: int
    count: int


@dataclass(frozen=True)
class RssBreakdown:
    """The rows by kind and name, their total (the measure of the whole address space) and what was measured
    (MEASURE: "resident", or "present in the core"; SOURCE: where that was learnt)."""

    rows: tuple[RssRow, ...]
    total: int
    measure: str
    source: str

    def of_kind(self, kind: str) -> int:
        """The bytes of every row of KIND."""
        return sum(r.bytes for r in self.rows if r.kind == kind)

    def share(self, value: int) -> float:
        """VALUE as a share of the total (0 when the total is 0)."""
        return value / self.total if self.total else 0.0


def spans_of(mappings: Iterable[tuple[int, int, str, bool]], regions: Iterable[tuple[int, int]] = ()) -> list[Span]:
    """The address space as spans, from MAPPINGS (start, end, name, writable) and the REGIONS a core holds
    that no mapping names (its anonymous memory); where they overlap, the mapping's name wins."""
    spans = []
    for start, end, name, writable in mappings:
        spans.append(Span(start, end, _kind(name, writable), name or _unnamed(start)))
    named = sorted((s.start, s.end) for s in spans)
    for start, end in _without(sorted(regions), named):
        spans.append(Span(start, end, "anonymous", _unnamed(start)))
    return sorted(spans, key=lambda s: (s.start, s.end))


def _unnamed(start: int) -> str:
    """The name of an anonymous mapping that has none: where it starts (each is its own owner)."""
    return f"at {start:#x}"


def _kind(name: str, writable: bool) -> str:
    if not name or name.startswith("[anon") or name == "[heap]":
        return "anonymous"
    if name.startswith("[stack"):
        return "stack"
    if name.startswith(_SHARED):
        return "shared"
    if name.startswith("/dev/zero"):      # the kernel names only shared anonymous memory so (private is unnamed)
        return "shared" if name.endswith("(deleted)") else "anonymous"
    if name in _KERNEL or name.startswith("["):
        return "other"
    return "file data" if writable else "file code"


def rss_by_owner(spans: Sequence[Span], claims: Sequence[Claim],
                 measure: Callable[[np.ndarray, np.ndarray], np.ndarray], what: str, source: str) -> RssBreakdown:
    """SPANS measured piece by piece with MEASURE (starts, ends -> bytes of each), each piece given to the first
    of CLAIMS that covers it (claims of memory no span covers count nowhere), else to its span: rows by owner,
    summing to the measure of the spans."""
    grouped: dict[tuple[str, str], list[tuple[int, int]]] = {}     # by owner, in the order owners first claim
    pieces: dict[tuple[str, str], int] = {}
    for c in claims:
        grouped.setdefault((c.kind, c.name), []).append((c.start, c.end))
        pieces[c.kind, c.name] = pieces.get((c.kind, c.name), 0) + c.count
    merged = {key: _merged(ranges) for key, ranges in grouped.items()}
    edges = [np.array([x for s in spans for x in (s.start, s.end)], dtype=np.uint64)]
    edges += [ranges.reshape(-1) for ranges in merged.values()]
    cut = distinct(np.concatenate(edges))       # uint64: the kernel's vsyscall page lies above 2**63
    lo, hi = cut[:-1], cut[1:]
    owner = np.full(len(lo), -1, dtype=np.int64)          # index into labels
    labels: list[tuple[str, str]] = []
    counts: list[int] = []

    def label(key: tuple[str, str], count: int) -> int:
        labels.append(key)
        counts.append(count)
        return len(labels) - 1

    covered = np.zeros(len(lo), dtype=bool)
    by_span: dict[tuple[str, str], int] = {}
    for s in spans:
        a, b = np.searchsorted(cut, s.start), np.searchsorted(cut, s.end)
        key = (s.kind, s.name)
        if key not in by_span:
            by_span[key] = label(key, 0)
        counts[by_span[key]] += 1
        owner[a:b] = by_span[key]
        covered[a:b] = True
    claimed = np.zeros(len(lo), dtype=bool)
    for key, ranges in merged.items():
        i = label(key, pieces[key])
        first, last = np.searchsorted(cut, ranges[:, 0]), np.searchsorted(cut, ranges[:, 1])
        change = np.zeros(len(lo) + 1, dtype=np.int64)    # +1 where a range starts, -1 where it ends
        np.add.at(change, first, 1)
        np.add.at(change, last, -1)
        take = (np.cumsum(change[:-1]) > 0) & covered & ~claimed
        owner[take] = i
        claimed |= take
    keep = covered
    sizes = measure(lo[keep], hi[keep]).astype(np.int64)
    owners, lengths = owner[keep], (hi - lo)[keep].astype(np.int64)
    rows = []
    for i, (kind, name) in enumerate(labels):
        mine = owners == i
        if not mine.any() or (kind not in ("heap", "stack") and not sizes[mine].any()):
            continue                 # a mapping with nothing resident owns none of the RSS
        rows.append(RssRow(kind, name, int(sizes[mine].sum()), int(lengths[mine].sum()), counts[i]))
    rows.sort(key=lambda r: (KINDS.index(r.kind) if r.kind in KINDS else len(KINDS), -r.bytes, r.name))
    return RssBreakdown(tuple(rows), int(sizes.sum()), what, source)


def _merged(ranges: list[tuple[int, int]]) -> np.ndarray:
    """RANGES sorted, with those that overlap or touch joined, as an (n, 2) uint64 array of [start, end)."""
    pairs = np.array(sorted(ranges), dtype=np.uint64).reshape(-1, 2)
    if len(pairs) < 2:
        return pairs
    reach = np.maximum.accumulate(pairs[:, 1])
    new = np.concatenate(([True], pairs[1:, 0] > reach[:-1]))    # a range that starts past all before it
    groups = np.cumsum(new) - 1
    starts = pairs[new, 0]
    ends = np.zeros(len(starts), dtype=np.uint64)
    np.maximum.at(ends, groups, pairs[:, 1])
    return np.stack((starts, ends), axis=1)


def _without(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """RANGES (sorted) less HOLES (sorted)."""
    out = []
    for start, end in ranges:
        at = start
        for h0, h1 in holes:
            if h1 <= at or h0 >= end:
                continue
            if h0 > at:
                out.append((at, h0))
            at = max(at, h1)
        if at < end:
            out.append((at, end))
    return out


def rss_of_target(target, claims: Sequence[Claim], seen=None) -> RssBreakdown | None:
    """TARGET's resident memory by owner (a `heapwalk.inferior.space.Target`), the allocators' CLAIMS and each
    thread's stack (the mapping its stack pointer is in) claimed first; for a core that does not say which pages
    were resident, what the core holds by owner instead (measure "in the core", SEEN: the pages a walk already
    judged, `pages.PagesSeen`); None when neither is known."""
    known = target.residency if target.residency is not None else \
        target.present(seen) if target.present is not None else None
    if known is None:
        return None
    space = target.space
    writable = _merged(list(space.writable or []))
    mapped = [(m.start, m.end, m.path, _touches(writable, m.start, m.end)) for m in space.mappings]
    spans = spans_of(mapped, space.regions)
    starts = [s.start for s in spans]
    stacks = []
    for thread in target.threads:
        at = bisect.bisect_right(starts, thread.sp) - 1 if thread.sp is not None else -1
        span = spans[at] if at >= 0 else None
        if span is not None and thread.sp < span.end and span.kind in ("anonymous", "stack"):
            name = f"thread {thread.number}" + (f" ({thread.name})" if thread.name else "")
            stacks.append(Claim(span.start, span.end, "stack", name))
    residency = known.covering([(s.start, s.end) for s in spans])
    what = "resident" if target.residency is not None else IN_CORE
    return rss_by_owner(spans, [*claims, *stacks], residency.resident_each, what, residency.source)


def _touches(ranges: np.ndarray, start: int, end: int) -> bool:
    """Whether [START, END) overlaps any of RANGES (`_merged`: sorted, disjoint)."""
    at = int(np.searchsorted(ranges[:, 1], np.uint64(start), side="right"))   # the first that ends past START
    return at < len(ranges) and int(ranges[at, 0]) < end


def rss_change(a: dict | None, b: dict | None) -> list[tuple[str, int, int]] | None:
    """Two snapshots' RSS by owner (the reports' ``rss_by_owner`` objects) compared by kind: (kind, bytes
    before, bytes after) for every kind either has, the heaps first, then "total"; None unless both have it,
    measured in RAM (a plain core's bytes are not its RSS)."""
    if not all(isinstance(x, dict) and x.get("measure") == "resident" for x in (a, b)):
        return None
    def by_kind(doc: dict) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in doc.get("rows") or []:
            if isinstance(row, dict) and isinstance(row.get("bytes"), int):
                out[str(row.get("kind"))] = out.get(str(row.get("kind")), 0) + row["bytes"]
        return out
    ka, kb = by_kind(a), by_kind(b)
    kinds = [k for k in KINDS if k in ka or k in kb] + sorted((set(ka) | set(kb)) - set(KINDS))
    total = (a.get("total"), b.get("total"))
    out = [(k, ka.get(k, 0), kb.get(k, 0)) for k in kinds]
    if all(isinstance(t, int) for t in total):
        out.append(("total", total[0], total[1]))
    return out
