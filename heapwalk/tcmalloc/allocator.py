"""gperftools' tcmalloc behind heapwalk's allocator interface (`heapwalk.face`): found where a mapped object
holds it, its state found without symbols (`tcmalloc.discovery`), shown in MallocExtension's words."""

from __future__ import annotations

import functools
from collections import Counter
from types import MappingProxyType

import numpy as np
from rich.text import Text

from heapwalk.face import Allocator, Checked, Context, Decoded, NotUsed, Shown
from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.inferior.ranges import adjacent_runs
from heapwalk.common.findings import Finding
from heapwalk.output.consoles import box_for
from heapwalk.tcmalloc.blocks import tcmalloc_blocks
from heapwalk.tcmalloc.check import CHECKED, check_tcmalloc
from heapwalk.output.jsondoc import report_json
from heapwalk.output.reporttext import report_group
from heapwalk.tcmalloc.decode import IN_USE, NORMAL, RETURNED, TcState, decode_tcmalloc
from heapwalk.tcmalloc.discovery import discover_tcmalloc
from heapwalk.tcmalloc.find import find_tcmalloc
from heapwalk.tcmalloc.heapmap import span_strips
from heapwalk.tcmalloc.metadata import metadata_ranges
from heapwalk.tcmalloc.objects import SpanTable, cached_objects
from heapwalk.tcmalloc.page import tcmalloc_facts, tcmalloc_sections
from heapwalk.tcmalloc.owners import cache_owners
from heapwalk.tcmalloc.spans import columns
from heapwalk.tcmalloc.shown import (class_rows, free_spans, free_spans_table, threads_document,
                                     threads_table)
from heapwalk.tcmalloc.verdict import advice
from heapwalk.common.view import ArenaView, HeapStrip, HeapView, Words

__all__ = ["TCMALLOC", "TcmallocHeap", "FREE_KINDS"]

#: where tcmalloc's free bytes are, in the order its statistics list them
FREE_KINDS = ("thread caches", "transfer cache", "central cache", "page heap", "unmapped")

WORDS = Words(
    holds="tcmalloc's page heap holds", system="heap size", heaps="page heaps", pieces="objects",
    gives_back="ReleaseFreeMemory() gives back", large="", overhead="overhead",
    free_columns=tuple((f"free: {k}" if i == 0 else k, lambda a, k=k: a.free[k]) for i, k in enumerate(FREE_KINDS)),
    last_columns=(("release gives back", lambda a: a.reclaim),), counted="objects")


