"""jemalloc's verdict: plain sentences, each with its numbers, on where the pages jemalloc holds are and
what would give them back: dirty and muzzy pages that decay returns and when, arenas that never decay and
why, retained address space, partly used slabs, thread caches, and the remedies with what each costs."""

from __future__ import annotations

from heapwalk.analysis.inuse import LeakTotals
from heapwalk.analysis.report import human, leaking, scan_sentence
from heapwalk.jemalloc.decay import never_decaying, overdue
from heapwalk.jemalloc.heapmap import sampled, sampled_extents
from heapwalk.jemalloc.model import JeArena, JeState
from heapwalk.common.view import ArenaView

__all__ = ["advice"]

MiB = 1 << 20


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _names(arenas: list[JeArena]) -> str:
    numbers = [str(a.index) for a in arenas]
    return ("arena " if len(numbers) == 1 else "arenas ") + ", ".join(numbers)


def advice(state: JeState, rows: tuple[ArenaView, ...], leaks: LeakTotals | None = None) -> tuple[str, ...]:
    """The verdict on STATE, whose arenas' bytes by what holds them are ROWS, the most telling sentence first;
    LEAKS: what the leak scan found, when it ran."""
    if not state.arenas:
        return ("jemalloc holds no arenas.",)
    return tuple(s for s in (_headline(state, rows, leaks), _scan(leaks), *_decay(state), _muzzy(state),
                             _retained(state), _slabs(state), _tcache(state), _profiled(state)) if s)


def _scan(leaks: LeakTotals | None) -> str:
    """What the leak scan found over jemalloc's allocations ("" when it did not run)."""
    return "" if leaks is None else scan_sentence(leaks, "allocation")


def _profiled(state: JeState) -> str:
    """What heap profiling's sampled allocations cost: each small one sampled takes an extent of its own."""
    if state.extents is None:
        return ""
    count = sampled(state.extents)
    if not count:
        return ""
    table = state.extents
    held = int(table.size[sampled_extents(table)].sum())
    return (f"Heap profiling is on (opt.prof): {count} small allocations it sampled hold an extent of their own, "
            f"{human(held)} in all (counted as {human(table.classes.large_size(0))} allocations of the smallest "
            "large class in the arenas' statistics); a larger lg_prof_sample samples fewer.")


def _headline(state: JeState, rows: tuple[ArenaView, ...], leaks: LeakTotals | None = None) -> str:
    """Held free by the allocator, in use by the program (live or leaked, as far as the leak scan LEAKS tells),
    or neither: the ROWS' figures, of the pages the arenas hold (active, dirty and muzzy)."""
    dirty, muzzy, slabs, cached = (sum(r.free[k] for r in rows) for k in ("dirty", "muzzy", "slabs", "tcache"))
    in_use = sum(r.in_use for r in rows)
    held = sum(a.active_bytes for a in state.arenas) + dirty + muzzy
    idle = dirty + muzzy + slabs + cached
    if not held:
        return "jemalloc's arenas hold no pages."
    if idle >= 0.25 * held and idle >= MiB:
        return (f"Held free by jemalloc{', and a leak' if leaking(leaks) else ', not a leak'}: {human(idle)} of "
                f"the {human(held)} of pages its arenas hold "
                f"({_pct(idle, held)}) is free: {human(dirty)} in dirty pages (freed, not yet purged: in the RSS "
                f"while in RAM, until decay purges them), {human(muzzy)} muzzy, {human(slabs)} in partly used slabs, "
                f"{human(cached)} in thread caches; {human(in_use)} is in use; {_free_in_ram(rows)}.")
    if in_use >= 0.75 * held:
        share = (f"{human(in_use)} of the {human(held)} of pages jemalloc holds ({_pct(in_use, held)}) is in "
                 "allocations the program holds")
        if leaks is None:
            return (f"Memory in use, not held free: {share}. That is live data or a leak: 'heapwalk leaks' in gdb "
                    "finds the allocations nothing points to; two captures some time apart and 'heapwalk diff' "
                    "show which arenas grow.")
        if leaking(leaks):
            return (f"A leak, not memory held free: {share}; {human(leaks.leaked_bytes)} of it "
                    f"({_pct(leaks.leaked_bytes, leaks.in_use_bytes)}) is in {leaks.leaked_count} allocations that "
                    "nothing reachable points to any more.")
        return (f"Live data, neither a leak nor memory held free: {share}, and the leak scan reaches nearly all of "
                "it from the program's roots. What it is shows above, by size and signature; two captures some "
                "time apart and 'heapwalk diff' show which of it grows.")
    return (f"{human(in_use)} in use and {human(idle)} free of the {human(held)} of pages jemalloc holds: "
            "neither free pages nor growth stands out.")


