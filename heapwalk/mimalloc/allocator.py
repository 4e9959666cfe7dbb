"""Microsoft's mimalloc behind heapwalk's allocator interface (`heapwalk.face`): found where a mapped object
holds it, its state found without symbols (`mimalloc.discovery`), shown in mimalloc's own words."""

from __future__ import annotations

import functools
from collections import Counter
from types import MappingProxyType

from rich.text import Text

from heapwalk.face import Allocator, Checked, Context, Decoded, NotUsed, Shown
from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.common.findings import Finding
from heapwalk.mimalloc.blocks import mimalloc_blocks
from heapwalk.mimalloc.check import check_mimalloc
from heapwalk.mimalloc.account import ARENAS, NO_THREAD, Owner, owners
from heapwalk.mimalloc.decode import MiState, good_size
from heapwalk.mimalloc.discovery import MimallocUnused
from heapwalk.mimalloc.families import FACES, WORDS, decode_any, discover_mimalloc
from heapwalk.mimalloc.find import find_mimalloc
from heapwalk.mimalloc.heapmap import segment_strips
from heapwalk.mimalloc.shown import (collect_resident, options_document, options_line, owner_name, threads_document,
                                     threads_table, totals)
from heapwalk.output.consoles import box_for
from heapwalk.output.jsondoc import report_json
from heapwalk.output.reporttext import report_group
from heapwalk.common.view import ArenaView, HeapStrip, HeapView

__all__ = ["MIMALLOC", "MimallocHeap"]

