"""`heapwalk diff`'s text: each arena's growth in MiB, the totals, the size classes of free pieces and of
chunks in use that grew most, the signatures of chunks in use that grew most, and which arenas grew; each in its
allocator's words (mimalloc's owners and blocks)."""

from __future__ import annotations

from heapwalk.analysis.diff import Diff

__all__ = ["diff_text", "TERMS"]

_MIB = 1 << 20

#: what each allocator calls the rows the diff compares and the pieces it counts (glibc's words otherwise)
TERMS = {"mimalloc": ("owner", "blocks"), "tcmalloc": ("arena", "objects"), "jemalloc": ("arena", "regions")}


def _signed(n: int) -> str:
    return f"{n / _MIB:+.1f}"


def _bytes(n: int) -> str:
    """A growth in bytes as people read it: '+312 B', '+14 KiB', '-3 KiB'."""
    return f"{n:+,} B" if abs(n) < 1024 else f"{n / 1024:+,.0f} KiB"


def diff_text(d: Diff, allocator: str = "") -> str:
    """The table of arenas that changed (largest growth of system memory first, with their RSS when both
    snapshots know it), then what grew; in ALLOCATOR's words (`TERMS`: mimalloc's rows are owners, its pieces
    blocks)."""
    row, piece = TERMS.get(allocator, ("arena", "chunks"))
    figures = ("system", "rss", "in_use", "free") if d.rss_known else ("system", "in_use", "free")
    names = {"system": "system MiB", "rss": "RSS MiB", "in_use": "in use MiB", "free": "free MiB"}
    lines = []
    if d.restarted:
        lines.append("two processes (no arena at the same address: a restart between the snapshots): arenas are "
                     "matched by their number, the main arena to the main arena; an address is the second's, "
                     "the first's for an arena gone")
    lines.append(f"{row}s: {d.arena_counts[0]} -> {d.arena_counts[1]}")
    lines.append(f"{row:>6} {'address':>16} " + " ".join(f"{names[f]:>16}" for f in figures) + "  status")
    unchanged = [e for e in d.arenas if e.status == "both" and not any(e.growth(f) for f in e.figures)
                 and not e.free_classes and not e.in_use_classes]
    for e in d.arenas:
        if e in unchanged:
            continue
        lines.append(f"{e.number:>6} {e.address:#16x} " + " ".join(f"{_signed(e.growth(f)):>16}" for f in figures)
                     + f"  {e.status}")
    g = d.growth
    lines.append(f"{'total':>6} {'':16} " + " ".join(f"{_signed(g[f]):>16}" for f in figures))
    if unchanged:
        lines.append(f"unchanged, not listed: {row} {', '.join(str(e.number) for e in unchanged)}")
    if d.rss_known:
        before, after = (sum(e.figures["rss"][i] for e in d.arenas) for i in (0, 1))
        lines.append(f"RSS of the {row}s: {before / _MIB:.1f} MiB -> {after / _MIB:.1f} MiB")
    else:
        lines.append("RSS: not compared (a snapshot does not say which pages were in RAM: take both with "
                     "'heapwalk capture')")
    for e in d.arenas:
        for what, classes in ((f"free {piece}", e.free_classes), (f"{piece} in use", e.in_use_classes)):
            grown = sorted((c for c in classes if c.bytes_growth > 0), key=lambda c: -c.bytes_growth)
            if grown:
                lines.append(f"{row} {e.number}: {what} grew in " + ", ".join(
                    f"{c.low}-{c.high} B ({c.count[0]} -> {c.count[1]} {piece}, {_bytes(c.bytes_growth)})"
                    for c in grown[:4]))
    grown_signatures = [c for c in d.signatures if c.bytes_growth > 0]
    if grown_signatures:
        lines.append(f"{piece} in use grew by signature: " + ", ".join(
            f"{c.name} ({c.count[0]} -> {c.count[1]} {piece}, {_bytes(c.bytes_growth)})"
            for c in grown_signatures[:6]))
    if d.grew:
        lines.append(f"grew: {row} " + ", ".join(map(str, d.grew)) + " (system memory or in-use bytes)")
    else:
        lines.append(f"no {row} grew")
    return "\n".join(lines) + "\n"
