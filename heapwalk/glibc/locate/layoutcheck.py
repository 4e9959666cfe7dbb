"""The layout memory shows: a version's layout corrected by what memory says (safe-linking, heap_info size,
tcache and mp_ shapes, arena offsets), and a representative version when only memory can tell."""

from __future__ import annotations

import dataclasses

from heapwalk.common.findings import Severity
from heapwalk.glibc.locate import heuristics
from heapwalk.glibc.locate.layout import Layout, layout_for
from heapwalk.glibc.locate.search import Search, version_text


_LAYOUT_PARTS = {"heap_info_size": "heap_info size", "safe_linking": "safe-linking", "mp": "mp_ layout",
                 "mp_size": "mp_ layout", **{n: "tcache layout" for n in ("tcache_bins", "tcache_count_size",
                                                                          "tcache_off_entries", "tcache_struct_size",
                                                                          "tcache_counts_down")}}


def confirm_layout(layout: Layout, family: tuple[int, int], heap_info_size: int | None,
                    tcache_chunk: int | None, safe_linking: bool | None, mp_variant: tuple[int, int] | None,
                    search: Search, version_known: bool) -> Layout:
    """LAYOUT corrected by what memory shows; each correction of a known version is a finding."""
    changes: dict = {}
    if safe_linking is not None and safe_linking != layout.safe_linking:
        changes["safe_linking"] = safe_linking
    if mp_variant is not None and layout_for(mp_variant).mp != layout.mp:
        changes.update(mp=layout_for(mp_variant).mp, mp_size=layout_for(mp_variant).mp_size)
    if layout_for(family).off_bins != layout.off_bins or layout_for(family).off_next != layout.off_next:
        fam = layout_for(family)
        changes.update({f.name: getattr(fam, f.name) for f in dataclasses.fields(Layout)
                        if f.name.startswith("off_") or f.name in ("arena_size", "nfastbins")})
    if heap_info_size in (32, 48) and heap_info_size != layout.heap_info_size:
        changes["heap_info_size"] = heap_info_size
    if tcache_chunk in heuristics.TCACHE_CHUNK_SIZES and tcache_chunk != layout.tcache_chunk_size:
        t = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
        for name in ("tcache_bins", "tcache_count_size", "tcache_off_entries", "tcache_struct_size",
                     "tcache_counts_down"):
            changes[name] = getattr(t, name)
    if not changes:
        return layout
    if version_known:
        parts = ", ".join(sorted({_LAYOUT_PARTS.get(name, "arena layout") for name in changes}))
        search.note(Severity.WARNING, 0, f"memory contradicts the glibc {version_text(layout.version)} layout "
                    f"({parts}); decoding with what memory shows (a distribution backport?)")
    return dataclasses.replace(layout, **changes)


def version_from_memory(family: tuple[int, int], heap_info_size: int | None, tcache_chunk: int | None,
                         mp_variant: tuple[int, int] | None, safe_linking: bool | None
                         ) -> tuple[tuple[int, int], str]:
    """A representative version for what memory shows, and the range it stands for."""
    if family >= (2, 43):
        return (2, 43), "2.43+"
    if family < (2, 27):
        return family, "2.17-2.22" if family < (2, 23) else "2.23-2.26"
    if tcache_chunk == 0x300:
        return (2, 42), "2.42"
    if heap_info_size == 48 or (mp_variant is not None and mp_variant >= (2, 35)):
        return (2, 41), "2.35-2.41"
    if tcache_chunk == 0x250:
        return (2, 29), "2.27-2.29"
    if safe_linking is False:
        return (2, 31), "2.30-2.31"
    if safe_linking:
        return (2, 34), "2.32-2.34"
    return (2, 34), "2.30-2.34"
