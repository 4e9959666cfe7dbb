"""mimalloc's two layout families, chosen once: a build's version names its family (2: segments and their
map; 3: arenas, pages and the page map) and its layout; a build that does not say its version is tried as
each mimalloc 2 layout, then as each mimalloc 3 one, newest first.  The family's decoder makes its state
(`MiState`, or mimalloc 3's `MiState3`), which answers the shared modules' questions its own way; what the
allocator shows of each family (its words, what check covers, its verdict, its memory in the header) is its
`Face`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from heapwalk.analysis.report import human
from heapwalk.common.view import Words
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.memory import Memory
from heapwalk.mimalloc.account import FREE_KINDS
from heapwalk.mimalloc.check import CHECKED, CHECKED3
from heapwalk.mimalloc.decode import MiState, decode_mimalloc
from heapwalk.mimalloc.discovery import MiDiscovery, MimallocUnknown, NoLayoutFits, discover_mimalloc2
from heapwalk.mimalloc.find import MiImage
from heapwalk.mimalloc.layout import LAYOUTS, layout_for
from heapwalk.mimalloc.v3.decode import decode_mimalloc3
from heapwalk.mimalloc.v3.discovery import discover_mimalloc3
from heapwalk.mimalloc.v3.layout import LAYOUTS3, layout3_for
from heapwalk.mimalloc.v3.verdict import advice3
from heapwalk.mimalloc.verdict import advice

__all__ = ["discover_mimalloc", "decode_any", "candidates", "Face", "FACES", "WORDS", "WORDS3"]

WORDS = Words(
    holds="mimalloc's segments hold", arena="first heap", arenas="owners", system="reserved", heaps="segments",
    pieces="blocks",
    gives_back="a purge decommits", large="", overhead="overhead",
    free_columns=tuple((f"free: {k}" if i == 0 else k, lambda a, k=k: a.free[k]) for i, k in enumerate(FREE_KINDS)),
    last_columns=(("purge pending", lambda a: a.reclaim),))


#: mimalloc 3's: its memory comes in pages (of arenas' slices), not segments
WORDS3 = replace(WORDS, holds="mimalloc's pages and arenas hold", heaps="pages")


@dataclass(frozen=True)
class Face:
    """What the allocator shows of a family: its WORDS, what check covers (CHECKED), its verdict (ADVICE), what
    its memory comes in, for the header (MEMORY(discovery)), and how check counts it (UNITS(state))."""

    words: Words
    checked: tuple
    advice: Callable
    memory: Callable
    units: Callable


FACES = {
    2: Face(WORDS, CHECKED, advice,
            lambda d: f"segments of {human(d.layout.segment_size)} in slices of {human(d.layout.slice_size)}",
            lambda state: f"{len(state.live())} segments"),
    3: Face(WORDS3, CHECKED3, advice3,
            lambda d: f"pages of {human(d.layout.slice_size)} slices, in {len(d.arenas)} arenas or taken from the "
                      "system",
            lambda state: f"{len(state.discovery.arenas)} arenas"),
}


def decode_any(mem, discovered: MiDiscovery, threads, description: str = "", residency=None,
               os_page: int = 4096) -> MiState:
    """mimalloc's state as DISCOVERED found it, by its layout's family: mimalloc 2's segments, or mimalloc 3's
    pages; OS_PAGE: the system's page, which its small requests to the system round to."""
    decode = decode_mimalloc3 if getattr(discovered.layout, "family", 2) == 3 else decode_mimalloc
    state = decode(mem, discovered, threads, description, residency)
    state.os_page = os_page
    return state


def discover_mimalloc(mem: Memory, found: MiImage, regions: list[tuple[int, int]], mappings: list[Mapping],
                      readable: list[tuple[int, int]] | None) -> MiDiscovery:
    """mimalloc's state in the object FOUND names and the anonymous REGIONS (READABLE: what can be read without
    touching a page the process never used; None: all), by its family; MimallocUnknown when its shapes are not
    there."""
    layouts = candidates(found.version)
    if found.version and found.version[0] >= 3:
        return discover_mimalloc3(mem, found, layouts[0], mappings, readable, regions)
    try:
        return discover_mimalloc2(mem, found, regions, mappings, readable, layouts)
    except NoLayoutFits as exc:
        if found.version:
            raise MimallocUnknown(f"mimalloc {found.version_text}: no known layout fits its data "
                                  f"({'; '.join(exc.failed)})") from None
        return _unversioned3(mem, found, regions, mappings, readable, exc.failed)


def _unversioned3(mem: Memory, found: MiImage, regions: list[tuple[int, int]], mappings: list[Mapping], readable,
                  failed: list[str]) -> MiDiscovery:
    """A build that does not say its version, which no mimalloc 2 layout fits: the mimalloc 3 layout whose every
    shape (main heap, subprocess and arenas, page map) its data holds, newest first."""
    for layout in reversed(LAYOUTS3):
        try:
            return discover_mimalloc3(mem, found, layout, mappings, readable, regions)
        except MimallocUnknown as exc:
            failed.append(f"{layout.versions}: {exc}")
    raise MimallocUnknown(f"a mimalloc that does not say its version: no known layout fits its data "
                          f"({'; '.join(failed)})")


def candidates(version: tuple[int, int, int] | None) -> list:
    """The layouts to try for VERSION: its own, or every mimalloc 2 one newest first when it says none."""
    own = (layout3_for(version) if version[0] >= 3 else layout_for(version)) if version else None
    if version and own is None:
        known = ", ".join(lay.versions for lay in (*LAYOUTS, *LAYOUTS3))
        raise MimallocUnknown(f"mimalloc {'.'.join(map(str, version))} is not a version heapwalk has measured "
                              f"(it decodes {known}; docs/mimalloc.md)")
    return [own] if own else list(reversed(LAYOUTS))
