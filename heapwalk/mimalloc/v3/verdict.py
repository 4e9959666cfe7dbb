"""The verdict on mimalloc 3's report, in its words: pages, arenas, abandoned pages, the purge."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, scan_sentence, unknown_ram
from heapwalk.mimalloc.account import EXITED, Owner
from heapwalk.mimalloc.decode import MiState
from heapwalk.mimalloc.shown import collect_resident, drift_sentence, totals
from heapwalk.mimalloc.verdict import row_namer

__all__ = ["advice3"]


def advice3(state: MiState, owners: list[Owner], rep: Report, threads: dict | None = None) -> list[str]:
    """The verdict's sentences on mimalloc 3's STATE, report REP."""
    t = totals(state)
    blocks = sum(o.free["free blocks"] + o.free["not yet cut"] for o in owners)
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    out = [f"mimalloc holds {human(t['reserved'])} of address space ({human(t['committed'])} committed){held}: "
           f"{human(rep.in_use)} in blocks the program holds, {human(rep.free)} free ({human(blocks)} in its pages, "
           f"{human(t['arena_free'])} in free slices of its {t['arenas']} arenas), "
           f"{human(sum(o.overhead for o in owners))} its own."]
    if state.layout.stat_drifts:
        out.append(drift_sentence(state, "what the arenas' bitmaps and the pages from the system hold"))
    out += _own(state, t)
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "block", row_namer(owners, threads or {}, state.exited_row)))
    abandoned = next((o for o in owners if o.thread_id == EXITED and o.segments), None)
    if abandoned is not None:
        out.append(f"{len(abandoned.segments)} pages ({human(abandoned.reserved)}) are abandoned, with "
                   f"{human(abandoned.in_use)} of blocks in use: a thread gives up a full page beyond the few it keeps "
                   "(page_full_retain), and all its pages when it exits. The next thread that frees a block in one "
                   "takes it; one not full also serves the next thread that needs a page of its size. Until then "
                   f"their free memory ({human(sum(abandoned.free.values()))}) serves no one.")
    purge = _purge(state, t)
    if purge and collect_resident(state) is None:     # a plain core: what the purge saves is at most this
        purge.insert(0, unknown_ram("mimalloc"))
    out += purge
    return out


def _own(state: MiState, t: dict) -> list[str]:
    """mimalloc's own figures (3.6), where they are not heapwalk's, and why."""
    if "own_committed" not in t or t["own_committed"] == t["committed"] and t["own_reserved"] == t["reserved"]:
        return []
    gap = t["committed"] - t["own_committed"]
    why = " (when it frees a page it took from the system it takes that page's whole rounded reservation off, " \
        "more than it had counted)" if state.layout.os_free_drifts and gap > 0 else ""
    return [f"mimalloc's own figures (mi_stats_print, mi_process_info) say {human(t['own_reserved'])} reserved and "
            f"{human(t['own_committed'])} committed: its committed figure is {human(abs(gap))} "
            f"{'below' if gap > 0 else 'above'} what its pages and tables hold committed{why}; heapwalk counts what "
            "they hold."]


def _purge(state: MiState, t: dict) -> list[str]:
    """What waits for the purge delay in the arenas, and what mi_collect(true) on the main thread gives back now."""
    if not t["collect_purges"]:
        return []
    option = state.discovery.options.get("purge_delay")
    delay = f" (purge_delay: {option.value} ms, {option.how})" if option else ""
    out = [f"{human(t['purge_pending'])} of free arena slices are committed and wait for the purge delay{delay} "
           "before mimalloc purges them, at a later allocation or free after the delay."] if t["purge_pending"] else []
    ram = collect_resident(state)
    resident = "" if ram is None else f", {human(ram)} of it resident (what the RSS falls by)"
    counted = "and takes it off its committed figure" if state.layout.purge_counted else \
        "but its committed figure stays: on Linux a purge only tells the system the memory is unused"
    group = max((a.purge_group for a in state.discovery.arenas), default=1)
    left = sum(b - a for x in state.discovery.arenas for a, b in x.purge_ranges()) - \
        sum(b - a for x in state.discovery.arenas for a, b in x.purged_ranges())
    which = "every waiting slice" if group == 1 else \
        f"the waiting slices in whole aligned groups of {group} ({human(group * 65536)}, its minimal purge size" + \
        (f"; the other {human(left)} wait until their group is all free)" if left else ")")
    out.append(f"mi_collect(true) on the main thread purges {human(t['collect_purges'])} now{resident}: {which}, "
               f"and the main thread's pages that hold no block; {counted}. It costs page faults only when that "
               "memory is used again.")
    return out
