"""glibc's verdict on its report: plain sentences, each backed by the numbers of the report, that say what
the memory malloc holds is (fragmentation, memory in use, a leak, free memory no longer in RAM), which arenas
hold it, what malloc_trim(0) would give back, and the remedies that fit (MALLOC_ARENA_MAX, malloc_trim,
M_TRIM_THRESHOLD, another allocator), with what each would save."""

from __future__ import annotations

from heapwalk.analysis.report import MiB, Report, human, not_worth, scan_sentence, unknown_ram, worth
from heapwalk.common.view import ArenaView

__all__ = ["verdict", "arena_max_saving", "UNKNOWN_RAM"]

#: what capping the arenas costs, said with the remedy
ARENA_MAX_COST = (" Its cost: threads that had an arena of their own then wait for one another's arena locks; "
                  "measure the throughput under load before and after.")
#: another allocator as a remedy, with what it may break
OTHER_ALLOCATOR = ("an allocator that returns small-object pages (jemalloc, tcmalloc: by LD_PRELOAD, which not "
                   "every program survives; docs/runbook.md says which and how to try it)")

#: what a verdict on free memory adds when the target does not say which pages are in RAM (a plain core)
UNKNOWN_RAM = unknown_ram("malloc")


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _costs(a: ArenaView, ram: bool) -> tuple[int, int]:
    """(bytes held, bytes free with top) of arena A that cost memory: those in RAM when RAM is known, else all."""
    return (a.resident or 0, a.idle_resident or 0) if ram else (a.system, a.idle)


def arena_max_saving(rep: Report, cap: int) -> tuple[int, int, int] | None:
    """What MALLOC_ARENA_MAX=CAP would have saved: (how many arenas it leaves out, the least and the most
    their free memory could be), over the free bytes in RAM when known; None when there are not more
    arenas.  A range, because which thread arenas a cap leaves out depends on the order threads came in
    (the main arena is always there)."""
    ram = bool(rep.residency)
    idle = sorted(_costs(a, ram)[1] for a in rep.arenas if a.kind == "thread")
    beyond = len(idle) + 1 - cap
    if beyond <= 0:
        return None
    return beyond, sum(idle[:beyond]), sum(idle[-beyond:])


def _arena_max_sentence(rep: Report) -> str:
    """The thread arenas' share of the free memory, and what capping their number would have saved."""
    ram = bool(rep.residency)
    threads = [a for a in rep.arenas if a.kind == "thread"]
    held, idle = (sum(x) for x in zip(*(_costs(a, ram) for a in threads)))
    where = " in RAM" if ram else ""
    text = (f"{len(threads)} thread arenas hold {human(held)}{where}, {human(idle)} of it free: each thread that "
            "hits a locked arena gets its own, and their free memory is not shared. MALLOC_ARENA_MAX=2 (or 4) "
            "caps the arena count")
    savings = [(cap, arena_max_saving(rep, cap)) for cap in (2, 4)]
    parts = [f"with {cap}, {n} arena{'s' if n > 1 else ''} fewer, {human(lo)}" + (f" to {human(hi)}" if hi != lo
             else "") for cap, found in savings if found for n, lo, hi in [found]]
    if parts:
        text += (f"; it would have saved the free memory{where} of the arenas beyond the cap: " + "; ".join(parts)
                 + (" (a range: which arenas are left out depends on the order threads came in)" if len(threads) > 1
                    else ""))
    return text + "." + ARENA_MAX_COST


