"""What grew between two snapshots: per arena system memory, in-use, free and top bytes, the free pieces and
the chunks in use of each size class; and, for the whole process, the chunks in use of each signature (a
vtable, a type, text).  Arenas of one process are matched by address.  Across a restart (no arena at the same
address in both) an arena is matched by what ties it to its process: the names of the threads that allocate
from it, or a kind only one arena of each side has (glibc's main arena); the others are not matched, and are
compared together.  Snapshots of two allocators (a restart on another) are compared as totals, each side in
its own figures (`across`).  The snapshots come from reports (`heapwalk.output.jsondoc.read_snapshot` reads
them back from their JSON), of any allocator."""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.analysis.report import Bucket

__all__ = ["ArenaTotals", "ArenaChange", "ClassChange", "SignatureChange", "Signatures", "Diff", "diff", "FIGURES",
           "Across", "across"]

#: the figures compared for each arena
FIGURES = ("system", "in_use", "free", "top")


@dataclass(frozen=True)
class ArenaTotals:
    """One arena of a snapshot: its figures, its free pieces by size, and where its memory is."""

    address: int
    number: int
    system: int
    in_use: int
    free: int
    top: int
    histogram: tuple[Bucket, ...]
    reclaim: int = 0                              # resident bytes the allocator could give back
    heaps: tuple[tuple[int, int], ...] = ()       # (address, size) of each piece of its memory
    rss: int | None = None                        # bytes of its memory in RAM (None: the snapshot cannot say)
    in_use_histogram: tuple[Bucket, ...] | None = None   # its chunks in use by size (None: not grouped)
    kind: str = ""                                # the allocator's word for it ("main", "thread", "auto")
    users: tuple[str, ...] | None = None          # the names of the threads that allocate from it ("": unnamed)
    free_kinds: tuple[tuple[str, int], ...] = ()  # its free bytes by the allocator's kinds


@dataclass(frozen=True)
class ClassChange:
    """The free pieces of sizes [low, high) in A and in B."""

    low: int
    high: int
    count: tuple[int, int]
    bytes: tuple[int, int]

    @property
    def bytes_growth(self) -> int:
        return self.bytes[1] - self.bytes[0]


@dataclass(frozen=True)
class Signatures:
    """A snapshot's chunks in use by signature: name -> (count, bytes), and whether it lists only the
    biggest (a signature missing from a TRUNCATED list is unknown there, not absent)."""

    groups: dict[str, tuple[int, int]]
    truncated: bool = False


@dataclass(frozen=True)
class SignatureChange:
    """The chunks in use of one signature in A and in B."""

    name: str
    count: tuple[int, int]
    bytes: tuple[int, int]

    @property
    def bytes_growth(self) -> int:
        return self.bytes[1] - self.bytes[0]


@dataclass(frozen=True)
class ArenaChange:
    """One arena's figures in A and in B ("both"; of one process, "new": only in B, "gone": only in A; across a
    restart, "unmatched": nothing ties it to an arena of the other snapshot, whose figures are zeros)."""

    address: int
    number: int
    status: str
    figures: dict[str, tuple[int, int]]           # FIGURES, and "rss" when both snapshots know it
    free_classes: tuple[ClassChange, ...]
    in_use_classes: tuple[ClassChange, ...] = ()  # when both snapshots grouped their chunks in use
    only: str = ""                                # "A" or "B": the snapshot an arena "unmatched" is in

    def growth(self, figure: str) -> int:
        a, b = self.figures[figure]
        return b - a