class TcmallocHeap(Decoded):
    """tcmalloc decoded: its state."""

    name = "tcmalloc"
    title = "tcmalloc"
    beside_key = "tcmalloc"
    damaged_subject = "tcmalloc's state is"
    words = WORDS
    block_noun = "object"
    scans_leaks = True

    def __init__(self, state: TcState, mem, owners: dict | None = None):
        self.state, self.mem = state, mem
        self.owners = owners or {}
        self.target = state.target

    def header(self, with_target: bool = True) -> Text:
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        d = self.state.discovery
        version = f"gperftools {d.version}" if d.version else "gperftools (version not said)"
        text.append(f"tcmalloc: {version} ({d.library}); pages of {d.page_size} bytes, {d.classes} size classes\n")
        unmeasured = next((how for what, how in d.facts if what == "layout" and "(" in how), "")
        if unmeasured:
            text.append(f"tcmalloc: its layout is taken as {unmeasured}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.findings) + list(self.added)

    def view(self) -> HeapView:
        p = self.state.properties()
        free = {"thread caches": p["tcmalloc.thread_cache_free_bytes"],
                "transfer cache": p["tcmalloc.transfer_cache_free_bytes"],
                "central cache": p["tcmalloc.central_cache_free_bytes"],
                "page heap": p["tcmalloc.pageheap_free_bytes"], "unmapped": p["tcmalloc.pageheap_unmapped_bytes"]}
        system = p["generic.heap_size"]
        used = p["generic.current_allocated_bytes"]           # never below 0: damage shows as unbalanced
        released = self.state.resident(NORMAL)
        row = ArenaView(0, self.state.discovery.free_lists, "page heap", len(self.state.threads), 1, system, used,
                        MappingProxyType(free), 0, 0, free["page heap"] if released is None else released,
                        used + sum(free.values()) == system, self.state.resident())
        objects = Counter()
        for c in self.state.classes:
            if c.index:
                objects[c.size] += c.central_objects + c.move * c.transfer_batches + c.thread_objects
        return HeapView(allocator="tcmalloc", arenas=(row,), free_sizes=MappingProxyType({0: +objects}),
                        size_classes=(),
                        arena_limit="one page heap", reclaim_total=free["page heap"],
                        residency=self.state.residency.source if self.state.residency else "")

    def verdict(self, rep: Report) -> list[str]:
        return advice(self.state, rep)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        lines = Text()
        for name, value in self.state.properties().items():
            lines.append(f"{name} {value} ({human(value)})\n")
        *parts, verdict = report_group(rep, interactive, WORDS, lines).renderables
        spans = free_spans_table(free_spans(self.state), self.state.discovery.max_pages, box_for(interactive))
        return [*parts, *([spans] if spans is not None else []), verdict]

    def report_document(self, rep: Report) -> dict:
        d = self.state.discovery
        return {**self.document(), "report": {**report_json(rep), "partial": []},
                "tcmalloc": {"version": d.version, "library": d.library, "page_size": d.page_size,
                             "classes": d.classes, "properties": self.state.properties(),
                             "pageheap": dict(self.state.stats),
                             "spans": self._spans_document(),
                             "free_spans": free_spans(self.state),
                             "threads": threads_document(self.state, self.owners),
                             "size_classes": [{"class": c.index, "size": c.size, "pages": c.pages,
                                               "central_objects": c.central_objects, "spans": c.spans,
                                               "transfer_objects": c.move * c.transfer_batches,
                                               "thread_objects": c.thread_objects}
                                              for c in self.state.classes if c.index],
                             "classes_in_use": class_rows(self.state),
                             "discovery": [{"what": w, "how": h} for w, h in d.facts]}}

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        """'heapwalk threads': each thread cache and the thread it belongs to."""
        return Shown([threads_table(self.state, self.owners, box_for(interactive))],
                     {**self.document(), "threads": threads_document(self.state, self.owners)} if json else None)

    def _spans_document(self) -> dict:
        """The page heap's spans by state: how many, their bytes, and their bytes in RAM (null: unknown)."""
        out, locations = {}, columns(self.state.spans).location
        for name, location in (("in_use", IN_USE), ("free", NORMAL), ("returned", RETURNED)):
            out[name] = {"spans": int(np.count_nonzero(locations == location)), "bytes": self.state.span_bytes(location),
                         "resident": self.state.resident(location)}
        return out

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        """The invariants `tcmalloc.check` holds it to, and what was checked."""
        s = self.state
        return self.checked(check_tcmalloc(s, self.mem, self.span_table, self.cached), limit,
                            f"tcmalloc consistent: checked {'; '.join(CHECKED)} ({len(s.spans)} spans, "
                            f"{len(s.threads)} thread caches, {len(s.classes) - 1} size classes)\n", CHECKED, json)

    @functools.cached_property
    def span_table(self) -> SpanTable:
        """The spans as arrays (`tcmalloc.objects`)."""
        return SpanTable.of(self.state)

    @functools.cached_property
    def cached(self):
        """The free objects the thread and transfer caches hold, walked, and what the walks found."""
        return cached_objects(self.mem, self.state, self.span_table)

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        """The page heap's spans (`tcmalloc.heapmap`)."""
        return span_strips(self.span_table, self.cached[0], self.state.residency, leaked)

    def blocks(self):
        """The objects the program holds, for the leak scan (`tcmalloc.blocks`)."""
        return tcmalloc_blocks(self.mem, self.state, self.span_table, self.cached, self.metadata)[0]

    @functools.cached_property
    def metadata(self) -> list[tuple[int, int]]:
        """The ranges its known metadata lies in (`tcmalloc.metadata`), those not empty."""
        return [(a, b) for a, b in metadata_ranges(self.state) if b > a]

    @property
    def memory(self):
        return self.mem

    def html(self, document: dict, strips) -> list[str]:
        """The page's sections (`tcmalloc.page`)."""
        return tcmalloc_sections(document, strips, WORDS)

    def html_header(self, document: dict) -> list[tuple[str, str]]:
        return tcmalloc_facts(document)

    def claims(self) -> list[Claim]:
        """Every span the page map names (all the memory tcmalloc took from the system for its heap), and the
        ranges its known metadata lies in (`tcmalloc.metadata`)."""
        table = self.span_table
        return [Claim(a, b, "heap", "tcmalloc: spans", n) for a, b, n in adjacent_runs(table.start, table.end)] \
            + [Claim(a, b, "heap", "tcmalloc: metadata") for a, b in self.metadata]

    def holds(self, rep: Report) -> str:
        return f"tcmalloc holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"


class Tcmalloc(Allocator):
    """gperftools' tcmalloc, where a mapped object holds it."""

    name = "tcmalloc"
    title = "tcmalloc"
    scans_leaks = True
    variables = ("TCMALLOC_",)
    describes = {"report": "its page heap, central free lists, transfer and thread caches, in MallocExtension's "
                           "figures",
                 "threads": "each thread cache, the thread it belongs to, the bytes and objects it holds and its "
                            "limit",
                 "check": "its page map's spans against its heap size, its thread caches' list, its central lists' "
                          "counters, every free list object by object",
                 "map": "its spans: objects in use, free in thread caches, transfer caches and central lists, free "
                        "and returned spans"}

    @property
    def verbs(self):
        from heapwalk.tcmalloc.verbs import VERBS
        return VERBS

    def load(self, context: Context) -> TcmallocHeap:
        target = context.target
        found = find_tcmalloc(target.mem, target.space.mappings)
        if found is None:
            raise NotUsed("tcmalloc is not mapped")
        if found.google:
            raise NotUsed(f"the tcmalloc in {found.path} is Google's, not gperftools'")
        discovered = discover_tcmalloc(target.mem, found)
        state = decode_tcmalloc(target.mem, discovered, target.description, target.residency)
        owners = cache_owners(target.mem, [(t.address, t.tid) for t in state.threads], target.threads)
        return TcmallocHeap(state, target.mem, owners)


TCMALLOC = Tcmalloc()
