"""Google's tcmalloc behind heapwalk's allocator interface (`heapwalk.face`): found where a program links it in,
its static objects found by their shapes (`gtcmalloc.find`), shown in MallocExtension's words."""

from __future__ import annotations

import functools
from collections import Counter
from types import MappingProxyType

from rich.text import Text

import numpy as np

from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.common.findings import Finding, Severity
from heapwalk.common.mapkinds import KINDS
from heapwalk.common.view import ArenaView, Blocks, HeapStrip, HeapView, Words
from heapwalk.face import Allocator, CannotDraw, Checked, Context, Decoded, NotUsed, Shown
from heapwalk.gtcmalloc.check import CHECKED, check_gtcmalloc
from heapwalk.gtcmalloc.decode import GtcState, decode_gtcmalloc, thread_list
from heapwalk.gtcmalloc.layout import PAGE
from heapwalk.gtcmalloc.pagemap import ROOT_LENGTH
from heapwalk.gtcmalloc.sampled import Sampled, read_sampled
from heapwalk.gtcmalloc.find import locate
from heapwalk.gtcmalloc.heapmap import page_heap_strips
from heapwalk.gtcmalloc.objects import IN_USE, Objects, object_places
from heapwalk.gtcmalloc.image import find_google_tcmalloc
from heapwalk.gtcmalloc.shown import classes_table, cpus_table, heaps_table, state_document, threads_table
from heapwalk.gtcmalloc.verdict import advice
from heapwalk.inferior.ranges import merged
from heapwalk.output import htmlreport
from heapwalk.output.consoles import box_for
from heapwalk.output.jsondoc import report_json
from heapwalk.output.reporttext import report_group

__all__ = ["GTCMALLOC", "GtcHeap", "FREE_KINDS"]

#: where Google's tcmalloc's free bytes are, in the order its statistics list them
FREE_KINDS = ("page heap", "central free lists", "per-CPU caches", "transfer caches", "thread caches")
#: the bytes of each kind, by MallocExtension's property
_PROPERTY = {"page heap": "tcmalloc.page_heap_free", "central free lists": "tcmalloc.central_cache_free",
             "per-CPU caches": "tcmalloc.cpu_free", "transfer caches": "tcmalloc.transfer_cache_free",
             "thread caches": "tcmalloc.thread_cache_free"}
#: MallocExtension's numeric properties heapwalk does not give: tcmalloc's metadata bytes (and what is made from them),
#: two lone static counters
NOT_GIVEN = ("tcmalloc.metadata_bytes", "generic.virtual_memory_used", "generic.physical_memory_used",
             "tcmalloc.required_bytes", "tcmalloc.external_fragmentation_bytes",
             "tcmalloc.sampled_internal_fragmentation", "tcmalloc.max_total_thread_cache_bytes")
#: the properties that count things, not bytes
_COUNTS = ("tcmalloc.thread_cache_count", "tcmalloc.per_cpu_caches_active", "generic.realized_fragmentation",
           "tcmalloc.soft_limit_hits", "tcmalloc.hard_limit_hits", "tcmalloc.successful_shrinks_after_soft_limit_hit",
           "tcmalloc.successful_shrinks_after_hard_limit_hit")
#: the environment variable only a process of this allocator's reads, and the prefix of those it shares
_VARIABLES = ("TCMALLOC_",)

WORDS = Words(
    holds="Google's tcmalloc's page heap holds", arena="page allocator", arenas="page allocators",
    system="heap size", heaps="page heaps", pieces="objects",
    gives_back="ReleaseMemoryToSystem() gives back", large="", overhead="overhead",
    free_columns=tuple((f"free: {k}" if i == 0 else k, lambda a, k=k: a.free[k]) for i, k in enumerate(FREE_KINDS)),
    counted="objects")


