"""What CPython printed at a reproducer's snapshot (cores/cpython/pyobjects.py: sys._debugmallocstats() in
stats.txt), and a report's JSON held to it: every total and every size class's row."""

from __future__ import annotations

import re
from pathlib import Path

TOTALS = {"# bytes in allocated blocks": "bytes_in_allocated_blocks",
           "# bytes in available blocks": "bytes_in_available_blocks",
           "# bytes lost to pool headers": "bytes_lost_to_pool_headers",
           "# bytes lost to quantization": "bytes_lost_to_quantization",
           "# bytes lost to arena alignment": "bytes_lost_to_arena_alignment",
           "# arenas allocated current": "arenas", "Total": "total"}


def printed(path: Path) -> tuple[dict, dict]:
    """What sys._debugmallocstats() printed: its totals by the document's names, and each class's row."""
    text = path.read_text()
    totals = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() in TOTALS and "arena map" not in line:
            totals.setdefault(TOTALS[name.strip()], int(value.strip().replace(",", "")))
    unused = re.search(r"^(\d+) unused pools \* (\d+) bytes", text, re.M)
    totals["unused_pools"], totals["pool_size"] = int(unused[1]), int(unused[2])
    classes = {int(m[1]): tuple(map(int, m.groups()[1:]))
               for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", text, re.M)}
    return totals, classes


def obmalloc(doc: dict) -> dict:
    """The obmalloc document in a report's JSON (beside malloc's, or alone)."""
    return doc if doc.get("allocator") == "cpython" else doc["cpython_obmalloc"]


def matches(doc: dict, stats: Path) -> None:
    totals, classes = printed(stats)
    ob = obmalloc(doc)["obmalloc"]
    assert {k: ob["totals"][k] for k in totals} == totals
    assert {c["class"]: (c["size"], c["pools"], c["blocks_in_use"], c["available_blocks"])
            for c in ob["classes"]} == classes
    assert not [f for f in obmalloc(doc)["findings"] if f["severity"] != "info"], obmalloc(doc)["findings"]
