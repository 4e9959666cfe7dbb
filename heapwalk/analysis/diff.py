"""What grew between two snapshots: per arena system memory, in-use, free and top bytes, the free pieces and
the chunks in use of each size class; and, for the whole process, the chunks in use of each signature (a
vtable, a type, text).  Arenas of one process are matched by address; across a restart (no arena at the same
address in both) by their number, so the main arena to the main arena and each thread arena to the one that
took its place.  The snapshots come from reports (`heapwalk.output.jsondoc.read_snapshot` reads them back
from their JSON), of any allocator."""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.analysis.report import Bucket

__all__ = ["ArenaTotals", "ArenaChange", "ClassChange", "SignatureChange", "Signatures", "Diff", "diff", "FIGURES"]

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
    """One arena's figures in A and in B ("new": only in B, "gone": only in A, "both")."""

    address: int
    number: int
    status: str
    figures: dict[str, tuple[int, int]]           # FIGURES, and "rss" when both snapshots know it
    free_classes: tuple[ClassChange, ...]
    in_use_classes: tuple[ClassChange, ...] = ()  # when both snapshots grouped their chunks in use

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
    restarted: bool = False                       # no arena at the same address: two processes, matched by number
    arena_counts: tuple[int, int] = (0, 0)        # how many arenas A and B have

    @property
    def growth(self) -> dict[str, int]:
        return {k: sum(e.growth(k) for e in self.arenas) for k in FIGURES + (("rss",) if self.rss_known else ())}

    @property
    def grew(self) -> list[int]:
        """The numbers of the arenas whose system memory or in-use bytes grew."""
        return [e.number for e in self.arenas if e.growth("system") > 0 or e.growth("in_use") > 0]


def diff(a: list[ArenaTotals], b: list[ArenaTotals], signatures_a: Signatures | None = None,
         signatures_b: Signatures | None = None) -> Diff:
    """What changed from the arenas of snapshot A to those of snapshot B, and from A's chunks in use by
    signature to B's (when both have them)."""
    restarted = bool(a and b) and not {x.address for x in a} & {x.address for x in b}
    key = (lambda x: x.number) if restarted else (lambda x: x.address)
    in_a, in_b = {key(x): x for x in a}, {key(x): x for x in b}
    rss_known = bool(a and b) and all(x.rss is not None for x in a + b)
    names = FIGURES + (("rss",) if rss_known else ())
    changes = []
    for k in list(in_b) + [x for x in in_a if x not in in_b]:
        ra, rb = in_a.get(k), in_b.get(k)
        figures = {f: (getattr(ra, f) if ra else 0, getattr(rb, f) if rb else 0) for f in names}
        grouped = all(x.in_use_histogram is not None for x in (ra, rb) if x is not None)
        changes.append(ArenaChange((rb or ra).address, (rb or ra).number, "new" if ra is None else "gone"
                                   if rb is None else "both", figures, _class_changes(ra, rb, "histogram"),
                                   _class_changes(ra, rb, "in_use_histogram") if grouped else ()))
    changes.sort(key=lambda e: -e.growth("system"))
    return Diff(tuple(changes), rss_known, _signature_changes(signatures_a, signatures_b), restarted,
                (len(a), len(b)))


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
