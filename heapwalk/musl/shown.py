"""What the commands print of mallocng: its size classes as a table and as JSON, and the groups by where their
memory comes from."""

from __future__ import annotations

from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.musl.account import FREE_KINDS, Tally
from heapwalk.musl.layout import MMAPPED

__all__ = ["classes_table", "classes_document", "groups_document"]


def classes_document(t: Tally) -> list[dict]:
    """Each size class with groups: its slot size, groups, slots; allocations in it and the bytes asked for; slots
    holding smaller groups; free slots by kind (freed, available, unused) and their bytes; groups kept empty."""
    out = []
    for sc in sorted(t.rows):
        r = t.rows[sc]
        out.append({"class": sc, "slot_size": r.slot_size, "groups": r.groups, "slots": r.slots,
                    "in_use": r.in_use, "requested": r.requested, "nested_groups": r.nested,
                    "free_slots": dict(r.free), "free_bytes": {k: v * r.slot_size for k, v in r.free.items()},
                    "empty_groups": r.empty_groups})
    return out


def classes_table(t: Tally, box) -> Table:
    """One row per size class: slot size, groups, slots in use and bytes asked for, free slots by kind."""
    table = Table(title=f"musl malloc size classes ({len([s for s in t.rows if s != MMAPPED])} with groups)", box=box,
                  title_justify="left")
    for name in ("class", "slot", "groups", "in use", "asked for", "groups inside", *FREE_KINDS, "free bytes",
                 "empty groups"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in classes_document(t):
        if row["class"] == MMAPPED:
            continue
        table.add_row(str(row["class"]), str(row["slot_size"]), str(row["groups"]), str(row["in_use"]),
                      human(row["requested"]), str(row["nested_groups"]), *(str(row["free_slots"][k])
                                                                             for k in FREE_KINDS),
                      human(sum(row["free_bytes"].values())), str(row["empty_groups"]))
    return table


def groups_document(t: Tally) -> dict:
    return dict(t.groups)