def _free_in_ram(rows: tuple[ArenaView, ...]) -> str:
    """How much of the arenas' free bytes is in RAM, as the target says (a capture's or a live process's page
    map), or that a plain core does not say."""
    known = [r.free_resident for r in rows]
    if not rows or any(k is None for k in known):
        return "how much of the free memory is in RAM a plain core does not say ('heapwalk capture' does)"
    return f"{human(sum(known))} of the free memory is in RAM (the rest was never touched, or is swapped out)"


def _decay(state: JeState) -> list[str]:
    """Dirty pages: those no thread will ever decay (and the remedies), those decay will return, and those
    kept because decay is off."""
    out = []
    stuck = [arena for arena, _ in never_decaying(state)]
    if stuck:
        out.append(_stuck(state, stuck))
    rest = [a for a in state.arenas if a.pdirty and a not in stuck]
    decaying = [a for a in rest if a.dirty_decay_ms > 0]
    if decaying:
        dirty = sum(a.dirty_bytes for a in decaying)
        times = sorted({a.dirty_decay_ms for a in decaying})
        background = state.background_running
        driver = ("jemalloc's background threads purge them on time" if background is True else
                  "decay advances only while threads of the arena call the allocator (background_thread is "
                  f"{'off' if background is False else 'not known'}; background_thread:true purges them on time "
                  "even while the threads are idle)")
        at_once = "" if background is True else (
            f" To return freed pages at once: {state.conf_variable}=dirty_decay_ms:0 (an madvise call per freed page "
            "run, and a page fault when one is reused).")
        out.append(f"{human(dirty)} of dirty pages in {_names(decaying)} will be returned gradually over "
                   f"dirty_decay_ms ({' / '.join(map(str, times))} ms) after they were freed: {driver}.{at_once}")
        out.append(_overdue(state, decaying))
    off = [a for a in rest if a.dirty_decay_ms < 0]
    if off:
        out.append(f"{human(sum(a.dirty_bytes for a in off))} of dirty pages in {_names(off)} are never "
                   f"purged: dirty_decay_ms is -1 (decay off). {state.conf_variable}=dirty_decay_ms:N "
                   "(milliseconds) turns it on.")
    return out


def _overdue(state: JeState, decaying: list[JeArena]) -> str:
    """Which of the DECAYING arenas' decay is overdue at the snapshot, and what that means; or that it is not
    known (a core that does not record the process's clock)."""
    late = overdue(state)
    if late is None:
        return ("Whether their decay is overdue is not known: this core does not record the process's clock "
                "('heapwalk capture' and a live process do).")
    late = [(a, due, stepped) for a, due, stepped in late if a in decaying]
    dirty = sum(a.dirty_bytes for a, _, _ in late)
    if dirty < MiB:                        # a few pages overdue are no finding (4 KiB on an idle Apache)
        return ""
    due = min(d for _, d, _ in late) / 1e9
    stepped = min(s for _, _, s in late) / 1e9
    aged = all(s >= a.dirty_decay_ms * 1e6 for a, _, s in late)
    head = (f"Overdue: the decay of {_names([a for a, _, _ in late])} ({human(dirty)} of dirty pages) was due to "
            f"step at least {due:.3g} s before the snapshot, and last stepped at least {stepped:.3g} s before it: ")
    if state.background_running is True:
        return head + ("jemalloc's background threads had not stepped it yet; they purge these pages when they next "
                       "wake (at the decay's next deadline as they reckoned it, or when enough new dirty pages wake "
                       "them).")
    return (head + "no thread of theirs has called jemalloc since"
            + (" and no background thread purged them" if state.background_running is False else "")
            + (", so the pages stay until one does; they are all older than dirty_decay_ms, and the next call "
               "purges them at once." if aged else ", so the pages stay until one does."))