class GtcHeap(Decoded):
    """Google's tcmalloc decoded: its state."""

    name = "gtcmalloc"
    title = "Google's tcmalloc"
    beside_key = "gtcmalloc"
    damaged_subject = "Google's tcmalloc's state is"
    words = WORDS
    block_noun = "object"
    scans_leaks = True

    def __init__(self, state: GtcState, mem, threads: int = 0, regions: list[tuple[int, int]] | None = None):
        self.state, self.mem = state, mem
        self.thread_count = threads          # every thread allocates from it
        self.regions = sorted(regions or [])  # the target's memory, mapping by mapping
        self.target = state.target

    def header(self, with_target: bool = True) -> Text:
        s = self.state
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        mode = (f"per-CPU caches on ({s.cpu_count} CPUs)" if s.per_cpu
                else f"per-CPU caches off ({len(s.threads)} thread caches)")
        text.append(f"Google's tcmalloc ({s.library}): layout of {s.located.layout.name}; {mode}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.findings) + list(self.added)

    def view(self) -> HeapView:
        p = self.state.properties()
        free = {kind: p[prop] for kind, prop in _PROPERTY.items()}
        system, used = p["generic.heap_size"], p["generic.current_allocated_bytes"]
        row = ArenaView(0, self.state.located.page_allocator, "page allocator", self.thread_count,
                        len(self.state.heaps), system, used, MappingProxyType(free), 0, 0, free["page heap"],
                        used + sum(free.values()) == system and not self._damaged())
        return HeapView(allocator="gtcmalloc", arenas=(row,), free_sizes=MappingProxyType({0: self._free_sizes()}),
                        size_classes=(), arena_limit="one page allocator", reclaim_total=free["page heap"])

    def _free_sizes(self):
        sizes = Counter()
        for c in self.state.classes:
            sizes[c.size] += c.central_objects + c.transfer_objects + c.cpu_objects
        return +sizes

    def _damaged(self) -> bool:
        return any(f.severity is Severity.ERROR for f in self.state.findings)

    def verdict(self, rep: Report) -> list[str]:
        return advice(self.state, rep)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        lines = Text()
        sampled = self.sampled
        if sampled:
            lines.append(f"sampled allocations: {len(sampled)}, {human(sum(s.requested for s in sampled))} asked for, "
                         f"in spans of {human(sum(s.bytes for s in sampled))} (each beside its proxy object)\n")
        for name, value in self.state.properties().items():
            lines.append(f"{name} {value}\n" if name in _COUNTS or value >= 1 << 62 else
                         f"{name} {value} ({human(value)})\n")
        lines.append(f"not given (no shape finds what they count; docs/gtcmalloc.md): {', '.join(NOT_GIVEN)}\n")
        *parts, verdict = report_group(rep, interactive, WORDS, lines).renderables
        box = box_for(interactive)
        local = cpus_table(self.state, box) if self.state.per_cpu else threads_table(self.state, box)
        return [*parts, heaps_table(self.state, box), local, classes_table(self.state, box), verdict]

    def report_document(self, rep: Report) -> dict:
        sampled = self.sampled
        return {**self.document(), "report": {**report_json(rep), "partial": []},
                "gtcmalloc": {**state_document(self.state),
                              "sampled": [{"address": s.address, "bytes": s.bytes, "requested": s.requested,
                                           "proxy": s.proxy} for s in sampled]}}

    def threads(self, interactive: bool, json: bool = False) -> Shown:
        """'heapwalk threads': each thread cache (per-CPU caches off) or each CPU's slab."""
        box = box_for(interactive)
        table = cpus_table(self.state, box) if self.state.per_cpu else threads_table(self.state, box)
        doc = state_document(self.state)
        return Shown([table], {**self.document(), "threads": doc["threads"], "cpus": doc["cpus"]} if json else None)

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        """The invariants `gtcmalloc.check` holds it to, and what was checked."""
        s = self.state
        return self.checked(check_gtcmalloc(s, self.mem) + list(self.objects.findings) + list(self.added), limit,
                            f"Google's tcmalloc consistent: checked {'; '.join(CHECKED)} ({len(s.classes)} size "
                            f"classes, {len(s.cpus)} CPUs' slabs, {len(s.threads)} thread caches, {len(s.heaps)} page "
                            f"heaps, {len(s.spans) if s.spans is not None else 0} spans, {len(self.objects.place)} "
                            "objects)\n", CHECKED, json)

    @property
    def memory(self):
        return self.mem

    @functools.cached_property
    def sampled(self) -> list[Sampled]:
        """The sampled allocations (`gtcmalloc.sampled`), read once for the report and its document."""
        return read_sampled(self.mem, self.state.located.layout, self.state.spans)[0]

    @functools.cached_property
    def objects(self) -> Objects:
        """Every object of the live spans and where each free one waits (`gtcmalloc.objects`)."""
        return object_places(self.mem, self.state)

    def blocks(self) -> Blocks | None:
        """The objects the program holds and its allocations of whole spans, for the leak scan: the page heaps are
        its heap, its metadata and static objects its own memory (the caches there point at free objects), the
        spans of a class whose free objects could not be told apart are scanned as roots, never judged."""
        s, o = self.state, self.objects
        if s.spans is None:
            return None
        classes = np.repeat(o.size_class, o.count)
        keep = (o.place == IN_USE) & ~np.isin(classes, sorted(o.broken))
        addresses, sizes = o.addresses()[keep], np.repeat(o.size, o.count)[keep].astype(np.uint64)
        whole = (s.spans.size_class == 0) | s.spans.sampled
        first = (s.spans.first_page[whole] * np.uint64(PAGE)).astype(np.uint64)
        starts = np.concatenate([addresses, first])
        ends = np.concatenate([addresses + sizes, first + s.spans.pages[whole] * np.uint64(PAGE)])
        order = np.argsort(starts, kind="stable")
        by_name = {}
        for claim in self.claims():
            by_name.setdefault(claim.name.endswith("page heaps"), []).append((claim.start, claim.end))
        broken = np.isin(o.size_class, sorted(o.broken))
        unknown = [(int(a), int(a) + int(n) * int(z)) for a, n, z in zip(o.start[broken], o.count[broken],
                                                                        o.size[broken])]
        return Blocks(starts[order], ends[order], np.zeros(len(order), dtype=np.int32), 0, 0,
                      heaps=tuple(merged(by_name.get(True, []))), private=tuple(merged(by_name.get(False, []))),
                      unknown=tuple(merged(unknown)))

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        """The page heaps' mappings, span by span (`gtcmalloc.heapmap`)."""
        if self.state.spans is None:
            raise CannotDraw("Google's tcmalloc's page map was not found (the findings say why): its spans are not "
                             "drawn")
        regions = [(c.start, c.end) for c in self.claims() if c.name.endswith("page heaps")]
        return page_heap_strips(self.state.spans, self.objects, regions, leaked)

    def html(self, document: dict, strips) -> list[str]:
        """The page's sections, its kinds of free bytes in the heap maps' colours."""
        kinds = {"page heap": "gtc_pages", "central free lists": "gtc_central", "per-CPU caches": "gtc_cpu",
                 "transfer caches": "gtc_transfer", "thread caches": "gtc_thread"}
        names = {**{k: KINDS[v].label for k, v in kinds.items()}, "page heap": "page heap: free pages"}
        return htmlreport.plain_sections(document, strips, WORDS, self.name,
                                         {k: KINDS[v].colour for k, v in kinds.items()}, names)

    def claims(self) -> list[Claim]:
        """The mappings tcmalloc took for its page heaps (those its spans lie in: tcmalloc maps each page heap's
        hugepages as one run of its own, free and released ones included) and for its metadata (the page map's
        leaves, the spans, the per-CPU slabs, the thread caches), for the process's RSS by owner."""
        s = self.state
        if s.spans is None:
            return []
        heap = self._holding(s.spans.first_page.astype(np.uint64) * np.uint64(PAGE))
        own = [*s.spans.leaves.tolist(), *s.spans.address.tolist(), *(c.address for c in s.cpus),
               *(t.address for t in s.threads)]
        metadata = [r for r in self._holding(np.array(own, dtype=np.uint64)) if r not in heap]
        L, loc = s.located.layout, s.located
        statics = [(loc.transfer, loc.transfer + L.classes * L.tc_stride),
                   (loc.page_allocator, loc.page_allocator + L.hpaa_size * L.hpaa_choices + 40),
                   (s.spans.root, s.spans.root + 8 * ROOT_LENGTH)]
        return [Claim(lo, hi, "heap", "Google's tcmalloc: page heaps") for lo, hi in heap] + \
            [Claim(lo, hi, "heap", "Google's tcmalloc: metadata") for lo, hi in metadata] + \
            [Claim(lo, hi, "heap", "Google's tcmalloc: page map, page allocator, transfer caches")
             for lo, hi in statics]

    def _holding(self, addresses: np.ndarray) -> list[tuple[int, int]]:
        """The target's regions that hold any of ADDRESSES."""
        if not self.regions or not len(addresses):
            return []
        starts = np.array([lo for lo, _ in self.regions], dtype=np.uint64)
        at = np.searchsorted(starts, addresses, side="right") - 1
        out = []
        for index in np.unique(at[at >= 0]).tolist():
            lo, hi = self.regions[index]
            if np.any((addresses >= np.uint64(lo)) & (addresses < np.uint64(hi))):
                out.append((lo, hi))
        return out

    def holds(self, rep: Report) -> str:
        return f"Google's tcmalloc holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"


class GoogleTcmalloc(Allocator):
    """Google's tcmalloc, where a program links it in (or a library named libtcmalloc holds it)."""

    name = "gtcmalloc"
    title = "Google's tcmalloc"
    scans_leaks = True
    variables = _VARIABLES

    @property
    def verbs(self):
        from heapwalk.gtcmalloc.verbs import VERBS
        return VERBS

    describes = {"report": "its page heaps (huge-page-aware allocators: filler, cache, regions), central free lists, "
                           "transfer caches, per-CPU or thread caches, in MallocExtension's figures",
                 "threads": "each CPU's slab of per-CPU caches, or each thread cache and its thread",
                 "check": "its size classes' counters against their spans on the central free lists, every CPU's "
                          "slab headers, its thread caches' links, its page heaps' counters and regions, every free "
                          "object's place (its span's list or bitmap, a cache) against its span",
                 "map": "its page heaps span by span: objects in use (or leaked), free in thread, transfer and "
                        "per-CPU caches and on their spans' lists, rounding, and the page heap's free pages"}

    def load(self, context: Context) -> GtcHeap:
        target = context.target
        image = find_google_tcmalloc(target.mem, target.space.mappings)
        if image is None:
            raise NotUsed("Google's tcmalloc is not mapped")
        located = locate(target.mem, image)
        tls = [(t.lwp, *target.arch.static_tls(t.thread_pointer, 8192)) for t in target.threads
               if t.thread_pointer]
        state = decode_gtcmalloc(target.mem, located, image.path, target.description,
                                 thread_list(target.mem, located, tls))
        return GtcHeap(state, target.mem, len(target.threads), target.space.regions)


GTCMALLOC = GoogleTcmalloc()
