"""The verdict on mimalloc's report, in mimalloc's words, each sentence with its figures."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, scan_sentence
from heapwalk.mimalloc.account import EXITED, Owner
from heapwalk.mimalloc.decode import MiState

__all__ = ["advice"]


def advice(state: MiState, owners: list[Owner], rep: Report) -> list[str]:
    """The verdict's sentences on STATE's report REP."""
    reserved, committed = state.reserved(), state.committed()
    blocks = sum(o.free["free blocks"] for o in owners)
    spans = sum(o.free["free spans"] for o in owners)
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    out = [f"mimalloc holds {human(reserved)} of address space ({human(committed)} committed){held}: "
           f"{human(rep.in_use)} in blocks the program holds, {human(rep.free)} free ({human(blocks)} in free blocks "
           f"of its pages, {human(spans)} in free spans of its segments), {human(sum(o.overhead for o in owners))} "
           "its own."]
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "block"))
    exited = next((o for o in owners if o.thread_id == EXITED and o.segments), None)
    if exited is not None:
        out.append(f"{len(exited.segments)} segments ({human(exited.reserved)}) are abandoned: their threads exited "
                   f"with {human(exited.in_use)} of blocks still in use in them. mimalloc gives them to the next "
                   "thread that needs a segment, or to mi_collect(true) on the main thread; until then their free "
                   f"memory ({human(sum(exited.free.values()))}) serves no one.")
    pending = sum(o.pending for o in owners)
    if pending:
        out.append(f"{human(pending)} of free slices are committed and wait for the purge delay "
                   "(MIMALLOC_DECOMMIT_DELAY in 2.0, MIMALLOC_PURGE_DELAY from 2.1) before mimalloc decommits them.")
    return out