@dataclass(frozen=True)
class Diff:
    """Every arena's change, the biggest growth of system memory first, the totals, and the signatures whose
    chunks in use changed (the biggest growth first; empty when a snapshot has no signatures)."""

    arenas: tuple[ArenaChange, ...]
    rss_known: bool = False                       # both snapshots say how much of each arena was in RAM
    signatures: tuple[SignatureChange, ...] = ()
    restarted: bool = False                       # no arena at the same address: two processes
    arena_counts: tuple[int, int] = (0, 0)        # how many arenas A and B have
    unmatched: tuple[int, int] = (0, 0)           # how many of A's and of B's no arena of the other matched

    @property
    def growth(self) -> dict[str, int]:
        return {k: sum(e.growth(k) for e in self.arenas) for k in FIGURES + (("rss",) if self.rss_known else ())}

    @property
    def grew(self) -> list[int]:
        """The numbers of the arenas whose system memory or in-use bytes grew (matched arenas only: one not
        matched across a restart is not said to have grown)."""
        return [e.number for e in self.arenas if e.status != "unmatched" and (e.growth("system") > 0 or
                                                                              e.growth("in_use") > 0)]

    @property
    def unmatched_growth(self) -> dict[str, int]:
        """The growth of the arenas not matched across a restart, taken together."""
        names = FIGURES + (("rss",) if self.rss_known else ())
        return {k: sum(e.growth(k) for e in self.arenas if e.status == "unmatched") for k in names}


def diff(a: list[ArenaTotals], b: list[ArenaTotals], signatures_a: Signatures | None = None,
         signatures_b: Signatures | None = None) -> Diff:
    """What changed from the arenas of snapshot A to those of snapshot B, and from A's chunks in use by
    signature to B's (when both have them)."""
    restarted = bool(a and b) and not {x.address for x in a} & {x.address for x in b}
    if restarted:
        pairs = _restart_pairs(a, b)
        alone = "unmatched", "unmatched"
    else:
        at = {x.address: x for x in a}
        pairs = [(at.get(x.address), x) for x in b] + [(x, None) for x in a if x.address not in
                                                       {y.address for y in b}]
        alone = "new", "gone"
    rss_known = bool(a and b) and all(x.rss is not None for x in a + b)
    names = FIGURES + (("rss",) if rss_known else ())
    changes = []
    for ra, rb in pairs:
        figures = {f: (getattr(ra, f) if ra else 0, getattr(rb, f) if rb else 0) for f in names}
        grouped = all(x.in_use_histogram is not None for x in (ra, rb) if x is not None)
        changes.append(ArenaChange((rb or ra).address, (rb or ra).number, alone[0] if ra is None else alone[1]
                                   if rb is None else "both", figures, _class_changes(ra, rb, "histogram"),
                                   _class_changes(ra, rb, "in_use_histogram") if grouped else (),
                                   "" if ra and rb else "B" if rb else "A"))
    changes.sort(key=lambda e: -e.growth("system"))
    unmatched = (sum(1 for ra, rb in pairs if rb is None), sum(1 for ra, rb in pairs if ra is None))
    return Diff(tuple(changes), rss_known, _signature_changes(signatures_a, signatures_b), restarted,
                (len(a), len(b)), unmatched if restarted else (0, 0))


def _restart_pairs(a: list[ArenaTotals], b: list[ArenaTotals]) -> list[tuple[ArenaTotals | None,
                                                                              ArenaTotals | None]]:
    """The arenas of two processes matched: first those whose threads have the same names (every thread named,
    the set of names one arena's alone on each side), then those of a kind only one arena has on each side
    (glibc's main arena; not "thread N", whose numbers a restart deals anew); B's, then A's, the others alone."""
    pairs: list[tuple[ArenaTotals | None, ArenaTotals | None]] = []
    taken: set[int] = set()

    def unique(side: list[ArenaTotals], key) -> dict:
        seen: dict = {}
        for x in side:
            k = key(x)
            if id(x) not in taken and k is not None:
                seen.setdefault(k, []).append(x)
        return {k: v[0] for k, v in seen.items() if len(v) == 1}

    for key in ((lambda x: x.users if x.users and "" not in x.users else None),
                (lambda x: x.kind if x.kind and not x.kind.startswith("thread") else None)):
        in_a, in_b = unique(a, key), unique(b, key)
        for k, rb in in_b.items():
            if k in in_a:
                pairs.append((in_a[k], rb))
                taken |= {id(in_a[k]), id(rb)}
    matched_b = {id(rb) for _, rb in pairs}
    order = {id(x): i for i, x in enumerate(b)}
    pairs.sort(key=lambda p: order[id(p[1])])
    return (pairs + [(None, x) for x in b if id(x) not in matched_b]
            + [(x, None) for x in a if id(x) not in taken])


