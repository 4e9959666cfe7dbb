"""`heapwalk diff`'s text: each arena's growth in MiB, the totals, the size classes of free pieces and of
chunks in use that grew most, the signatures of chunks in use that grew most, and which arenas grew; each in its
allocator's words (mimalloc's owners and blocks)."""

from __future__ import annotations

from heapwalk.analysis.diff import Across, Diff
from heapwalk.analysis.report import human

__all__ = ["diff_text", "across_text", "restart_sentence", "figure_name"]

_MIB = 1 << 20

def _signed(n: int) -> str:
    return f"{n / _MIB:+.1f}"


def _bytes(n: int) -> str:
    """A growth in bytes as people read it: '+312 B', '+14 KiB', '-3 KiB', '+32.0 MiB'."""
    if abs(n) >= _MIB:
        return f"{n / _MIB:+,.1f} MiB"
    return f"{n:+,} B" if abs(n) < 1024 else f"{n / 1024:+,.0f} KiB"


def diff_text(d: Diff, words: dict | None = None) -> str:
    """The table of arenas that changed (largest growth of system memory first, with their RSS when both
    snapshots know it), then what grew; in the allocator's WORDS (`jsondoc.read_words`: what its rows are,
    what it counts)."""
    words = words or {}
    row, piece = words.get("arenas", "arenas").removesuffix("s"), words.get("counted", "blocks")
    figures = ("system", "rss", "in_use", "free") if d.rss_known else ("system", "in_use", "free")
    names = {"system": "system MiB", "rss": "RSS MiB", "in_use": "in use MiB", "free": "free MiB"}
    lines = []
    if d.restarted:
        lines.append(restart_sentence(d, row))
    lines.append(f"{row}s: {d.arena_counts[0]} -> {d.arena_counts[1]}")
    lines.append(f"{row:>6} {'address':>16} " + " ".join(f"{names[f]:>16}" for f in figures) + "  status")
    unchanged = [e for e in d.arenas if e.status == "both" and not any(e.growth(f) for f in e.figures)
                 and not e.free_classes and not e.in_use_classes]
    for e in d.arenas:
        if e in unchanged:
            continue
        lines.append(f"{e.number:>6} {e.address:#16x} " + " ".join(f"{_signed(e.growth(f)):>16}" for f in figures)
                     + f"  {e.status}" + (f" ({'first' if e.only == 'A' else 'second'})" if e.status ==
                                          "unmatched" else ""))
    g = d.growth
    lines.append(f"{'total':>6} {'':16} " + " ".join(f"{_signed(g[f]):>16}" for f in figures))
    if unchanged:
        lines.append(f"unchanged, not listed: {row} {', '.join(str(e.number) for e in unchanged)}")
    if any(d.unmatched):
        u = d.unmatched_growth
        lines.append(f"not matched, together: {d.unmatched[0]} {row}s of the first -> {d.unmatched[1]} of the "
                     f"second: " + ", ".join(f"{names[f].replace(' MiB', '')} {_signed(u[f])} MiB" for f in figures))
    if d.rss_known:
        before, after = (sum(e.figures["rss"][i] for e in d.arenas) for i in (0, 1))
        lines.append(f"RSS of the {row}s: {before / _MIB:.1f} MiB -> {after / _MIB:.1f} MiB")
    else:
        lines.append("RSS: not compared (a snapshot does not say which pages were in RAM: take both with "
                     "'heapwalk capture')")
    for e in d.arenas:
        if e.status == "unmatched":       # nothing to compare its pieces with
            continue
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
    grew = {e.number: e for e in d.arenas if e.number in d.grew and e.status != "unmatched"}
    if grew:
        lines.append(f"grew: {row} " + ", ".join(f"{n} ({_grown(grew[n])})" for n in d.grew))
    else:
        lines.append(f"no {'matched ' if any(d.unmatched) else ''}{row} grew")
    return "\n".join(lines) + "\n"


def _grown(e) -> str:
    """What made an arena count as grown: its system memory and its bytes in use, as far as each grew."""
    parts = [f"{word} {_bytes(e.growth(f))}" for f, word in (("system", "system"), ("in_use", "in use"))
             if e.growth(f) > 0]
    return ", ".join(parts)


def restart_sentence(d: Diff, row: str = "arena") -> str:
    """How a diff across a restart matched the arenas, and how many it could not."""
    text = (f"two processes (no {row} at the same address: a restart between the snapshots): {row}s are matched "
            f"by the names of the threads that use them, or by a kind one {row} of each has (the main arena); "
            f"an address is the second's")
    if any(d.unmatched):
        text += (f"; {d.unmatched[0]} of the first's and {d.unmatched[1]} of the second's are not matched (no "
                 f"thread names tie them: threads unnamed, or sharing names) and are compared together")
    return text


def figure_name(figure: str, words, marks: tuple[str, str] = ("", ""), rss: str = "RSS") -> str:
    """A row of the comparison of two allocators (`analysis.diff.across`) in each one's WORDS (their
    `jsondoc.words_json`): "system / mapped", or with MARKS "system (A) / mapped (B)"; RSS's row named RSS."""
    if figure in ("arenas", "system", "gives back"):
        key = {"gives back": "gives_back"}.get(figure, figure)
        a, b = words[0].get(key, figure), words[1].get(key, figure)
        return a if a == b else f"{a}{marks[0]} / {b}{marks[1]}"
    return rss if figure == "rss" else figure


def across_text(x: Across, sides: tuple[str, str] = ("first", "second")) -> str:
    """Two allocators' snapshots side by side, each in its own figures (`analysis.diff.across`)."""
    lines = [f"two allocators: the {sides[0]} snapshot's is {x.titles[0]}, the {sides[1]}'s {x.titles[1]}: "
             f"each is shown in its own figures; no {x.words[0]['arenas'].rstrip('s')} is matched across "
             f"allocators",
             ]
    width = max(len(figure_name(figure, x.words)) for figure, _, _ in x.rows)
    lines.append(f"{'':{width}} {'A: ' + x.titles[0]:>20} {'B: ' + x.titles[1]:>20} {'change':>12}")
    for figure, a, b in x.rows:
        cells = [("-" if v is None else str(v) if figure == "arenas" else human(v)) for v in (a, b)]
        change = ("" if a is None or b is None else f"{b - a:+d}" if figure == "arenas" else
                  ("+" if b >= a else "-") + human(abs(b - a)))
        lines.append(f"{figure_name(figure, x.words):<{width}} {cells[0]:>20} {cells[1]:>20} {change:>12}")
    return "\n".join(lines) + "\n"
