"""What every JSON document heapwalk writes shares (schema in docs/json.md): the report object, a finding, the
diff's document, the file's layout, one document from several allocators'; and the reader that takes a
report back for `heapwalk diff`.  Each allocator's own documents are in its folder.

Bump SCHEMA_VERSION on any change that renames or removes a field or changes
its meaning; adding a field keeps the version.
"""

from __future__ import annotations

import json
from typing import Any

from heapwalk.analysis.diff import Across, ArenaTotals, Diff, Signatures
from heapwalk.analysis.report import Bucket
from heapwalk.common.errors import HeapwalkError
from heapwalk.common.findings import Finding
from heapwalk.output.inusedoc import in_use_json, leaks_totals_json

__all__ = ["SCHEMA_VERSION", "DocumentError", "finding_json", "report_json", "read_snapshot", "read_signatures",
           "diff_json", "dump", "together", "allocator_parts", "words_json", "read_words", "across_json"]

SCHEMA_VERSION = 2


def finding_json(f: Finding) -> dict[str, Any]:
    """One finding, as every document lists them."""
    return {"severity": f.severity.value, "kind": f.kind.ident, "address": f.address, "structure": f.structure,
            "message": f.message, "expected": f.expected, "found": f.found}


def report_json(rep) -> dict[str, Any]:
    """The report's numbers and verdict (see heapwalk/analysis/report.py)."""
    return {
        "arenas": [{"number": a.number, "address": a.address, "kind": a.kind, "threads": a.threads,
                    "thread_names": None if a.users is None else list(a.users), "heaps": a.heaps,
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
        "by_size_class": [{"class": name, "count": c, "bytes": b} for name, c, b in rep.classes],
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
                            None if used is None else _buckets(used.get(str(r["number"]), [])),
                            str(r.get("kind") or ""), _names(r.get("thread_names")),
                            tuple((str(k), int(v)) for k, v in (r.get("free") or {}).items()))
                for r in doc["report"]["arenas"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise DocumentError(f"its report is not heapwalk's ({type(exc).__name__}: {exc})") from None


def _names(names: Any) -> tuple[str, ...] | None:
    """An arena's thread names as a report wrote them (None: not written, or not a list of names)."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)


def words_json(title: str, words) -> dict[str, Any]:
    """What an allocator calls the parts of its report (`view.Words`), for readers of its JSON ('heapwalk diff'):
    its name, its rows, what they hold from the system, its free pieces, what it gives back, whether its arenas
    have a top, and what it counts by size class (its blocks)."""
    return {"title": title, "arenas": words.arenas, "system": words.system, "pieces": words.pieces,
            "gives_back": words.gives_back, "top": words.top, "counted": words.counted or words.blocks}


def read_words(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The words a report document's allocator (NAME) uses (`words_json`); for a document written before it
    said them, the name alone and the common words."""
    words = (doc.get("report") or {}).get("words") if isinstance(doc, dict) else None
    base = {"title": name or "the allocator", "arenas": "arenas", "system": "system", "pieces": "pieces",
            "gives_back": "gives back", "top": True, "counted": "blocks"}
    return {**base, **{k: v for k, v in words.items() if k in base}} if isinstance(words, dict) else base


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
        if e.status == "unmatched":
            entry["only"] = e.only
        for figure in e.figures:
            entry[figure] = list(e.figures[figure])
            entry[figure + "_growth"] = e.growth(figure)
        entry["free_classes"] = [_class_json(c) for c in e.free_classes]
        entry["in_use_classes"] = [_class_json(c) for c in e.in_use_classes]
        arenas.append(entry)
    return {"arenas": arenas, "growth": d.growth, "grew": d.grew, "restarted": d.restarted,
            "arena_counts": list(d.arena_counts), "unmatched": list(d.unmatched),
            "unmatched_growth": d.unmatched_growth if any(d.unmatched) else None,
            "signatures": [{"signature": c.name, "count": list(c.count), "bytes": list(c.bytes),
                            "bytes_growth": c.bytes_growth} for c in d.signatures]}


def across_json(x: Across) -> dict[str, Any]:
    """'heapwalk diff --json' of two allocators' snapshots (`analysis.diff.across`): no arena matched, the
    totals' growth, and under "across" each side's figures in its own words."""
    growth = {k: b - a for k, a, b in x.rows if k in ("system", "in use", "free", "top", "rss")
              and a is not None and b is not None}
    return {"arenas": [], "growth": {k.replace(" ", "_"): v for k, v in growth.items()}, "grew": [],
            "restarted": True, "arena_counts": [x.row("arenas")[0], x.row("arenas")[1]], "unmatched": [0, 0],
            "unmatched_growth": None, "signatures": [],
            "across": {"titles": list(x.titles), "words": list(x.words), "rss_known": x.rss_known,
                       "rows": [{"figure": k, "a": a, "b": b} for k, a, b in x.rows]}}


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
