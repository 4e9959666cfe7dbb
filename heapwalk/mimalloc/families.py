"""mimalloc's two layout families, chosen once: a build's version names its family (2: segments and their
map; 3: arenas, pages and the page map) and its layout; a build that does not say its version is tried as
each mimalloc 2 layout, then as each mimalloc 3 one, newest first."""

from __future__ import annotations

from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.memory import Memory
from heapwalk.mimalloc.discovery import MiDiscovery, MimallocUnknown, NoLayoutFits, discover_mimalloc2
from heapwalk.mimalloc.find import MiImage
from heapwalk.mimalloc.layout import LAYOUTS, layout_for
from heapwalk.mimalloc.v3.discovery import discover_mimalloc3
from heapwalk.mimalloc.v3.layout import LAYOUTS3, layout3_for

__all__ = ["discover_mimalloc", "candidates"]


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
