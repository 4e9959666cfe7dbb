"""The verdict on mimalloc's report, in mimalloc's words, each sentence with its figures."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, scan_sentence
from heapwalk.mimalloc.account import EXITED, Owner
from heapwalk.mimalloc.decode import MiState
from heapwalk.mimalloc.shown import collect_resident, drift_sentence, totals

__all__ = ["advice"]


def advice(state: MiState, owners: list[Owner], rep: Report) -> list[str]:
    """The verdict's sentences on STATE's report REP."""
    reserved, committed = state.reserved(), state.committed()
    blocks = sum(o.free["free blocks"] for o in owners)
    spans = sum(o.free["free spans"] for o in owners)
    arena = state.arena_free()
    unused = f", {human(arena)} in arena blocks no segment uses" if arena else ""
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    out = [f"mimalloc holds {human(reserved)} of address space ({human(committed)} committed){held}: "
           f"{human(rep.in_use)} in blocks the program holds, {human(rep.free)} free ({human(blocks)} in free blocks "
           f"of its pages, {human(spans)} in free spans of its segments{unused}), "
           f"{human(sum(o.overhead for o in owners))} its own."]
    if state.layout.stat_drifts:
        out.append(drift_sentence(state, "what the segments' commit masks and the arenas hold"))
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "block"))
    exited = next((o for o in owners if o.thread_id == EXITED and o.segments), None)
    if exited is not None:
        out.append(f"{len(exited.segments)} segments ({human(exited.reserved)}) are abandoned: their threads exited "
                   f"with {human(exited.in_use)} of blocks still in use in them. mimalloc gives them to the next "
                   "thread that needs a segment, or to mi_collect(true) on the main thread; until then their free "
                   f"memory ({human(sum(exited.free.values()))}) serves no one.")
    out += _purge(state, owners)
    return out


def _purge(state: MiState, owners: list[Owner]) -> list[str]:
    """What waits for the purge delay, and what mi_collect(true) on the main thread gives back now: it reclaims
    the abandoned segments and decommits what waits in them (the delay long past); each live thread's waiting
    slices go back when that thread next takes a page after the delay."""
    pending = sum(o.pending for o in owners)
    if not pending:
        return []
    t = totals(state)
    exited = t["collect_purges"]
    name = next((n for n in ("purge_delay", "decommit_delay") if n in state.discovery.options), "")
    option = state.discovery.options.get(name)
    delay = f" ({name}: {option.value} ms, {option.how})" if option else ""
    out = [f"{human(pending)} of free slices are committed and wait for the purge delay{delay} before mimalloc "
           "decommits them; a thread decommits its own when it next takes a page after the delay."]
    if exited:
        ram = collect_resident(state)
        resident = "" if ram is None else f", {human(ram)} of it resident (what the RSS falls by)"
        more = "; and the thread data it keeps for new threads, and the arenas' blocks waiting to be purged" \
            if state.layout.collect_frees_cache else ""
        counted = "" if t["collect_decommits"] == exited else \
            f" Its committed figure falls by {human(t['collect_decommits'])} only: on Linux a purge only tells the " \
            "system the memory is unused."
        out.append(f"mi_collect(true) on the main thread gives back {human(exited)} now{resident}: the abandoned "
                   f"segments' waiting slices, as it reclaims them{more}.{counted} It costs page faults only when "
                   "that memory is used again.")
    return out
