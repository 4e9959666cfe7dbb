"""The verdict on mimalloc's report, in mimalloc's words, each sentence with its figures."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, scan_sentence, unknown_ram
from heapwalk.mimalloc.account import EXITED, Owner
from heapwalk.mimalloc.collect import reclaimed
from heapwalk.mimalloc.decode import MiState, good_size
from heapwalk.mimalloc.shown import collect_resident, drift_sentence, owner_name, totals

__all__ = ["advice", "row_namer"]


def row_namer(owners: list[Owner], threads: dict, exited: str):
    """How the leak sentence names the report's row N: its number and its owner ("row 5 (exited threads)")."""
    return lambda n: f"row {n} ({owner_name(owners[n], threads, exited)})" if 0 <= n < len(owners) else f"row {n}"


def advice(state: MiState, owners: list[Owner], rep: Report, threads: dict | None = None) -> list[str]:
    """The verdict's sentences on STATE's report REP (THREADS: gdb's threads by thread pointer, to name rows)."""
    reserved, committed = state.reserved(), state.committed()
    blocks = sum(o.free["free blocks"] for o in owners)
    spans = sum(o.free["free spans"] for o in owners)
    arena = state.arena_free()
    unused = f", {human(arena)} in arena blocks no segment uses" if arena else ""
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    ends = sum(s.reserved - good_size(s.slices * state.layout.slice_size, state.os_page) for s in state.live() if s.arena is not None)
    ends = f" ({human(ends)} of it the ends of the arena blocks huge segments take whole)" if ends > 0 else ""
    out = [f"mimalloc holds {human(reserved)} of address space ({human(committed)} committed){held}: "
           f"{human(rep.in_use)} in blocks the program holds, {human(rep.free)} free ({human(blocks)} in free blocks "
           f"of its pages, {human(spans)} in free spans of its segments{unused}), "
           f"{human(sum(o.overhead for o in owners))} its own{ends}."]
    if state.layout.stat_drifts:
        out.append(drift_sentence(state, "what the segments' commit masks and the arenas hold"))
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "block", row_namer(owners, threads or {}, state.exited_row)))
    exited = next((o for o in owners if o.thread_id == EXITED and o.segments), None)
    if exited is not None:
        out.append(f"{len(exited.segments)} segments ({human(exited.reserved)}) are abandoned: their threads exited "
                   f"with {human(exited.in_use)} of blocks still in use in them. mimalloc gives them to the next "
                   "thread that needs a segment, or to mi_collect(true) on the main thread; until then their free "
                   f"memory ({human(sum(exited.free.values()))}) serves no one.")
    purge = _purge(state, owners)
    if purge and collect_resident(state) is None:     # a plain core: what the purge saves is at most this
        purge.insert(0, unknown_ram("mimalloc"))
    out += purge
    out += _eager(state)
    out += _cache(state)
    out += _pinned_arenas(state)
    return out


def _eager(state: MiState) -> list[str]:
    """The free spans committed but not in RAM: nothing touched them since they were committed (with their segment,
    eager commit; or with a page whose blocks did not fill it).  Said when the target says which pages are
    resident and they are at least a tenth of what is committed."""
    spans = [sp for s in state.live() for sp in s.spans]
    ram = state.resident([(sp.segment + sp.index * 65536, sp.segment + (sp.index + sp.slices) * 65536)
                          for sp in spans])
    idle = sum(sp.committed for sp in spans) - (ram or 0)
    if ram is None or idle * 10 < state.committed():
        return []
    option = state.discovery.options.get("eager_commit")
    how = f", eager_commit: {option.value}, {option.how}" if option else ""
    return [f"{human(idle)} of free spans are committed but not in RAM: nothing has touched them since mimalloc "
            f"committed them, with their segment (eager commit{how}) or with a page its blocks did not fill. They "
            "count against the system's commit limit (the overcommit accounting), not the RSS."]


