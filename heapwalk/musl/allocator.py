"""musl's malloc (mallocng) behind heapwalk's allocator interface (`heapwalk.face`): found where musl's C library
or a program linked with it holds it, its context found by symbol or by shape (`musl.discovery`), shown in
mallocng's words: groups, slots, size classes."""

from __future__ import annotations

import functools
from collections import Counter
from types import MappingProxyType

import numpy as np
from rich.text import Text

from heapwalk.analysis.report import Report, human
from heapwalk.analysis.rss import Claim
from heapwalk.common.errors import HeapwalkError
from heapwalk.common.findings import Finding, Severity
from heapwalk.common.view import ArenaView, Blocks, HeapStrip, HeapView, Words
from heapwalk.face import Allocator, Checked, Context, Decoded, NotUsed
from heapwalk.inferior.ranges import merged
from heapwalk.musl.account import FREE_KINDS, Tally, tally
from heapwalk.musl.check import CHECKED, check_musl
from heapwalk.musl.decode import decode_musl
from heapwalk.musl.discovery import MuslUnknown, MuslUnused, locate_context
from heapwalk.musl.find import find_musl
from heapwalk.musl.heapmap import free_kinds_shown, group_strips
from heapwalk.musl.layout import AREA_SIZE, MMAPPED, Ctx
from heapwalk.musl.model import INSIDE, MuslState
from heapwalk.musl.shown import classes_document, classes_table
from heapwalk.musl.verdict import advice
from heapwalk.output import htmlreport
from heapwalk.output.consoles import box_for
from heapwalk.output.jsondoc import report_json
from heapwalk.output.reporttext import report_group

__all__ = ["MUSL", "MuslHeap"]

WORDS = Words(holds="musl's malloc holds", arena="context", arenas="contexts", system="groups' memory",
              heaps="groups", pieces="slots", gives_back="gives back", large="requests mapped on their own",
              overhead="headers and slack",
              free_columns=tuple((f"free: {k}" if i == 0 else k, lambda a, k=k: a.free[k])
                                 for i, k in enumerate(FREE_KINDS)),
              blocks="allocations", size_class="size class", counted="slots")


