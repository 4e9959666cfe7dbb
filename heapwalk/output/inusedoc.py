"""The report's part on the memory in use (`heapwalk.analysis.inuse`): its tables for people and its JSON
(schema in docs/json.md), with what the leak scan found in each group when it ran."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from heapwalk.analysis.inuse import InUse, LeakTotals, UsedBucket
from heapwalk.analysis.report import human
from heapwalk.output.consoles import box_for
from heapwalk.output.leakdoc import share

__all__ = ["in_use_tables", "in_use_json", "leaks_totals_json", "SIGNATURES_SHOWN"]

#: signature groups the text shows (the JSON has up to SIGNATURES_KEPT)
SIGNATURES_SHOWN = 10


def _by_size(groups: InUse, scanned: bool, interactive: bool, unit: str, which: str) -> Table:
    table = Table(title=f"in-use {unit} by size{which}", box=box_for(interactive), title_justify="left")
    columns = ["size", unit, "bytes", "share"] + ([f"leaked {unit}", "leaked"] if scanned else [])
    for name in columns:
        table.add_column(name, justify="left" if name == "size" else "right", no_wrap=True)
    for b in groups.histogram:
        row = [f"{human(b.low)} - {human(b.high)}", str(b.count), human(b.bytes), share(b.bytes, groups.bytes)]
        if scanned:
            row += [str(b.leaked_count), human(b.leaked_bytes)]
        table.add_row(*row)
    return table


def _by_signature(groups: InUse, scanned: bool, interactive: bool, unit: str) -> Table:
    signatures = groups.signatures or ()
    more = len(signatures) > SIGNATURES_SHOWN or groups.truncated
    table = Table(title=f"in-use {unit} by signature (the first word: a vtable, a type, or text)"
                  + (f", the {SIGNATURES_SHOWN} biggest" if more else ""), box=box_for(interactive),
                  title_justify="left")
    columns = ["signature", unit, "bytes", "share"] + ([f"leaked {unit}", "leaked"] if scanned else []) + ["example"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("signature", "example") else "right", no_wrap=True)
    for g in signatures[:SIGNATURES_SHOWN]:
        row = [g.name, str(g.count), human(g.bytes), share(g.bytes, groups.bytes)]
        if scanned:
            row += [str(g.leaked_count), human(g.leaked_bytes)]
        table.add_row(*row, f"{g.example:#x}" + (f' "{g.text}"' if g.text else ""))
    return table


def in_use_tables(groups: InUse | None, leaks: LeakTotals | None, interactive: bool, unit: str = "blocks",
                  which: str = "") -> list[Table]:
    """The tables of the memory in use, in the allocator's UNIT ("chunks") and saying WHICH blocks they count:
    by size, and by signature when signatures are known and any block has one; none when the blocks were not
    grouped."""
    if groups is None or not groups.count:
        return []
    out = [_by_size(groups, leaks is not None, interactive, unit, which)]
    if groups.signatures:
        out.append(_by_signature(groups, leaks is not None, interactive, unit))
    return out


def _bucket_json(b: UsedBucket) -> dict[str, Any]:
    return {"low": b.low, "high": b.high, "count": b.count, "bytes": b.bytes, "leaked_count": b.leaked_count,
            "leaked_bytes": b.leaked_bytes}


def in_use_json(groups: InUse | None) -> dict[str, Any] | None:
    """The report JSON's "in_use": the program's blocks by size (in all and per arena) and by signature."""
    if groups is None:
        return None
    return {
        "count": groups.count, "bytes": groups.bytes,
        "histogram": [_bucket_json(b) for b in groups.histogram],
        "histogram_by_arena": {str(n): [_bucket_json(b) for b in buckets] for n, buckets in groups.per_arena.items()},
        "by_signature": None if groups.signatures is None else [
            {"signature": g.name, "count": g.count, "bytes": g.bytes, "leaked_count": g.leaked_count,
             "leaked_bytes": g.leaked_bytes, "example": g.example, "text": g.text or None}
            for g in groups.signatures],
        "signatures_truncated": groups.truncated,
    }


def leaks_totals_json(lt: LeakTotals | None) -> dict[str, Any] | None:
    """The report JSON's "leaks": what the leak scan found, in all and per arena (None: no scan)."""
    if lt is None:
        return None
    return {"in_use_count": lt.in_use_count, "in_use_bytes": lt.in_use_bytes, "leaked_count": lt.leaked_count,
            "leaked_bytes": lt.leaked_bytes, "unreferenced_count": lt.unreferenced_count,
            "unread_bytes": lt.unread_bytes,
            "by_arena": {str(n): {"leaked_count": c, "leaked_bytes": b} for n, (c, b) in lt.per_arena.items()}}