def _cache(state: MiState) -> list[str]:
    """To 2.0.9: the freed segments its cache keeps, committed until the cache decommits them."""
    cached = state.cached()
    if not cached:
        return []
    committed = sum(s.committed for s in cached)
    ram = state.resident([r for s in cached for r in s.committed_ranges()])
    resident = "" if ram is None else f", {human(ram)} resident"
    option = state.discovery.options.get("segment_decommit_delay")
    delay = f" (segment_decommit_delay: {option.value} ms, {option.how})" if option else ""
    collect = "unmaps" if state.layout.collect_unmaps_cache else "decommits"
    said = f"{len(cached)} freed segments ({human(sum(s.reserved for s in cached))}"
    if not committed:
        return [f"{said}, none of it committed) wait in mimalloc's segment cache for reuse, as address space only. "
                f"mi_collect(true) {collect} them."]
    return [f"{said}, {human(committed)} committed{resident}) wait in mimalloc's segment cache for reuse. It "
            f"decommits each once its delay{delay} has passed, but only when a later segment is freed into the "
            f"cache or a collect visits it: an idle process keeps them committed. mi_collect(true) {collect} them "
            "all."]


def _pinned_arenas(state: MiState) -> list[str]:
    """The arenas committed as a whole (reserved committed, or on large OS pages): mimalloc never decommits them,
    so the blocks no segment uses stay counted as committed until the process exits."""
    pinned = [a for a in state.discovery.arenas if a.pinned]
    free = [(lo, hi) for lo, hi in state.free_arena_blocks() if any(a.start <= lo < a.start + a.reserved
                                                                      for a in pinned)]
    if not free:
        return []
    options = state.discovery.options
    said = [f"{n}: {options[n].value}{' KiB' if n in _KIB else ''}" for n in _RESERVING
            if n in options and options[n].value and options[n].how == "from the environment"]
    why = f" ({', '.join(said)}, from the environment)" if said else " (the program's own reservation)"
    ram = state.resident(free)
    resident = "" if ram is None else f", {human(ram)} of it resident"
    size = human(sum(a.reserved for a in pinned))
    return [f"{len(pinned)} arena{'s' if len(pinned) > 1 else ''} of {size} {'are' if len(pinned) > 1 else 'is'} "
            f"committed as a whole{why}: {human(sum(b - a for a, b in free))} of its blocks hold no segment"
            f"{resident}. mimalloc keeps them for the segments to come and never decommits them: they count "
            "against the system's commit limit until the process exits; a reservation sized to what the process uses "
            "avoids that."]


#: the options that make mimalloc reserve arenas at its start (those in KiB)
_RESERVING = ("reserve_os_memory", "reserve_huge_os_pages", "arena_reserve")
_KIB = ("reserve_os_memory", "arena_reserve")


def _purge(state: MiState, owners: list[Owner]) -> list[str]:
    """What waits for the purge delay, and what mi_collect(true) on the main thread gives back now: it reclaims
    the abandoned segments and decommits what waits in them (the delay long past), and (to 2.0.9) unmaps the
    segments in its cache; each live thread's waiting slices go back when that thread next takes a page after the
    delay."""
    pending = sum(o.pending for o in owners)
    out = []
    if pending:
        name = next((n for n in ("purge_delay", "decommit_delay") if n in state.discovery.options), "")
        option = state.discovery.options.get(name)
        delay = f" ({name}: {option.value} ms, {option.how})" if option else ""
        out.append(f"{human(pending)} of free slices are committed and wait for the purge delay{delay} before "
                   "mimalloc decommits them; a thread decommits its own when it next takes a page after the delay.")
    t = totals(state)
    if t["collect_purges"]:
        out.append(_collect_sentence(state, t))
    return out


def _collect_sentence(state: MiState, t: dict) -> str:
    """What mi_collect(true) on the main thread gives back now, and what of it."""
    ram = collect_resident(state)
    resident = "" if ram is None else f", {human(ram)} of it resident (what the RSS falls by)"
    parts = (["the abandoned segments' waiting slices, as it reclaims them"] if reclaimed(state) else []) + \
        ([f"the segments in its cache, which it {'unmaps' if state.layout.collect_unmaps_cache else 'decommits'}"]
         if any(s.committed for s in state.cached()) else [])
    if state.layout.collect_frees_cache:
        parts.append("the thread data it keeps for new threads, and the arenas' blocks waiting to be purged")
    if state.layout.collect_purges_own:
        parts.append("what waits in the main thread's segments, and the pages of its heap that hold no block")
    counted = "" if t["collect_decommits"] == t["collect_purges"] else \
        f" Its committed figure falls by {human(t['collect_decommits'])} only: on Linux a purge only tells the " \
        "system the memory is unused."
    return (f"mi_collect(true) on the main thread gives back {human(t['collect_purges'])} now{resident}: "
            f"{'; and '.join(parts)}.{counted} It costs page faults only when that memory is used again.")
