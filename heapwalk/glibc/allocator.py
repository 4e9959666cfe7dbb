"""glibc's malloc behind heapwalk's allocator interface (`heapwalk.face`): found and decoded with
`glibc.load`, shown with glibc's tables, documents and page sections, and its own commands (`glibc.verbs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from heapwalk.face import Allocator, Checked, Context, Decoded, NotUsed, Setting, Shown
from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.common.errors import UsageError
from heapwalk.common.findings import Finding
from heapwalk.glibc.forensics import check as glibc_check
from heapwalk.glibc.account.blocks import blocks_of
from heapwalk.glibc.locate.discovery import MallocUnused, Overrides, foreign_allocator, parse_version
from heapwalk.glibc.account.heapmap import heap_strips
from heapwalk.glibc.load import load
from heapwalk.glibc.show.mallocinfo import malloc_info_xml
from heapwalk.glibc.forensics.partial import partial
from heapwalk.glibc.account.summary import heap_view
from heapwalk.glibc.account.verdict import verdict
from heapwalk.glibc.show.reportlines import WORDS, summary_lines
from heapwalk.glibc.show import documents
from heapwalk.glibc.show import tables as glibc_tables
from heapwalk.glibc.show import page
from heapwalk.glibc.show.notes import partial_sentences
from heapwalk.glibc.show.settings import mp_settings
from heapwalk.glibc.walk.chunks import extents
from heapwalk.output import tables
from heapwalk.output.reporttext import report_group
from heapwalk.common.view import HeapStrip

__all__ = ["GLIBC", "GlibcHeap"]


class SettingError(UsageError):
    """A setting of glibc's decoder that does not parse."""


_PAGE_MASK = 4095


class GlibcHeap(Decoded):
    """glibc's malloc decoded: its state, the memory it was read from and the layout it was read with."""

    name = "glibc"
    title = "glibc's malloc"
    beside_key = "glibc_malloc"
    scans_leaks = True
    words = WORDS

    def __init__(self, state, mem, layout):
        self.state, self.mem, self.layout = state, mem, layout
        self.target = state.target
        self._blocks = None

    def header(self, with_target: bool = True):
        return glibc_tables.header_text(self.state, with_target)

    def findings(self) -> list[Finding]:
        return list(self.state.all_findings())

    def with_finding(self, finding: Finding) -> "GlibcHeap":
        state = dataclasses.replace(self.state, target_findings=self.state.target_findings + (finding,))
        return GlibcHeap(state, self.mem, self.layout)

    def partial(self) -> tuple[str, ...]:
        return tuple(partial_sentences(partial(self.state)))

    def partial_notes(self):
        """Which numbers rest on damage, as data (`forensics.partial.Partial`)."""
        return partial(self.state)

    def view(self):
        return heap_view(self.state)

    def verdict(self, rep: Report) -> list[str]:
        return verdict(rep)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        return [report_group(rep, interactive, WORDS, summary_lines(rep))]

    def report_document(self, rep: Report) -> dict:
        return documents.report_document(self.state, rep, self.partial_notes())

    def holds(self, rep: Report) -> str:
        return (f"glibc's malloc holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free) "
                "in its arenas")

    def claims(self) -> list[Claim]:
        """Every arena's heaps (the main arena's sbrk region, each thread heap up to its size) and each mmapped
        chunk's mapping."""
        heaps = [Claim(e.start, e.end, "heap", "glibc's malloc: arenas") for arena in self.state.arenas
                 for e in extents(arena, self.layout)]
        mapped = [Claim(c.address & ~_PAGE_MASK, (c.address & ~_PAGE_MASK) + c.span, "heap",
                        "glibc's malloc: mmapped chunks") for c in self.state.mmapped]
        return heaps + mapped

    def native_xml(self) -> str:
        return malloc_info_xml(self.state)

    def arenas(self, interactive: bool, json: bool = False) -> Shown:
        return Shown([glibc_tables.arenas_table(self.state, interactive)], documents.state_to_json(self.state) if json
                     else None)

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        return Shown([glibc_tables.threads_group(self.state, interactive)],
                     documents.state_to_json(self.state, kinds=()) if json else None)

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        result = glibc_check.check(self.state, self.mem, self.layout)
        checked = glibc_check.scope(self.state)
        parts = [tables.check_text(result, limit or len(result.findings), "heap",
                                   glibc_tables.check_scope(checked))]
        notes = tables.partial_text(partial_sentences(result.partial))
        return Checked(parts + ([notes] if notes is not None else []), len(result.errors), len(result.warnings),
                       documents.check_document(self.state, result, checked) if json else None)

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        return heap_strips(self.mem, self.layout, self.state, reserved, leaked)

    def blocks(self):
        """The chunks in use for the leak scan, made once: the one pass's arrays of them are handed over (the state
        keeps them no more), so that they are not held twice while the scan runs."""
        if self._blocks is None:
            walk, used = self.state.walk, None
            if walk is not None and walk.used is not None:
                used = dict(walk.used)
                self.state = dataclasses.replace(self.state, walk=dataclasses.replace(walk, used=None))
            self._blocks = blocks_of(self.mem, self.layout, self.state, used)
        return self._blocks

    def pages_seen(self):
        return self.state.walk.pages if self.state.walk is not None else None

    @property
    def memory(self):
        return self.mem

    def leaks_header(self) -> dict:
        return documents.header(self.state)

    def html(self, document: dict, strips: Sequence[HeapStrip]) -> list[str]:
        return page.glibc_sections(document, strips, WORDS)

    def html_header(self, document: dict) -> list[tuple[str, str]]:
        return page.glibc_facts(document)