class MuslHeap(Decoded):
    """mallocng decoded: its state and its tally."""

    name = "musl"
    title = "musl's malloc"
    beside_key = "musl"
    damaged_subject = "musl's malloc is"
    words = WORDS
    block_noun = "allocation"
    scans_leaks = True
    serves_libc = True

    def __init__(self, state: MuslState, mem, residency=None, threads: int = 0):
        self.state, self.mem, self.residency = state, mem, residency
        self.thread_count = threads          # every thread allocates from its one context
        self.target = state.target

    @functools.cached_property
    def tally(self) -> Tally:
        return tally(self.state)

    def header(self, with_target: bool = True) -> Text:
        s = self.state
        text = Text(f"{self.target}\n" if self.target and with_target else "")
        version = f"musl {s.version}" if s.version else "musl (version not said)"
        text.append(f"musl's malloc: mallocng, {version} ({s.library}); context at {s.context:#x}, found by "
                    f"{s.found_by}\n")
        return text

    def findings(self) -> list[Finding]:
        return list(self.state.findings) + list(self.added)

    def view(self) -> HeapView:
        t, s = self.tally, self.state
        resident = free_resident = None
        if self.residency is not None:
            resident = self.residency.resident_sum(*_ranges(self._extents()))
            free_resident = self.residency.resident_sum(*_ranges(self._free_slots()))
        row = ArenaView(0, s.context, "context", self.thread_count, sum(n for k, n in t.groups.items() if k != INSIDE), t.system,
                        t.in_use, MappingProxyType(dict(t.free)), 0, t.overhead, 0,
                        t.system == t.in_use + t.free_total + t.overhead and not self._damaged(), resident,
                        free_resident)
        sizes = Counter()
        for sc, r in t.rows.items():
            if sc != MMAPPED:
                sizes[r.slot_size] += sum(r.free.values())
        large = [g.extent for g in s.groups if g.sizeclass == MMAPPED]
        return HeapView(allocator="musl", arenas=(row,), free_sizes=MappingProxyType({0: +sizes}), size_classes=(),
                        large_count=len(large), large_bytes=sum(large), arena_limit="one context",
                        reclaim_total=0, residency=self.residency.source if self.residency is not None else "",
                        large_resident=None if self.residency is None else self.residency.resident_sum(
                            *_ranges([(g.mem, g.mem + g.extent) for g in s.groups if g.sizeclass == MMAPPED])))

    def _damaged(self) -> bool:
        return any(f.severity is Severity.ERROR for f in self.state.findings)

    def _extents(self) -> list[tuple[int, int]]:
        """The memory of the groups not inside another (their mappings, or what was donated) and the meta areas."""
        return self._group_extents() + [(a, a + AREA_SIZE) for a in self.state.meta_areas]

    def _group_extents(self) -> list[tuple[int, int]]:
        """The memory of the groups not inside another, but the requests mapped on their own."""
        return [(g.mem, g.mem + g.extent) for g in self.state.groups if g.source != INSIDE
                and g.sizeclass != MMAPPED]

    def _free_slots(self) -> list[tuple[int, int]]:
        out = []
        for g in self.state.groups:
            for idx in range(g.slots):
                if g.state(idx) in FREE_KINDS:
                    start = g.storage + g.stride * idx
                    out.append((start, start + g.stride))
        return out

    def verdict(self, rep: Report) -> list[str]:
        return advice(self.tally, rep)

    def report_parts(self, rep: Report, interactive: bool) -> list:
        *parts, verdict = report_group(rep, interactive, WORDS, Text("")).renderables
        return [*parts, classes_table(self.tally, box_for(interactive)), verdict]

    def report_document(self, rep: Report) -> dict:
        s, t = self.state, self.tally
        return {**self.document(), "report": {**report_json(rep), "partial": []},
                "musl": {"version": s.version, "library": s.library, "context": s.context, "found_by": s.found_by,
                         "page_size": s.page_size, "meta_areas": len(s.meta_areas), "groups": dict(t.groups),
                         "in_use": {"allocations": int(len(s.used_addr)), "requested": t.in_use + t.large_requested},
                         "free_bytes": dict(t.free), "overhead": t.overhead, "trapped": t.trapped,
                         "empty_groups_bytes": t.empty_bytes,
                         "large": {"count": t.large_count, "bytes": t.large_bytes, "requested": t.large_requested},
                         "size_classes": classes_document(t),
                         "usage_by_class": list(s.usage_by_class)}}

    def check(self, limit: int, interactive: bool, json: bool = False) -> Checked:
        """mallocng's invariants (`musl.check`), and what was checked."""
        s = self.state
        return self.checked(check_musl(s, self.mem), limit, f"musl's malloc consistent: checked {'; '.join(CHECKED)} "
                            f"({len(s.meta_areas)} meta areas, {len(s.groups)} groups, {len(s.used_addr)} "
                            "allocations)\n", CHECKED, json)

    def blocks(self) -> Blocks:
        """The allocations the program holds (each the bytes it asked for), for the leak scan; those mapped on their
        own are roots, never judged, as glibc's mmapped chunks are."""
        s = self.state
        large_groups = np.array([g.sizeclass == MMAPPED for g in s.groups] + [False], dtype=bool)
        judged = ~large_groups[s.used_group] if len(s.used_group) else np.zeros(0, dtype=bool)
        starts, sizes = s.used_addr[judged], s.used_size[judged]
        large = merged([(g.mem, g.mem + g.extent) for g in s.groups if g.sizeclass == MMAPPED])
        private = merged([(a, a + AREA_SIZE) for a in s.meta_areas] + [(s.context, s.context + Ctx.size)])
        return Blocks(starts, starts + sizes, np.zeros(len(starts), dtype=np.int32), 0, 0,
                      heaps=tuple(merged(self._group_extents())), private=tuple(private),
                      large=tuple(large))

    @property
    def memory(self):
        return self.mem

    def html(self, document: dict, strips) -> list[str]:
        """The page's sections, its kinds of free slots in the colours of the heap maps' (`musl.heapmap`)."""
        return htmlreport.plain_sections(document, strips, WORDS, self.name, *free_kinds_shown())

    def strips(self, reserved: bool = False, leaked=None) -> list[HeapStrip]:
        """The groups, slot by slot (`musl.heapmap`)."""
        return group_strips(self.state, self.residency, leaked)

    def claims(self) -> list[Claim]:
        """The groups' memory and the meta areas, for the process's RSS by owner."""
        s = self.state
        return [Claim(lo, hi, "heap", "musl: groups") for lo, hi in self._group_extents()] + \
            [Claim(g.mem, g.mem + g.extent, "heap", "musl: requests mapped on their own") for g in s.groups
             if g.sizeclass == MMAPPED] + \
            [Claim(a, a + AREA_SIZE, "heap", "musl: meta areas") for a in s.meta_areas]

    def holds(self, rep: Report) -> str:
        return f"musl's malloc holds {human(rep.system)} ({human(rep.in_use)} in use, {human(rep.free)} free)"


