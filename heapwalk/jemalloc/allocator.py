"""jemalloc behind heapwalk's allocator interface (`heapwalk.face`): found where a mapped object holds
it, decoded with `jemalloc.load`, shown with jemalloc's tables, documents and page sections in
malloc_stats_print's words."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from rich.text import Text

from heapwalk.analysis.rss import Claim
from heapwalk.face import Allocator, CannotDraw, Checked, Context, Decoded, NotUsed, Shown
from heapwalk.analysis.report import Report, human
from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc import check as je_check
from heapwalk.jemalloc.blocks import jemalloc_blocks
from heapwalk.jemalloc.extents import extent_runs
from heapwalk.jemalloc.find import find_jemalloc
from heapwalk.jemalloc.heapmap import extent_strips
from heapwalk.jemalloc.load import load_jemalloc
from heapwalk.jemalloc.model import JeState
from heapwalk.jemalloc.resident import arena_rss
from heapwalk.jemalloc.summary import heap_view
from heapwalk.jemalloc.verdict import advice
from heapwalk.jemalloc.reportlines import WORDS, summary_lines
from heapwalk.jemalloc import page, shown as jedoc
from heapwalk.output import tables
from heapwalk.output.reporttext import report_group
from heapwalk.output.consoles import box_for
from heapwalk.common.view import HeapStrip

__all__ = ["JEMALLOC", "JemallocHeap"]


class JemallocHeap(Decoded):
    """jemalloc decoded: its state."""

    name = "jemalloc"
    title = "jemalloc"
    beside_key = "jemalloc"
    damaged_subject = "jemalloc's state is"
    words = WORDS
    block_noun = "allocation"

    def __init__(self, state: JeState, mem):
        self.state, self.mem = state, mem
        self.target = state.target
        self._claims: list[Claim] | None = None

    def header(self, with_target: bool = True) -> Text:
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        text.append(f"jemalloc {self.state.version}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.all_findings())

    def with_finding(self, finding: Finding) -> "JemallocHeap":
        return JemallocHeap(dataclasses.replace(self.state, findings=self.state.findings + (finding,)), self.mem)

    def view(self):
        return heap_view(self.state)

    def verdict(self, rep: Report) -> list[str]:
        return list(advice(self.state, tuple(rep.arenas), rep.leaks))

    def report_parts(self, rep: Report, interactive: bool) -> list:
        box = box_for(interactive)
        rss = arena_rss(self.state)
        partial = None if rss is None else (sum(r.partial_slabs for r in rss.values()),
                                            sum(r.partial_free for r in rss.values()))
        counted = None if self.state.statistics or self.state.extents is None else len(self.state.extents)
        lines = summary_lines(rep, self.state.metadata(), partial, counted)
        *parts, verdict = report_group(rep, interactive, WORDS, lines).renderables
        extra = [jedoc.jemalloc_slabs_table(self.state, box), jedoc.jemalloc_threads_table(self.state, box)]
        return [*parts, *(t for t in extra if t is not None), verdict]

    def report_document(self, rep: Report) -> dict:
        return jedoc.jemalloc_report_document(self.state, rep)

    def holds(self, rep: Report) -> str:
        return f"jemalloc maps {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"

    def arenas(self, interactive: bool, json: bool = False) -> Shown:
        return Shown([jedoc.jemalloc_arenas_table(self.state, box_for(interactive))],
                     jedoc.jemalloc_document(self.state) if json else None)

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        findings = tables.findings_text(self.findings())
        return Shown([jedoc.jemalloc_threads_table(self.state, box_for(interactive)),
                      *([findings] if findings is not None else [])],
                     jedoc.jemalloc_document(self.state) if json else None)

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        findings = je_check.check_jemalloc(self.state)
        checked = je_check.scope(self.state)
        errors = sum(1 for f in findings if f.severity is Severity.ERROR)
        warnings = sum(1 for f in findings if f.severity is Severity.WARNING)
        return Checked([jedoc.jemalloc_check_text(findings, checked, limit or len(findings))], errors, warnings,
                       jedoc.jemalloc_check_document(self.state, findings, checked) if json else None)

    def claims(self) -> list[Claim]:
        """Every extent the radix tree maps (active, dirty, muzzy, retained), a claim for each run of adjacent ones,
        and every block the arenas' bases mapped for metadata (none when the tree was not found: the extents are
        not known); made once."""
        if self._claims is None:
            table = self.state.extents
            out = [] if table is None else [Claim(a, b, "heap", "jemalloc: extents", n)
                                             for a, b, n in extent_runs(table.address, table.size)]
            self._claims = out + [Claim(at, at + size, "heap", "jemalloc: metadata") for a in self.state.arenas
                                  for at, size in a.base_blocks]
        return list(self._claims)

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        if self.state.extents is None:
            raise CannotDraw("jemalloc's radix tree of extents was not found, so its extents cannot be drawn "
                             "(its statistics are in 'heapwalk report')")
        cached = np.array(sorted(self.state.cached), dtype=np.uint64)
        return extent_strips(self.state.extents, self.state.residency, leaked, cached)

    @property
    def scans_leaks(self) -> bool:
        """The leak scan needs the extents (its blocks are their regions)."""
        return self.state.extents is not None

    def blocks(self):
        return jemalloc_blocks(self.mem, self.state)

    @property
    def memory(self):
        return self.mem

    def html(self, document: dict, strips: Sequence[HeapStrip]) -> list[str]:
        return page.jemalloc_sections(document, strips, WORDS)

    def html_header(self, document: dict) -> list[tuple[str, str]]:
        return page.jemalloc_facts(document)


class Jemalloc(Allocator):
    """jemalloc, where a mapped object holds it."""

    name = "jemalloc"
    title = "jemalloc"
    scans_leaks = True
    variables = ("MALLOC_CONF", "JE_MALLOC_CONF", "_RJEM_MALLOC_CONF")
    describes = {
        "arenas": "its arenas' active, dirty, muzzy and retained pages, decay times and purges",
        "report": "mapped memory and metadata, slabs and thread caches; what decay would give back",
        "threads": "each thread's tsd state, what it allocated and freed, its decay ticker; its background threads",
        "check": "arenas, bins, thread caches, extents",
        "map": "each arena's extents: in use, free regions in slabs, dirty, muzzy and retained pages",
    }

    @property
    def verbs(self):
        from heapwalk.jemalloc.verbs import VERBS
        return VERBS

    def settings_in(self, document: dict) -> str:
        return page.option_settings(document)

    def load(self, context: Context) -> JemallocHeap:
        target = context.target
        found = find_jemalloc(target.mem, target.space.mappings)
        if found is None:
            raise NotUsed("jemalloc is not mapped")
        return JemallocHeap(load_jemalloc(target, found), target.mem)


JEMALLOC = Jemalloc()
