"""mimalloc 3's state: its memory comes in pages of arenas' slices (or from the system), kept in a page map;
each question the shared modules ask of a `MiState` answered as mimalloc 3 would."""

from __future__ import annotations

from dataclasses import replace

from heapwalk.inferior.ranges import merged
from heapwalk.mimalloc.account import ARENAS, Owner
from heapwalk.mimalloc.decode import MiState, good_size

__all__ = ["MiState3"]


class MiState3(MiState):
    """mimalloc 3 decoded: its pages (as units), heaps, and what the walk found."""

    family = 3
    unit = "page"
    huge_label = " (from the system)"
    exited_row = "abandoned pages"
    abandoned_owner = "abandoned (its thread gave it up, or exited)"
    arenas_whole = True
    abandoned_keep_heap = False

    def map_bytes(self) -> int:
        """The page map's sub-maps, 64 KiB each from the system, and (from 3.2) its table with the first sub-map,
        as the system rounds them: what its statistics count of it."""
        pm = self.discovery.page_map
        return pm.subs * 65536 + (good_size(pm.size + 65536, self.os_page) if self.layout.map_counted else 0)

    def own_ranges(self) -> list[tuple[int, int]]:
        return self.discovery.page_map.ranges

    def committed(self) -> int:
        """Its committed statistic: its arenas' committed blocks, its pages from the system, its thread data and
        its page map."""
        arenas = sum(a.committed_blocks() * a.block_size for a in self.discovery.arenas)
        own = sum(s.committed for s in [*self.live(), *self.cached()] if s.arena is None)
        return arenas + own + self.thread_data_bytes() + self.map_bytes()

    def arena_split(self, arena) -> tuple[int, int, int]:
        """ARENA's bytes in its pages, in its free slices, and its own (description, bitmaps, meta
        pages); held to the arena's size when damage makes them more (free first, then its own)."""
        pages = sum(s.reserved for s in self.live() if s.arena is arena)
        free = max(min(arena.free_bytes(), arena.reserved - pages), 0)
        return pages, free, max(arena.reserved - pages - free, 0)

    def free_arena_blocks(self) -> list[tuple[int, int]]:
        return []

    def arena_free(self) -> int:
        """Bytes of the arenas' free slices; none of an arena whose pages' damaged sizes claim more than it holds."""
        return sum(self.arena_split(a)[1] for a in self.discovery.arenas)

    def collected_ranges(self) -> list[tuple[int, int]]:
        return _collected(self)

    def add_arenas_row(self, by: dict, free: int) -> bool:
        _add_arenas(self, by, free)
        return True

    def figures(self, collected: list[tuple[int, int]], own: dict[str, int]) -> dict[str, int]:
        live = self.live()
        purged = sum(b - a for a, b in collected)
        return {"reserved": self.reserved(), "committed": self.committed(), "pages": len(live),
                "pages_abandoned": len(self.abandoned()), "os_pages": sum(1 for s in live if s.arena is None),
                "arenas": len(self.discovery.arenas), "arena_free": self.arena_free(),
                "purge_pending": sum(b - a for x in self.discovery.arenas for a, b in x.purge_ranges()),
                "collect_purges": purged, "collect_decommits": purged if self.layout.purge_counted else 0, **own}

    def in_arena(self, address: int) -> dict | None:
        """What ADDRESS is in an arena outside its pages (a free slice, or the arena's own), or None."""
        for a in self.discovery.arenas:
            if a.start <= address < a.start + a.reserved:
                slot = a.block_of(address)
                free = bool(a.free >> slot & 1)
                return {"arena": a.id, "arena_start": a.start, "kind": "free slice" if free else "arena",
                        "use": f"a free slice (number {slot}) of arena {a.id} at {a.start:#x}" if free else
                        f"slice {slot} of arena {a.id} at {a.start:#x}, mimalloc's own (its description, bitmaps, "
                        "or heaps' and threads' data)"}
        return None


def _collected(state: MiState) -> list[tuple[int, int]]:
    """mimalloc 3: the pages of the main thread that hold no block (it frees them first: one of at least the
    immediate purge size is purged at once, any other waits for its purge like the free slices), then the
    arenas' free slices whose purge waits, in whole groups of its minimal purge size (`Mi3Arena.purged_ranges`)."""
    empty = [s for s in state.live() if s.arena is not None and state.main_thread
             and s.thread_id == state.main_thread and all(p.in_use == 0 and not p.damaged for p in s.pages)]
    option = state.discovery.options.get("arena_purge_immediate_size")
    immediate = option.value << 10 if option is not None and option.value > 0 else None
    out, freed = [], {}
    for s in empty:
        if immediate is not None and s.reserved >= immediate:
            out.append((s.address, s.address + s.reserved))
        else:
            first = s.arena.block_of(s.address)
            freed[s.arena.id] = freed.get(s.arena.id, 0) | ((1 << s.slices) - 1) << first
    for a in state.discovery.arenas:
        bits = freed.get(a.id, 0)
        a = replace(a, purge=a.purge | bits, free=a.free | bits, commit_map=a.commit_map | bits) if bits else a
        out += a.purged_ranges()
    return merged(out)


def _add_arenas(state: MiState, by: dict[int, Owner], free_slices: int) -> None:
    """mimalloc 3's arenas row: their free slices, what waits for its purge in them, their own slices (neither
    free nor a page's), and the page map's sub-maps."""
    arenas = state.discovery.arenas
    units = [s for s in state.live() if s.arena is not None]
    own = sum(state.arena_split(a)[2] for a in arenas)
    row = by.setdefault(ARENAS, Owner(ARENAS))
    row.reserved += free_slices + own + state.map_bytes()
    row.free["arena blocks"] += free_slices
    row.overhead += own + state.map_bytes()
    row.committed += max(sum(a.committed_blocks() * a.block_size for a in arenas) - sum(s.committed for s in units),
                         0) + state.map_bytes()
    row.pending += sum(b - a for x in arenas for a, b in x.purge_ranges())
