"""`heapwalk leaks` laid out: its tables and lines for people, its JSON document (schema in docs/json.md)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from heapwalk.analysis.leakreport import LeakReport
from heapwalk.analysis.report import human
from heapwalk.output.consoles import box_for

__all__ = ["leaks_group", "leaks_json", "share"]


def share(part: int, whole: int) -> str:
    """PART as a percentage of WHOLE, never above 100% nor below 0."""
    if whole <= 0:
        return "-"
    return f"{100 * min(max(part, 0), whole) / whole:.1f}%"


def _summary(rep: LeakReport, noun: str) -> Text:
    text = Text()
    text.append(f"leaked: {rep.leaked_count} {noun}s, {human(rep.leaked_bytes)} of {human(rep.in_use_bytes)} in use "
                f"({share(rep.leaked_bytes, rep.in_use_bytes)}) in {rep.in_use_count} {noun}s; "
                f"{rep.unreferenced_count} unreferenced (nothing leaked points to them)", style="bold")
    text.append("\n")
    if rep.in_rings:
        text.append(f"{rep.in_rings} leaked {noun}s ({human(rep.in_rings_bytes)}) lie in rings of leaked {noun}s "
                    f"that point to one another, with no unreferenced {noun} leading to them\n")
    roots = ", ".join(f"{kind} {n} ({human(b)})" if kind != "registers" else f"registers {n}"
                      for kind, n, b in rep.roots)
    text.append(f"roots scanned: {roots}\n")
    if rep.unread_bytes:
        text.append(f"{human(rep.unread_bytes)} of roots and heaps could not be read: {noun}s reached only "
                    "through them are counted leaked\n", style="red")
    return text


def _arenas(rep: LeakReport, interactive: bool, noun: str) -> Table:
    table = Table(title="leaked by arena", box=box_for(interactive), title_justify="left")
    for name in ("arena", "in use", f"in-use {noun}s", "leaked", f"leaked {noun}s", "share", "unreferenced"):
        table.add_column(name, justify="right", no_wrap=True)
    for a in rep.arenas:
        table.add_row(str(a.number), human(a.in_use_bytes), str(a.in_use_count), human(a.leaked_bytes),
                      str(a.leaked_count), share(a.leaked_bytes, a.in_use_bytes), str(a.unreferenced_count))
    return table


def _by_size(rep: LeakReport, interactive: bool, noun: str) -> Table:
    table = Table(title=f"leaked by {noun} size", box=box_for(interactive), title_justify="left")
    for name in ("size", f"{noun}s", "bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for g in rep.by_size:
        table.add_row(str(g.key), str(g.count), human(g.bytes))
    return table


def _by_signature(rep: LeakReport, interactive: bool, noun: str) -> Table:
    table = Table(title="leaked by signature (the first word: a vtable, a type, or text)", box=box_for(interactive),
                  title_justify="left")
    for name in ("signature", f"{noun}s", "bytes", "example"):
        table.add_column(name, justify="right" if name in (f"{noun}s", "bytes") else "left", no_wrap=True)
    for g in rep.by_signature:
        example = f"{g.example:#x}" + (f' "{g.text}"' if g.text else "")
        table.add_row(g.name, str(g.count), human(g.bytes), example)
    return table


def _hexdump(data: bytes) -> str:
    hexes = " ".join(data[i:i + 8].hex() for i in range(0, len(data), 8))
    text = "".join(chr(b) if 0x20 <= b < 0x7f else "." for b in data)
    return f"{hexes}  {text}"


def _biggest(rep: LeakReport, interactive: bool, noun: str) -> Table:
    table = Table(title=f"biggest unreferenced {noun}s (what each holds: itself and the leaked {noun}s it leads to)",
                  box=box_for(interactive), title_justify="left")
    for name in (noun, "size", "arena", "holds", "bytes held", "first bytes"):
        table.add_column(name, justify="left" if name in (noun, "first bytes") else "right", no_wrap=True)
    for u in rep.biggest:
        table.add_row(f"{u.address:#x}", str(u.size), str(u.arena), str(u.holds_count), human(u.holds_bytes),
                      _hexdump(u.head))
    return table


def leaks_group(rep: LeakReport, interactive: bool, noun: str = "chunk") -> Group:
    """The leak report: totals, per arena, by size and signature, the biggest unreferenced, and what a
    conservative scan cannot see; a block is called NOUN (the allocator's word: glibc's chunk, jemalloc's
    allocation)."""
    parts: list[Any] = [_summary(rep, noun), _arenas(rep, interactive, noun)]
    if rep.leaked_count:
        parts += [_by_size(rep, interactive, noun)]
        if rep.by_signature:
            parts.append(_by_signature(rep, interactive, noun))
        parts.append(_biggest(rep, interactive, noun))
    article = "an" if noun[0] in "aeiou" else "a"
    parts.append(Text(rep.note.replace("a chunk", f"{article} {noun}").replace("chunk", noun) + "\n"))
    return Group(*parts)


def leaks_json(header: dict[str, Any], rep: LeakReport) -> dict[str, Any]:
    """The document of `heapwalk leaks --json`: HEADER's fields, then the summary, arenas, groups and every
    leaked chunk."""
    return {
        **header,
        "summary": {"in_use_bytes": rep.in_use_bytes, "in_use_count": rep.in_use_count,
                    "leaked_bytes": rep.leaked_bytes, "leaked_count": rep.leaked_count,
                    "unreferenced_count": rep.unreferenced_count, "in_rings_count": rep.in_rings,
                    "in_rings_bytes": rep.in_rings_bytes, "unread_bytes": rep.unread_bytes},
        "arenas": [{"number": a.number, "in_use_bytes": a.in_use_bytes, "in_use_count": a.in_use_count,
                    "leaked_bytes": a.leaked_bytes, "leaked_count": a.leaked_count,
                    "unreferenced_count": a.unreferenced_count} for a in rep.arenas],
        "by_size": [{"size": g.key, "count": g.count, "bytes": g.bytes} for g in rep.by_size],
        "by_signature": [{"signature": g.name, "count": g.count, "bytes": g.bytes, "example": g.example,
                          "text": g.text or None} for g in rep.by_signature],
        "roots": [{"kind": kind, "regions": n, "bytes": b} for kind, n, b in rep.roots],
        "leaked": [{"address": b.address, "size": b.size, "arena": b.arena, "unreferenced": b.unreferenced,
                    "holds_count": b.holds_count, "holds_bytes": b.holds_bytes, "signature": b.signature}
                   for b in rep.leaked],
        "note": rep.note,
    }