def _fragmentation(rep: Report, held: int, idle: int, ram: bool) -> list[str]:
    """The sentences of a heap whose free memory (in RAM, when known) is a quarter or more of what it holds."""
    kept = _kept_by_threshold(rep, idle, ram)
    title = _fragmentation_title(rep, kept is not None)
    if ram:
        free_res = sum(min(a.free_resident or 0, a.free_total) for a in rep.arenas)
        out = [f"{title}: {human(idle)} of the {human(held)} of malloc's arenas in RAM "
               f"({_pct(idle, held)}) is free (free chunks {human(free_res)}, top chunks {human(idle - free_res)}); "
               f"{human(rep.in_use)} is in use."]
    else:
        out = [f"{title}: {human(idle)} of the {human(held)} malloc holds in its arenas "
               f"({_pct(idle, held)}) is free (free chunks {human(rep.free)}, top chunks {human(rep.top)}); "
               f"{human(rep.in_use)} is in use."]
    if not worth(rep, idle):
        return out + [not_worth(rep, idle, "Trimming, fewer arenas or another allocator")]
    threads = [a for a in rep.arenas if a.kind == "thread"]
    if len(threads) > 1 and sum(_costs(a, ram)[0] for a in threads) >= 0.5 * held:
        thread_idle = sum(_costs(a, ram)[1] for a in threads)
        out.append(_arena_max_sentence(rep) if worth(rep, thread_idle) else
                   not_worth(rep, thread_idle, "MALLOC_ARENA_MAX, or another allocator,"))
    small_free = sum(b.bytes for b in rep.histogram if b.high <= 4096)
    raised = None if kept else _raised_mmap_threshold(rep, idle)
    if kept:
        out.append(kept)
    elif raised:
        out.append(raised)
    elif rep.trim >= 0.1 * idle and rep.trim >= MiB:
        out.append(f"malloc_trim(0) would give back {human(rep.trim)} now: the program calling it (periodically, "
                   "or after peaks) returns such memory without a restart; MALLOC_TRIM_THRESHOLD_ lowers the "
                   "threshold from the next start.")
    elif ram and rep.trim_kept.get("sub_page", 0) >= 0.5 * idle:
        out.append(f"{human(rep.trim_kept['sub_page'])} of free memory lies in pieces under a page (small free "
                   "chunks, and the ends and links of larger ones), which malloc_trim(0) cannot return: it would "
                   f"give back only {human(rep.trim)}. Fewer arenas (above), fewer long-lived small allocations, "
                   f"or {OTHER_ALLOCATOR} would shrink it.")
    elif small_free >= 0.5 * rep.free:
        out.append(f"{human(small_free)} of the free memory is in chunks under 4 KiB "
                   f"({rep.free_chunks} free chunks; fragmentation {rep.fragmentation:.2f}): malloc_trim(0) "
                   f"would return only {human(rep.trim)}. Only fewer long-lived small allocations, or "
                   f"{OTHER_ALLOCATOR}, would shrink it.")
    main = next((a for a in rep.arenas if a.kind == "main"), None)
    top = (min(main.top_resident or 0, main.top) if ram else main.top) if main else 0
    if main and top >= 0.25 * held and main.reclaim < top // 2:
        out.append(f"The main arena's top chunk holds {human(top)}{' in RAM' if ram else ''} that trim cannot "
                   "lower: in-use chunks above it pin the break.")
    return out


#: glibc's trim threshold when nothing raised or set it (DEFAULT_TOP_PAD's neighbour: M_TRIM_THRESHOLD's default)
_DEFAULT_TRIM = 128 * 1024


