"""The verdict on mallocng's report, each sentence with its figures: where its memory is, what is kept for the
allocations still alive beside it, and what musl would give back on its own (it has no call that gives memory
back: a group's mapping goes back when every slot in it is free)."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, scan_sentence
from heapwalk.musl.account import Tally
from heapwalk.musl.model import AVAILABLE, FREED, UNUSED

__all__ = ["advice"]


def advice(t: Tally, rep: Report) -> list[str]:
    """The verdict's sentences on the tally T of report REP."""
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    large = f"; {human(t.large_bytes)} more in {t.large_count} requests mapped on their own" if t.large_count else ""
    out = [f"musl's malloc holds {human(t.system)} in its groups{held}: {human(t.in_use)} asked for by allocations "
           f"the program holds, {human(t.free_total)} in free slots ({human(t.free[FREED])} freed, "
           f"{human(t.free[AVAILABLE])} available, {human(t.free[UNUSED])} never used), {human(t.overhead)} its own "
           f"(headers, slack in slots, meta areas){large}."]
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "allocation", lambda n: f"row {n}"))
    if t.trapped:
        out.append(f"{human(t.trapped)} of the free slots lie in groups that still hold an allocation: musl gives a "
                   "group's memory back only when every slot in it is free, and has no call (no malloc_trim) that "
                   "gives back part of one; they serve only new requests of their own size class.")
    if t.empty_bytes:
        out.append(f"{human(t.empty_bytes)} are in groups with nothing in use that musl keeps (memory given to malloc "
                   "at start, or the last group of a class it saw freed and made again in quick turns).")
    return out