def _signature_changes(a: Signatures | None, b: Signatures | None) -> tuple[SignatureChange, ...]:
    """The signatures whose chunks in use changed, the biggest growth first; one that a truncated list
    leaves out is unknown on that side, and left out."""
    if a is None or b is None:
        return ()
    out = []
    for name in list(b.groups) + [n for n in a.groups if n not in b.groups]:
        if (name not in a.groups and a.truncated) or (name not in b.groups and b.truncated):
            continue
        (ca, ba), (cb, bb) = a.groups.get(name, (0, 0)), b.groups.get(name, (0, 0))
        if (ca, ba) != (cb, bb):
            out.append(SignatureChange(name, (ca, cb), (ba, bb)))
    return tuple(sorted(out, key=lambda c: (-c.bytes_growth, c.name)))


def _class_changes(ra: ArenaTotals | None, rb: ArenaTotals | None, which: str) -> tuple[ClassChange, ...]:
    """The size classes whose pieces (WHICH: "histogram", free; "in_use_histogram", in use) changed in count
    or bytes, smallest first."""
    classes: dict[tuple[int, int], list[int]] = {}
    for side, arena in ((0, ra), (1, rb)):
        for h in (getattr(arena, which) or ()) if arena else ():
            c = classes.setdefault((h.low, h.high), [0, 0, 0, 0])
            c[side * 2] += h.count
            c[side * 2 + 1] += h.bytes
    return tuple(ClassChange(lo, hi, (c[0], c[2]), (c[1], c[3])) for (lo, hi), c in sorted(classes.items())
                 if c[3] != c[1] or c[2] != c[0])


@dataclass(frozen=True)
class Across:
    """Snapshots of two allocators (a restart on another): each side's totals in its own words, no arena
    matched.  ROWS are (figure, A's bytes, B's bytes), None where that side has no such figure: "arenas" (a
    count), "system", "in use", "free" and "free: KIND" for each side's kinds of free bytes, "top", "gives
    back" (what the allocator would give back now), "rss" when both sides know it."""

    titles: tuple[str, str]
    words: tuple[dict, dict]
    rows: tuple[tuple[str, int | None, int | None], ...]
    rss_known: bool

    def row(self, figure: str) -> tuple[int | None, int | None]:
        return next(((x, y) for name, x, y in self.rows if name == figure), (None, None))


def across(a: list[ArenaTotals], b: list[ArenaTotals], words_a: dict, words_b: dict) -> Across:
    """The totals of A's allocator beside B's (WORDS_*: each one's `jsondoc.words_json`)."""
    rss_known = bool(a and b) and all(x.rss is not None for x in a + b)

    def total(side: list[ArenaTotals], figure: str) -> int:
        return sum(getattr(x, figure) or 0 for x in side)

    def kinds(side: list[ArenaTotals]) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in side:
            for kind, n in x.free_kinds:
                out[kind] = out.get(kind, 0) + n
        return out

    ka, kb = kinds(a), kinds(b)
    rows: list[tuple[str, int | None, int | None]] = [
        ("arenas", len(a), len(b)), ("system", total(a, "system"), total(b, "system")),
        ("in use", total(a, "in_use"), total(b, "in_use")), ("free", total(a, "free"), total(b, "free"))]
    rows += [(f"free: {k}", ka.get(k), kb.get(k)) for k in list(ka) + [k for k in kb if k not in ka]]
    if words_a.get("top") or words_b.get("top"):
        rows.append(("top", total(a, "top") if words_a.get("top") else None,
                     total(b, "top") if words_b.get("top") else None))
    rows.append(("gives back", total(a, "reclaim"), total(b, "reclaim")))
    if rss_known:
        rows.append(("rss", total(a, "rss"), total(b, "rss")))
    return Across((words_a["title"], words_b["title"]), (words_a, words_b), tuple(rows), rss_known)