def _kept_by_threshold(rep: Report, idle: int, ram: bool) -> str | None:
    """The sentence for a main arena whose top chunk holds most of the free memory because it is under the trim
    threshold (glibc gives a top back only past it), with why the threshold is what it is and what lowers it;
    None when that is not the case, or the thresholds are not known."""
    main = next((a for a in rep.arenas if a.kind == "main"), None)
    trim = rep.thresholds.get("trim_threshold")
    if main is None or not isinstance(trim, int) or trim <= _DEFAULT_TRIM:
        return None
    top = min(main.top_resident or 0, main.top) if ram else main.top
    if top < 0.5 * idle or top > trim or top < MiB or main.reclaim < top // 2:
        return None            # (a top trim cannot lower is pinned by the chunks above it: said apart)
    where = " in RAM" if ram else ""
    text = (f"The main arena's top chunk holds {human(top)}{where} of the {human(idle)} free ({_pct(top, idle)}): "
            f"glibc gives a top back only when it grows past the trim threshold, now {human(trim)}")
    mmap = rep.thresholds.get("mmap_threshold")
    if rep.thresholds.get("no_dyn_threshold") == 0:
        raised = f" to {human(mmap)}" if isinstance(mmap, int) else ""
        text += (f", which glibc raised from {human(_DEFAULT_TRIM)} on its own: freeing a chunk it had mmapped "
                 f"raised the mmap threshold{raised} and the trim threshold to twice that (its dynamic "
                 "thresholds). MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ in the environment (from the "
                 "next start) or mallopt(M_TRIM_THRESHOLD) and mallopt(M_MMAP_THRESHOLD) in the program pin both "
                 "and keep them low")
    else:
        text += (", as MALLOC_TRIM_THRESHOLD_ or mallopt(M_TRIM_THRESHOLD) set it: a lower value (from the next "
                 "start, for the variable) returns such a top")
    return text + f"; malloc_trim(0) gives back {human(rep.trim)} now, with neither."


def _raised_mmap_threshold(rep: Report, idle: int) -> str | None:
    """The sentence for free memory held in large chunks because glibc raised its mmap threshold on its own
    (blocks it would have mapped, and given back on free, now come from the arenas); None unless the threshold
    was raised and chunks of 128 KiB or more hold a quarter of the free memory."""
    mmap = rep.thresholds.get("mmap_threshold")
    if rep.thresholds.get("no_dyn_threshold") != 0 or not isinstance(mmap, int) or mmap <= _DEFAULT_TRIM:
        return None
    large = sum(b.bytes for b in rep.histogram if b.low >= _DEFAULT_TRIM)
    if large < 0.25 * idle or large < MiB:
        return None
    return (f"{human(large)} of the free memory is in chunks of {human(_DEFAULT_TRIM)} or more, which glibc "
            f"would have mapped apart and unmapped on free: freeing a chunk it had mmapped raised its mmap "
            f"threshold from {human(_DEFAULT_TRIM)} to {human(mmap)} on its own (its dynamic threshold), so "
            "blocks under that now come from the arenas and stay there when freed. MALLOC_MMAP_THRESHOLD_ in the "
            "environment (from the next start) or mallopt(M_MMAP_THRESHOLD) in the program pins it: such blocks "
            "then get mappings of their own again (a mmap and a munmap each), and go back when freed; "
            f"malloc_trim(0) gives back {human(rep.trim)} now.")


def _fragmentation_title(rep: Report, kept_by_threshold: bool = False) -> str:
    """The verdict's first words for free memory: a leak beside it, or most of it a top chunk glibc keeps under
    its trim threshold (KEPT_BY_THRESHOLD: `_kept_by_threshold` said so), or fragmentation."""
    if rep.leaking:
        return "Fragmentation and a leak"
    if kept_by_threshold:
        return "Free memory glibc keeps under its trim threshold, not fragmentation nor a leak"
    return "Fragmentation, not a leak"


def _leaked_part(rep: Report) -> str:
    """How much of the memory in use the leak scan found leaked, as a clause."""
    lt = rep.leaks
    assert lt is not None
    return (f"{human(lt.leaked_bytes)} of the {human(lt.in_use_bytes)} in the program's chunks "
            f"({_pct(lt.leaked_bytes, lt.in_use_bytes)}) is in {lt.leaked_count} chunks that nothing reachable "
            "points to any more")


