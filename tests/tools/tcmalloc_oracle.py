"""What gperftools' tcmalloc printed at a reproducer's snapshot (cores/tcmalloc/tc_hold.c: tc_version, every
MallocExtension numeric property and GetStats's text in stats.json, a ledger of each thread's blocks), and a
report's JSON held to it figure by figure."""

from __future__ import annotations

import re
from pathlib import Path


def check(doc: dict, stats: dict, version: str) -> None:
    """DOC (a report's JSON) says VERSION and every property STATS printed, as many thread caches as the text
    counts, and its free spans by length."""
    tc_doc = doc["tcmalloc"]
    assert f"gperftools {tc_doc['version']}" == stats["version"] and tc_doc["version"] == version
    assert tc_doc["page_size"] == 8192
    want = stats["properties"]
    assert {k: v for k, v in tc_doc["properties"].items() if k in want} == want     # all it printed, each equal
    assert f"{len(tc_doc['threads'])}              Thread heaps in use" in stats["stats"]
    assert spans_by_length(stats["stats"]) == {r["pages"]: r["normal_spans"] + r["returned_spans"]
                                               for r in tc_doc["free_spans"]}
    unmapped = sum(r["returned_bytes"] for r in tc_doc["free_spans"])
    assert unmapped == want["tcmalloc.pageheap_unmapped_bytes"]


def spans_by_length(text: str) -> dict:
    """The free spans MallocExtension_GetStats lists, by length ("N pages * S spans"; the large ones, None)."""
    out = {int(n): int(c) for n, c in re.findall(r"^\s*(\d+) pages \*\s*(\d+) spans", text, re.M) if int(c)}
    large = re.search(r"^\s*>\s*\d+\s+large \*\s*(\d+) spans", text, re.M)
    if large and int(large.group(1)):
        out[None] = int(large.group(1))
    return out


def ledgers(run: Path, freed: list | None = None) -> tuple[dict[int, int], dict[int, int]]:
    """The blocks tc_hold's parked threads kept, and those its exiting thread kept (address -> size); the last
    block each parked thread freed, into FREED."""
    parked, exited = {}, {}
    for path in sorted(run.glob("ledger-*.txt")):
        first, *lines = path.read_text().split("\n")
        how, last = first.split()
        into = exited if how == "exits" else parked
        if freed is not None and how == "parks":
            freed.append(int(last, 16))
        into.update((int(a, 16), int(n, 16)) for a, n in (line.split() for line in lines if line))
    return parked, exited