def _ranges(pairs: list[tuple[int, int]]):
    a = np.array(pairs, dtype=np.uint64).reshape(-1, 2)
    return a[:, 0], a[:, 1]


class Musl(Allocator):
    """musl's malloc, mallocng (musl 1.2.1 and later)."""

    name = "musl"
    title = "musl's malloc"
    scans_leaks = True
    serves_libc = True
    describes = {"report": "its groups' memory by slot state (in use, freed, available, never used), headers and "
                           "slack, each size class, the requests mapped on their own",
                 "check": "every meta area against the context's secret, every group against its meta, every slot "
                          "in use by its header, each size class's list of groups",
                 "map": "its groups slot by slot: the bytes asked for in use (or leaked), musl's slack and headers, "
                        "freed, available and never used slots"}

    def load(self, context: Context) -> MuslHeap:
        target = context.target
        found = find_musl(target.mem, target.space.mappings)
        if found is None:
            raise NotUsed("musl is not mapped")
        if not found.mallocng:
            raise MuslUnknown(f"heapwalk: {found.path} is musl's C library without mallocng (musl before 1.2.1, "
                              "whose malloc, oldmalloc, heapwalk does not decode)")
        try:
            address, how = locate_context(target.mem, found, _symbol(context))
        except MuslUnused as exc:
            raise NotUsed(str(exc)) from None
        version, foreign = _trusted_version(target, found)
        state = decode_musl(target.mem, address, how, found.path, version, target.page_size,
                            target.description, context.wants.progress)
        heap = MuslHeap(state, target.mem, target.residency, len(target.threads))
        return heap.with_finding(foreign) if foreign else heap


def _trusted_version(target, found) -> tuple[str, Finding | None]:
    """The version the object holds, unless the file gdb loaded for it is another build than the process mapped
    (a core read with another machine's or a container's files): its read-only pages, which the core lacks, are
    then that file's, and the version is not said, with the finding that says why (said even where those pages
    could not be read)."""
    if not target.space.core:
        return found.version, None               # a live process's pages are its own, whatever its files
    loaded = getattr(target.symbols, "loaded_file", lambda path: None)(found.path)
    mapped = found.image.build_id()
    if loaded is None or not loaded[1] or not mapped or loaded[1] == mapped:
        return found.version, None
    return "", Finding(Severity.WARNING, found.image.base, "musl's C library", f"the file gdb loaded for "
                       f"{found.path} ({loaded[0]}, build-id {loaded[1]}) is not the one the process ran (build-id "
                       f"{mapped}): its version is not read from it; give the process's own files as --sysroot "
                       "(a container's root: /proc/PID/root while it runs)")


def _symbol(context: Context):
    def address(name: str) -> int | None:
        try:
            return context.evaluate(f"&'{name}'") or None
        except (HeapwalkError, ValueError):
            return None
    return address


MUSL = Musl()
