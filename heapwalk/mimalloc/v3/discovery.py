"""mimalloc 3's state found without symbols, by shapes no other data has:

- the main heap: a heap of the object's data whose page queues carry the bins' block sizes and whose thread-local
  data names it as its backing heap (as in mimalloc 2, at this release's offsets);
- the subprocess the main thread-local data names: its arenas, each pointing back to it;
- the page map (`mimalloc.v3.pagemap`): every page, those taken from the system included;
- the system's memory settings mimalloc read at its start (page size, large page size, granularity, physical
  memory, address bits, then whether the system overcommits): how it counts an arena's commit;
- each thread's default heap, and the options, as in mimalloc 2."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.inferior.elf import Mapping, writable_words
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.discovery import (MiDiscovery, MimallocUnknown, MimallocUnused, data_unread, main_heap,
                                         read_tpoff)
from heapwalk.mimalloc.find import MiImage
from heapwalk.mimalloc.options import find_options
from heapwalk.mimalloc.v3.arenas import read_arenas
from heapwalk.mimalloc.v3.layout import Mi3Layout
from heapwalk.mimalloc.v3.decode import own_memory
from heapwalk.mimalloc.v3.pagemap import find_page_map

__all__ = ["discover_mimalloc3"]


def discover_mimalloc3(mem: Memory, found: MiImage, layout: Mi3Layout, mappings: list[Mapping],
                       readable: list[tuple[int, int]] | None, regions: list[tuple[int, int]] = ()) -> MiDiscovery:
    """mimalloc 3's state in the object FOUND names, with LAYOUT (READABLE: what may be read of the process;
    None: all; REGIONS: its memory); MimallocUnknown when its shapes are not there."""
    base, words = writable_words(mem, found.image)
    if not len(words):
        raise MimallocUnknown(f"{found.path} has no writable segment")
    main = main_heap(mem, base, words, layout)
    cookie = u64(mem, main + layout.heap_cookie) if layout.heap_cookie is not None else 0
    if not cookie and layout.main_cookie:
        raise MimallocUnused("mimalloc was never initialised in this process (its main heap has no cookie)")
    subproc = u64(mem, u64(mem, main + layout.heap_tld) + layout.tld_subproc)
    config = _mem_config(words)
    overcommit = None if config is None else bool(config[1] & 0xFF)
    arenas = read_arenas(mem, layout, subproc, overcommit)
    if arenas is None:
        raise MimallocUnknown(f"{found.named}: the subprocess its main thread names ({subproc:#x}) "
                              "does not hold arenas that point back to it, or their bitmaps cannot be read")
    image = _image_range(found, mappings)
    pagemap = find_page_map(mem, base, words, image, readable, layout.page_map_header, layout.first >= (3, 1, 0))
    if pagemap is None:
        raise MimallocUnknown(f"{found.named}: its page map was not found (no word of its data "
                              "points to a table whose first sub-map starts with its empty page)")
    if not arenas and not pagemap.pages:
        raise MimallocUnused("mimalloc holds no page in this process")
    os_pages, stale = _os_pages(mem, layout, pagemap.pages, arenas, regions)
    tpoff, unread = read_tpoff(mem, found, layout.default_fn)
    options = find_options(mem, base, words)
    group = purge_group(options, config, layout.slice_size, layout.min_purge)
    arenas = tuple(replace(a, purge_group=group) for a in arenas)
    in_arenas = sum(bin(a.pages).count("1") for a in arenas)
    said = "" if found.version else " (the build does not say its version; its data has all this layout's shapes)"
    facts = (("layout", f"mimalloc {layout.versions}'s{said}"),
             ("main heap", f"at {main:#x} (its page queues carry the bins' sizes" +
              (f"; cookie {cookie:#x})" if layout.main_cookie else "; the static one)")),
             ("arenas", f"{len(arenas)}, from the subprocess at {subproc:#x} (each points back to it); "
              f"{in_arenas} pages in their page bitmaps"),
             ("page map", f"at {pagemap.address:#x} ({pagemap.subs} sub-maps): {len(os_pages)} pages taken from "
              f"the system" + (f"; it still names {stale} freed pages (mimalloc leaves them)" if stale else "")),
             ("purge", "whole runs of waiting slices" if group == 1 else f"only whole aligned groups of {group} "
              "slices all waiting (its minimal purge size)"),
             ("commit", "an arena committed at once counts its slices as they are first used (the system "
              "overcommits)" if overcommit is not False else "the system does not overcommit: an arena's "
              "committed bitmap counts"),
             ("default heaps", f"thread-local, {tpoff - (1 << 64) if tpoff and tpoff >> 63 else tpoff:#x} from "
              f"${found.image.arch.thread_pointer} ({layout.default_fn}'s GOT slot)" if tpoff is not None else "not found"),
             ("options", f"{len(options)}, from their table (each entry carries its index)" if options else
              "not found: the report does not say which options the process runs with"))
    return MiDiscovery(layout, found.version, found.path, main, cookie, (), (), None, tpoff, (), facts, (),
                       options, arenas, page_map=pagemap, subproc=subproc, os_pages=os_pages,
                       tpoff_unread=unread, data_unread=data_unread(mem, found),
                       own_figures=own_figures(mem, layout, subproc))


def own_figures(mem: Memory, lay: Mi3Layout, subproc: int) -> tuple[int, int] | None:
    """mimalloc's own current (reserved, committed) figures, from its subprocess's statistics (3.6), when they
    say the size and version this layout knows; else None."""
    if lay.sub_stats is None:
        return None
    at = subproc + lay.sub_stats
    signed = lambda v: v - (1 << 64) if v >> 63 else v      # noqa: E731 (a figure that drifted below zero)
    try:
        if (u64(mem, at), u64(mem, at + 8)) != lay.stats_shape:
            return None
        reserved, committed = (u64(mem, at + off) for off in (lay.stats_reserved, lay.stats_committed))
    except ReadError:
        return None
    return signed(reserved), signed(committed)


def _os_pages(mem: Memory, lay: Mi3Layout, named, arenas, regions) -> tuple[tuple[int, ...], int]:
    """(the pages taken from the system, the freed pages the map still names) of the pages the page map NAMED
    outside the ARENAS: a page whose header says it is the memory the system gave (`own_memory`); one that
    cannot be read inside the process's REGIONS is kept (its unit says it cannot be read); any other was
    freed."""
    keep, stale = [], 0
    for at in sorted(named):
        if any(a.start <= at < a.start + a.reserved for a in arenas):
            continue
        try:
            head = mem.read(at + lay.page_memid, lay.page_memkind - lay.page_memid + 1)
        except ReadError:
            if any(lo <= at < hi for lo, hi in regions):
                keep.append(at)
            else:
                stale += 1
            continue
        base, size = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:16], "little")
        if own_memory(lay, at, base, size) and head[-1] in lay.mem_os:
            keep.append(at)
        else:
            stale += 1
    return tuple(keep), stale


def _image_range(found: MiImage, mappings: list[Mapping]) -> tuple[int, int]:
    """The addresses the object's mappings take."""
    mine = [m for m in mappings if m.path == found.path]
    return (min(m.start for m in mine), max(m.end for m in mine)) if mine else (0, 0)


