"""What mimalloc printed at a reproducer's snapshot (cores/mimalloc/mi_hold.c: mi_stats_print's table and the
process figures in stats.json, a ledger of each heap's blocks), and a report's JSON held to it figure by figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

from heapwalk.mimalloc.find import version_of

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "Ki": 1000, "Mi": 1000 ** 2, "Gi": 1000 ** 3}
AMOUNT = re.compile(r"(-?\d+(?:\.\d+)?)(?: (GiB|MiB|KiB|Ki|Mi|Gi|B)\b)?")


def current(text: str, label: str, nth: int = 0) -> tuple[float, int]:
    """The 'current' column of mi_stats_print_out's NTH line labelled LABEL: (value, its unit in bytes).  From
    3.2 its table has no 'freed' column, and pads its labels before the colon."""
    lines = [line for line in text.splitlines() if ":" in line and line.split(":", 1)[0].strip() == label]
    amounts = AMOUNT.findall(lines[nth].split(":", 1)[1])
    value, unit = amounts[3 if "freed" in text.splitlines()[0 if "freed" in text else 1] else 2]
    return float(value), UNITS[unit] if unit else 1


def ledger(run: Path) -> dict[str, dict]:
    """Each ledger's heap ("parks"/"exits"/"main" and its address), and the blocks in use at the snapshot: those
    its walk listed and its huge block, less those freed after it (by the thread itself, or by the main thread)."""
    freed, out = set(), {}
    for path in sorted(run.glob("ledger-*.txt")):
        lines = [line.split() for line in path.read_text().splitlines()]
        freed |= {int(p[1], 16) for p in lines if p[0] == "f"}
        out[path.name] = {"how": lines[0][0], "heap": int(lines[0][1], 16),
                          "blocks": {int(p[1], 16): int(p[2], 16) for p in lines if p[0] in "bk"}}
    for entry in out.values():
        entry["blocks"] = {a: s for a, s in entry["blocks"].items() if a not in freed}
    return out


def common(doc: dict, run: Path, version: str, said: bool) -> tuple[dict, dict]:
    """What every mimalloc says alike: DOC's version (none when not SAID), committed to the byte and reserved to
    its rounding, as RUN's stats.json printed them; (the statistics, DOC's mimalloc part)."""
    stats = json.loads((run / "stats.json").read_text())
    m = doc["mimalloc"]
    totals = m["totals"]
    assert m["version"] == (version if said else None)
    assert ".".join(map(str, version_of(stats["version"]))) == version
    assert totals["committed"] == stats["process"]["current_commit"]
    value, unit = current(stats["stats"], "reserved")
    assert abs(totals["reserved"] - value * unit) <= 0.1 * unit
    return stats, m


def check(doc: dict, run: Path, version: str = "2.0.9", said: bool = True) -> None:
    """DOC (a report's JSON) gives the figures mimalloc VERSION printed in RUN and its ledgers' blocks, heap by
    heap (before 2.0.9 a huge block's segment belongs to no thread: its own row).  A build linked into the
    program does not say its version (not SAID)."""
    stats, m = common(doc, run, version, said)
    totals = m["totals"]
    assert totals["segments"] == current(stats["stats"], "segments")[0]
    assert totals["segments_abandoned"] == current(stats["stats"], "-abandoned", 0)[0] > 0
    assert totals["pages_abandoned"] == current(stats["stats"], "-abandoned", 1)[0] > 0
    heaps = {h["address"]: h for h in m["heaps"]}
    owners = {o["owner"]: o for o in m["owners"]}
    unowned = version < "2.0.9"
    huge = {a: s for e in ledger(run).values() for a, s in e["blocks"].items() if s >= 32 << 20}
    for name, entry in ledger(run).items():
        blocks = {a: s for a, s in entry["blocks"].items() if not (unowned and a in huge)}
        if entry["how"] == "exits":            # its heap is gone: its blocks are the exited threads' share
            got = owners["exited threads"]
            assert (got["blocks"], got["in_use"]) == (len(blocks), sum(blocks.values())), name
        else:
            assert heaps[entry["heap"]]["in_use"] == sum(blocks.values()), name
    if unowned:
        got = owners["huge blocks (no thread)"]
        assert (got["blocks"], got["in_use"]) == (len(huge), sum(huge.values())) and len(huge) == 5
    assert sum(o["in_use"] for o in m["owners"]) == sum(sum(e["blocks"].values()) for e in ledger(run).values())
    assert totals["freed_segments"] == 0
    assert all(o["in_use"] + sum(o["free"].values()) + o["overhead"] == o["reserved"] for o in m["owners"])