def _stuck(state: JeState, stuck: list[JeArena]) -> str:
    """The 5.1 and 5.2 bug in numbers, and the remedies with what each costs."""
    dirty = sum(a.dirty_bytes for a in stuck)
    times = " / ".join(map(str, sorted({a.dirty_decay_ms for a in stuck})))
    workers = state.opt.get("max_background_threads")
    threads = f"up to {workers} threads" if isinstance(workers, int) else "a few threads"
    return (f"Not decaying: {human(dirty)} of dirty pages in {_names(stuck)} have never been purged "
            f"(dirty_npurge 0) although dirty_decay_ms is {times}: no thread using them holds a decay ticker, "
            "and in jemalloc 5.1 and 5.2 a thread whose first call was free() never gets one. Remedies: "
            f"{state.conf_variable}=dirty_decay_ms:0 returns freed pages at once (an madvise call per freed page "
            f"run and a page fault when one is reused); background_thread:true purges on time ({threads} of jemalloc's "
            "own); a malloc and free at each thread's start gives it a ticker at no run-time cost; "
            "jemalloc 5.3 sets the ticker up with each thread.")


def _muzzy(state: JeState) -> str:
    muzzy = [a for a in state.arenas if a.pmuzzy]
    if not muzzy:
        return ""
    times = " / ".join(map(str, sorted({a.muzzy_decay_ms for a in muzzy})))
    return (f"{human(sum(a.muzzy_bytes for a in muzzy))} of muzzy pages in {_names(muzzy)} were given back "
            "lazily (MADV_FREE): the kernel takes them when memory runs short and counts them in RSS until then; "
            f"muzzy_decay_ms ({times}) purges them for good, {state.conf_variable}=muzzy_decay_ms:0 at once.")


def _retained(state: JeState) -> str:
    retained = sum(a.retained for a in state.arenas)
    if retained < MiB:
        return ""
    return (f"{human(retained)} of address space is retained (opt.retain): purged pages jemalloc keeps mapped "
            "to reuse. It is not resident and costs virtual size only.")


def _slabs(state: JeState) -> str:
    """Partly used slabs: the size classes with the most free bytes in their slabs."""
    by_size = state.slabs_by_size()
    free = sum(row.free for row in by_size.values())
    slabs = sum(a.slab_bytes() for a in state.arenas)
    if free < MiB or free < 0.25 * slabs:
        return ""
    worst = sorted(by_size.items(), key=lambda item: -item[1].free)[:3]
    named = "; ".join(f"{size} B: {row.nonfull} of {row.slabs} slabs not full, {_pct(row.used, row.regions)} of "
                      "regions used" for size, row in worst)
    return (f"{human(free)} of the {human(slabs)} in slabs is free regions ({named}): a slab goes back to its "
            "arena only when its last region is freed, so long-lived small objects among short-lived ones keep "
            "whole slabs.")


def _tcache(state: JeState) -> str:
    cached = sum(t.tcache_bytes for t in state.threads)
    users = sum(1 for t in state.threads if t.tcache)
    if cached < MiB:
        return ""
    return (f"{human(cached)} sits in the thread caches of {users} threads: freed regions each keeps for reuse, "
            "flushed as the thread goes on allocating or when it exits; opt.tcache_max lowers what they may hold.")