def _in_use_sentence(rep: Report, held: int, free_part: str) -> str:
    """The sentence of a heap mostly in use: live data or a leak, as far as the leak scan (if any) tells."""
    share = f"{human(rep.in_use)} of the {human(held)} malloc holds ({_pct(rep.in_use, held)}) is in use"
    if rep.leaks is None:
        return (f"Memory in use, not fragmentation: {human(rep.in_use)} of the {human(held)} malloc holds "
                f"({_pct(rep.in_use, held)}) is in chunks the program still holds, and {free_part}. "
                "That is live data or a leak: 'heapwalk leaks' in gdb finds the chunks nothing points to; two "
                "snapshots taken some time apart ('heapwalk diff A B') show what grows.")
    if rep.leaking:
        return f"A leak, not fragmentation: {share} and {free_part}; {_leaked_part(rep)}."
    return (f"Live data, neither a leak nor fragmentation: {share} and {free_part}, and the leak scan reaches "
            "nearly all of it from the program's roots. What it is shows above, by size and signature; two snapshots "
            "taken some time apart ('heapwalk diff A B') show which of them grows.")


def _scan_sentence(rep: Report) -> str:
    """What the leak scan found, and where to look next."""
    assert rep.leaks is not None
    return scan_sentence(rep.leaks)


def verdict(rep: Report) -> list[str]:
    """Plain sentences, each backed by the numbers above it.  Where the target says which pages are in RAM,
    free memory counts only where it is in RAM: what is not costs address space, not memory."""
    # what the walk found is the whole when a damaged system_mem says less: shares stay within 100%
    held = max(rep.system, rep.in_use + rep.free + rep.top + rep.overhead)
    if not held:
        return ["malloc holds no memory in its arenas."]
    ram = bool(rep.residency)
    idle = rep.free + rep.top
    held_cost, idle_cost = (rep.resident or 0, rep.idle_resident or 0) if ram else (held, idle)
    gone = idle - idle_cost
    out = []
    fragmented = idle_cost >= 0.25 * held_cost and idle_cost >= MiB
    if fragmented and idle_cost >= gone:
        out += _fragmentation(rep, held_cost, idle_cost, ram)
    elif ram and gone >= 0.25 * held and gone >= MiB:
        out.append(f"Free memory, but not in RAM: {human(gone)} of the {human(idle)} free in malloc's arenas is "
                   "no longer resident (given back by malloc_trim or free, or never touched), so it takes address "
                   "space, not memory, and needs no remedy; of the "
                   f"{human(held_cost)} of the arenas in RAM, {human(idle_cost)} is free and {human(rep.in_use)} is "
                   "in use. If RSS still grows, two snapshots taken some time apart ('heapwalk diff A B') show what "
                   "grows.")
        if fragmented:          # what is still in RAM of the free memory, and its remedies
            out += _fragmentation(rep, held_cost, idle_cost, ram)[1:]
    elif rep.in_use >= 0.75 * held:
        free_part = f"only {human(idle_cost)} of free memory is in RAM" if ram else f"only {human(idle)} is free"
        out.append(_in_use_sentence(rep, held, free_part))
    elif rep.leaking:
        out.append(f"A leak, not fragmentation: {_leaked_part(rep)}.")
    else:
        free_part = f"{human(idle_cost)} free in RAM" if ram else f"{human(idle)} free"
        out.append(f"{human(rep.in_use)} in use and {free_part} of the {human(held_cost if ram else held)} "
                   f"malloc holds{' in RAM' if ram else ''}: neither fragmentation nor "
                   f"{'growth' if rep.leaks is None else 'a leak'} stands out.")
    if rep.leaks is not None:
        out.insert(1, _scan_sentence(rep))
    if not ram and out[0].startswith(("Fragmentation", "Free memory glibc keeps")):
        out.insert(2 if rep.leaks is not None else 1, UNKNOWN_RAM)      # after the leak scan's sentence
    if ram and out[0].startswith(("Fragmentation", "Free memory glibc keeps")) and gone >= MiB:
        out.insert(1, f"A further {human(gone)} is free but not in RAM (given back, or never touched): address "
                      "space, not memory.")
    if rep.mmapped_bytes >= 0.25 * (held + rep.mmapped_bytes) and rep.mmapped_bytes >= MiB:
        out.append(f"{human(rep.mmapped_bytes)} is in {rep.mmapped_count} mmapped chunks (requests above "
                   "M_MMAP_THRESHOLD): they return to the system when freed.")
    return out