class Glibc(Allocator):
    """glibc's malloc, in every process that links the C library."""

    name = "glibc"
    title = "glibc's malloc"
    settings = (Setting("glibc-version", "the glibc version (X.Y) heapwalk decodes as", "X.Y"),
                Setting("main-arena", "the address of main_arena", "ADDRESS"))
    xml_name = "glibc's malloc_info XML"
    scans_leaks = True
    variables = ("MALLOC_", "GLIBC_TUNABLES")
    describes = {
        "arenas": "main and thread arenas, in ring order, with their system memory, top chunk, and the free bytes "
                  "(chunk count) in each kind of free list: tcache (of the threads using the arena), fastbins, "
                  "unsorted, small, large",
        "report": "system memory, top and headers; what malloc_trim(0) would give back",
        "threads": "attached_threads, and whether an arena waits on the free list of exited threads",
        "check": "every arena, heap, bin and tcache",
        "map": "each heap of each arena, each column shown by what holds most of its bytes: in use, tcache, "
               "fastbin, unsorted, small, large, top, the tcache struct, headers, a thread heap's mapped but "
               "unused tail (and with --reserved its reservation never mapped); under each strip what "
               "malloc_trim(0) would give back. A column mostly free that holds chunks in use too is marked: "
               "those chunks pin the free memory around them",
        "xml": "what the process would have printed: no tcache",
    }

    @property
    def verbs(self):
        from heapwalk.glibc.show.verbs import VERBS
        return VERBS

    def settings_in(self, document: dict) -> str:
        return mp_settings(document)

    def load(self, context: Context) -> GlibcHeap:
        if context.other_libc:
            raise NotUsed("the process's C library is another's, with its own malloc")
        wants = context.wants
        try:
            state, disc = load(context.target, _overrides(context), wants.walk, wants.progress, wants.keep_used,
                               wants.keep_all, wants.keep_pages)
        except MallocUnused as exc:
            if context.beside:
                raise NotUsed(str(exc)) from None
            raise
        other = foreign_allocator(context.target.space.mappings)
        if other and other[0] in {d.name for d in context.beside} | set(context.failed):
            # the other allocator mapped is decoded beside, or says itself why it could not be
            kept = tuple(f for f in state.target_findings if f.structure != "allocator")
            state = dataclasses.replace(state, target_findings=kept)
        return GlibcHeap(state, context.target.mem, disc.layout)


def _overrides(context: Context) -> Overrides:
    """The user's settings of glibc's decoder."""
    ov = Overrides()
    version = context.settings.get("glibc-version", "")
    if version:
        try:
            ov.glibc_version = parse_version(version)
        except ValueError:
            raise SettingError(f"'set heapwalk glibc-version {version}': expected X.Y, e.g. 2.36") from None
    arena = context.settings.get("main-arena", "")
    if arena:
        ov.main_arena = context.evaluate(arena)
    return ov


GLIBC = Glibc()