class MimallocHeap(Decoded):
    """mimalloc decoded: its state, and each owner's share."""

    name = "mimalloc"
    title = "mimalloc"
    beside_key = "mimalloc"
    damaged_subject = "mimalloc's state is"
    words = WORDS
    block_noun = "block"
    scans_leaks = True

    def __init__(self, state: MiState, mem, threads):
        self.state, self.mem = state, mem
        self.face = FACES[state.family]
        self.words = self.face.words
        self.target = state.target
        self.by_tcb = {t.thread_pointer: t for t in threads if t.thread_pointer}

    @functools.cached_property
    def owners(self) -> list[Owner]:
        return owners(self.state)

    def header(self, with_target: bool = True) -> Text:
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        d = self.state.discovery
        version = f"mimalloc {'.'.join(map(str, d.version))}" if d.version else "mimalloc (version not said)"
        text.append(f"mimalloc: {version} ({d.library}); {self.face.memory(d)}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.findings) + list(self.added)

    def view(self) -> HeapView:
        rows = []
        sizes: dict[int, Counter] = {}
        for n, o in enumerate(self.owners):
            resident = self.state.resident(o.ranges())
            free_resident = self.state.resident(o.free_ranges())
            threads = 0 if o.thread_id in NO_THREAD else 1
            rows.append(ArenaView(n, o.heaps[0] if o.heaps else 0, owner_name(o, self.by_tcb, self.state.exited_row), threads,
                                  len(o.segments), o.reserved, o.in_use, MappingProxyType(dict(o.free)), 0,
                                  o.overhead, o.pending, o.balanced, resident, free_resident, None,
                                  _owner_users(o, self.by_tcb)))
            counts = Counter()
            for s in o.segments:
                for p in s.pages:
                    if p.free_cut:
                        counts[p.block_size] += p.free_cut
            sizes[n] = +counts
        return HeapView(allocator="mimalloc", arenas=tuple(rows), free_sizes=MappingProxyType(sizes), size_classes=(),
                        arena_limit="a heap per thread", reclaim_total=sum(r.reclaim for r in rows),
                        residency=self.state.residency.source if self.state.residency else "")

    def verdict(self, rep: Report) -> list[str]:
        return self.face.advice(self.state, self.owners, rep, self.by_tcb)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        lines = Text()
        for name, value in totals(self.state).items():
            shown = f" ({human(value)})" if name in ("reserved", "committed", "purge_pending", "collect_decommits",
                                                     "collect_purges", "arena_free") else ""
            lines.append(f"{name} {value}{shown}\n")
        lines.append(options_line(self.state))
        return [report_group(rep, interactive, self.words, lines)]

    def report_document(self, rep: Report) -> dict:
        d = self.state.discovery
        return {**self.document(), "report": {**report_json(rep), "partial": []},
                "mimalloc": {"version": ".".join(map(str, d.version)) if d.version else None, "library": d.library,
                             "totals": totals(self.state), "collect_resident": collect_resident(self.state),
                             "options": options_document(self.state),
                             "owners": [{"owner": owner_name(o, self.by_tcb, self.state.exited_row), "thread_id": o.thread_id,
                                         "segments": len(o.segments), "reserved": o.reserved,
                                         "committed": o.committed, "in_use": o.in_use, "blocks": o.blocks,
                                         "free": dict(o.free), "overhead": o.overhead, "purge_pending": o.pending,
                                         "thread_data": o.thread_data, "pages": o.pages}
                                        for o in self.owners],
                             "heaps": threads_document(self.state, self.owners, self.by_tcb),
                             "arenas": [{"id": a.id, "start": a.start, "bytes": a.reserved}
                                        for a in self.state.discovery.arenas],
                             "segment_cache": [{"address": s.address, "bytes": s.reserved, "committed": s.committed}
                                               for s in self.state.cached()],
                             "discovery": [{"what": w, "how": h} for w, h in d.facts]}}

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        """The invariants `mimalloc.check` holds it to, and what was checked."""
        checked = self.face.checked
        return self.checked(check_mimalloc(self.mem, self.state), limit,
                            f"mimalloc consistent: checked {'; '.join(checked)} ({self.face.units(self.state)}, "
                            f"{len(self.state.pages())} pages, {len(self.state.heaps)} heaps)\n", checked, json)

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        """'heapwalk threads': each heap and the thread it belongs to."""
        return Shown([threads_table(self.state, self.owners, self.by_tcb, box_for(interactive))],
                     {**self.document(), "heaps": threads_document(self.state, self.owners, self.by_tcb)}
                     if json else None)

    @property
    def memory(self):
        return self.mem

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        """Each live segment (`mimalloc.heapmap`)."""
        owner_of = {s.address: (n, owner_name(o, self.by_tcb, self.state.exited_row))
                    for n, o in enumerate(self.owners) for s in o.segments}
        owner_of.update({"arenas": (n, "arenas") for n, o in enumerate(self.owners) if o.thread_id == ARENAS})
        return segment_strips(self.state, owner_of, self.state.residency, leaked)

    def blocks(self):
        """The blocks the program holds, for the leak scan (`mimalloc.blocks`)."""
        arena_of = {s.address: n for n, o in enumerate(self.owners) for s in o.segments}
        return mimalloc_blocks(self.state, arena_of)

    def claims(self) -> list[Claim]:
        """Every live segment (all the memory mimalloc took for its heaps), each thread data and each part of the
        segment map (from 2.1.8); mimalloc 3: its arenas whole, and its pages taken from the system."""
        td = good_size(self.state.layout.thread_data, self.state.os_page)
        whole = self.state.arenas_whole
        return [Claim(s.address, s.address + s.reserved, "heap", f"mimalloc: {self.state.unit}s")
                for s in self.state.live() if s.arena is None or not whole] \
            + [Claim(a.start, a.start + a.reserved, "heap", "mimalloc: arenas") for a in self.state.discovery.arenas
               if whole] \
            + [Claim(at, at + td, "heap", "mimalloc: thread data") for at, _ in self.state.thread_data] \
            + [Claim(lo, hi, "heap", "mimalloc: segment map") for lo, hi in self.state.map_part_ranges()] \
            + [Claim(lo, hi, "heap", "mimalloc: segment cache") for s in self.state.cached()
               for lo, hi in [(s.address, s.address + s.reserved)]] \
            + [Claim(lo, hi, "heap", "mimalloc: arenas") for lo, hi in self.state.free_arena_blocks()]

    def holds(self, rep: Report) -> str:
        return f"mimalloc holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"


class Mimalloc(Allocator):
    """Microsoft's mimalloc, where a mapped object holds it."""

    name = "mimalloc"
    title = "mimalloc"
    scans_leaks = True
    variables = ("MIMALLOC_",)
    describes = {"report": "its segments (mimalloc 3: arenas) and pages by thread, abandoned memory, free spans or "
                           "slices, in mi_stats' figures",
                 "threads": "each heap, the thread it belongs to, its pages and the bytes its blocks hold",
                 "map": "its segments or arenas: blocks in use, free blocks, pages not yet cut, free spans or "
                        "slices, headers",
                 "check": "every page's counters against its free lists, every segment's page counts (mimalloc 3: "
                          "each arena's pages), every heap's page queues link by link"}

    @property
    def verbs(self):
        from heapwalk.mimalloc.verbs import VERBS
        return VERBS

    def settings_in(self, document: dict) -> str:
        """The options the process's environment set, as mimalloc holds them."""
        options = document.get("mimalloc", {}).get("options", {})
        set_ = [f"{name}={o['value']}" for name, o in options.items() if o["set"] == "from the environment"]
        return f"mimalloc options from the environment: {' '.join(set_)}" if set_ else ""

    def load(self, context: Context) -> MimallocHeap:
        target = context.target
        found = find_mimalloc(target.mem, target.space.mappings)
        if found is None:
            raise NotUsed("mimalloc is not mapped")
        try:
            discovered = discover_mimalloc(target.mem, found, target.space.regions, target.space.mappings,
                                           None if target.space.core else target.space.readable)
        except MimallocUnused as exc:
            raise NotUsed(str(exc)) from None
        state = decode_any(target.mem, discovered, target.threads, target.description, target.residency,
                           target.page_size)
        return MimallocHeap(state, target.mem, target.threads)


MIMALLOC = Mimalloc()


def _owner_users(owner: Owner, by_tcb: dict) -> tuple[str, ...]:
    """The name of the thread whose heap OWNER is ("" when unnamed), none for the owners no thread has."""
    if owner.thread_id in NO_THREAD:
        return ()
    t = by_tcb.get(owner.thread_id)
    return ((t.name or "") if t else "",)
