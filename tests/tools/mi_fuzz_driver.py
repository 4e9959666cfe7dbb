"""Mutation fuzzing of heapwalk's mimalloc decoder inside gdb, on a real core (sourced by tests/tools/fuzz.py's gdb
runs, as tests/tools/tc_fuzz_driver.py is for tcmalloc).

gdb loads a core of a process on mimalloc; the script decodes it once through a memory that records every read
the decoder makes (discovery, the segments' headers and slices, the pages' blocks, the heaps), and keeps those
that lie in writable memory: the fields a damaged process or core can change.  Each mutant patches one word of
them (a byte, a whole word, a bit) or aims damage where it must be seen:
- list_loop: the second block of a page's free list linking back to the first: an error at the first;
- segment_hidden: a segment's header missing (mimalloc 3: a page's; a core that lacks its pages): an error at
  that segment (page);
- truncate: everything above a point inside one of the reads missing: refused in one line, or an error.
Then it runs what the commands run: discovery, decoding, check, the report, the heaps' table, the RSS claims,
the heap map's strips, the leak scan's blocks, 'chunk' at the first page, and the JSON.  A mutant fails when
anything raises (other than the one-line refusals), takes longer than the bound, shows an impossible figure
(tests/tools/figures.py), or, for aimed damage, is not seen.  Parameters and results as tests/tools/fuzz_driver.py's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gdb sets __file__ for a sourced script
from fuzz_driver import MutatedMemory  # noqa: E402
from je_fuzz_driver import RecordedSound, Recording, _word, drive, patched_read, shown  # noqa: E402

from heapwalk.common.errors import CannotDecode
from heapwalk.mimalloc.allocator import MimallocHeap
from heapwalk.mimalloc.families import decode_any
from heapwalk.mimalloc.check import check_mimalloc
from heapwalk.mimalloc.families import discover_mimalloc
from heapwalk.mimalloc.find import find_mimalloc
from heapwalk.mimalloc.verbs import locate

#: the aimed damage kinds, each drawn this share of the time (the rest are random patches of what was read)
DAMAGE = {"list_loop": 0.1, "segment_hidden": 0.1, "truncate": 0.08}


def exercise(mem, space, threads):
    """Everything the commands do on MEM: (the state or None when refused, the check's findings, the report's
    JSON, 'ok' or 'refused: <the one line>')."""
    try:                                 # (the allocator's load: its image's header too may be damaged)
        found = find_mimalloc(mem, space.mappings)
        if found is None:
            return None, None, None, "refused: mimalloc is not mapped"
        disc = discover_mimalloc(mem, found, space.regions, space.mappings, None)
    except CannotDecode as exc:
        return None, None, None, f"refused: {exc}"
    state = decode_any(mem, disc, threads, "fuzz")
    heap = MimallocHeap(state, mem, threads)
    findings = check_mimalloc(mem, state)
    heap.strips()
    heap.blocks()
    pages = state.pages()
    if pages:
        locate(heap, pages[0].start)
    return shown(heap, state, findings, tuple(heap.threads(False).parts))


class Sound(RecordedSound):
    """What the undamaged core holds: the reads the decoder made in writable memory, the segments, and the
    pages whose free list holds two blocks or more."""

    def __init__(self, base, space, threads):
        rec = Recording(base)
        found = find_mimalloc(rec, space.mappings)
        disc = discover_mimalloc(rec, found, space.regions, space.mappings, None)
        state = decode_any(rec, disc, threads, "fuzz")
        self.base, self.layout = base, disc.layout
        writable = [(s.address, s.address + s.memsz) for s in found.image.writable()] + [
            (m.start, m.end) for m in space.mappings if not (m.path and "/" in m.path)] + list(space.regions)
        self.reads = [(a, n) for a, n in rec.reads if any(lo <= a < hi for lo, hi in writable)]
        # mimalloc 3: a page's mi_page_t (at its start, or from 3.3 apart at its arena's start)
        v3 = getattr(disc.layout, "family", 2) == 3
        self.segments = [s.pages[0].address if v3 else s.address for s in state.live()]
        self.lists = [p.heads[0] for p in state.pages() if p.free >= 2]


def apply(spec: dict, sound: Sound):
    """(the memory of mutant SPEC, the address an error must name or 0 for any error, None for no demand),
    or None when this core has no place for it."""
    op, base = spec["op"], sound.base
    if op == "list_loop":
        if not sound.lists:
            return None
        head = sound.lists[int(spec["pick"] * len(sound.lists)) % len(sound.lists)]
        second = int.from_bytes(base.read(head, 8), "little")
        return MutatedMemory(base, _word(second, head)), head
    if op == "segment_hidden":
        if len(sound.segments) < 2:
            return None
        seg = sound.segments[int(spec["pick"] * len(sound.segments)) % len(sound.segments)]
        header = sound.layout.page if getattr(sound.layout, "family", 2) == 3 else sound.layout.segment_header
        return MutatedMemory(base, {}, (seg, seg + header)), seg
    return patched_read(spec, sound)


def main() -> None:
    drive(Sound, apply, exercise, DAMAGE)


if __name__ == "__main__":  # sourced by gdb
    main()