def _overcommit(words: np.ndarray) -> bool | None:
    """Whether the system overcommits, as mimalloc's memory settings say (None: not found)."""
    config = _mem_config(words)
    return None if config is None else bool(config[1] & 0xFF)


def _mem_config(words: np.ndarray) -> tuple[int, int] | None:
    """mimalloc's memory settings (None: not found, or not one): the five words page size (4 KiB), large page
    size (0, 2 MiB or 1 GiB), granularity (4 KiB), physical memory, address bits (39 to 57), then bytes (whether
    the system overcommits, frees in part, reserves, from 3.3 has transparent huge pages): (the large page
    size, the word of those bytes)."""
    pages = np.flatnonzero(words[:-5] == np.uint64(4096))
    found = set()
    for i in pages.tolist():
        large, grain, bits = int(words[i + 1]), int(words[i + 2]), int(words[i + 4])
        if grain == 4096 and large in (0, 2 << 20, 1 << 30) and 39 <= bits <= 57 and int(words[i + 3]) > 0:
            found.add((large, int(words[i + 5]) & 0xFFFFFFFF))
    return found.pop() if len(found) == 1 else None


def purge_group(options: dict, config: tuple[int, int] | None, slice_size: int, rule: str) -> int:
    """How many slices a purge takes at least, in aligned groups (from 3.1.6, `_mi_os_minimal_purge_size`; RULE:
    the layout's `min_purge`): the option (KiB) when set; else, when the system has transparent huge pages and
    allow_thp is set ("thp"; "thp2": is 2, 3.6's default), a large page; else a system page (a slice).  Releases
    before purge every waiting run."""
    option = options.get("minimal_purge_size") or options.get("arena_purge_min_size")
    if not rule or option is None:
        return 1
    thp = options.get("allow_thp")
    wanted = thp is not None and (thp.value == 2 if rule == "thp2" else thp.value != 0)
    if option.value > 0:
        size = (option.value << 10) + 4095 & ~4095
    elif config is not None and config[1] >> 24 & 0xFF and wanted:
        size = config[0]
    else:
        size = 4096
    return max(1, -(-size // slice_size))
